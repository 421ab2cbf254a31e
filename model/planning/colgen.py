"""Column generation: grow the restricted LP with the boxes its prices say are missing.

Each round solves the LP relaxation (limits softened by priced slacks, so it is
always feasible and its duals always exist), prices every box of the full grid with
those duals (``model.formulation.pricing``) -- which also evaluates the Lagrangian bound -- and
adds the most negative boxes.  It stops when nothing prices out, the LP stalls, or
its deadline passes (checked between pricing chunks too).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace

import numpy as np

from model.base.runtime import Deadline, DeadlineExceeded, interrupted
from model.formulation.arrays import Restriction
from model.formulation.boxes import (
    BucketModel,
    Grid,
    box_unit_cost,
    bucket_model,
    candidate_grid,
)
from model.formulation.pricing import (
    Bound,
    Duals,
    bucket_constant,
    duals_from_lp,
    lagrangian_bound,
    shape_cap_dual,
)
from model.histogram.cells import Histogram
from model.planning.search import Space, grow
from solvers.backends import Backend
from solvers.backends.milp import MipArrays
from solvers.backends.result import BackendResult, SolveOptions, Status

log = logging.getLogger("shapeplan")


@dataclass(frozen=True, eq=False)
class ColumnGeneration:
    """Where column generation ended: the grown restriction, the last LP and the best bound seen."""

    res: list[Restriction]  # grown restriction (after the last pricing)
    lp_res: list[Restriction]  # restriction of the last solved LP
    lp_model: MipArrays
    lp: BackendResult
    duals: list[Duals]
    kappa: float
    bound: Bound  # best Lagrangian bound over the space's grids
    converged: bool  # no box priced out: the LP is the full LP relaxation's optimum
    slack: float  # limit violation left in the last LP (scaled units; > 0 with convergence = infeasible)
    rounds: int = 0  # rounds whose pricing completed (the bound is the best of these, or the floor)
    cut: bool = False  # the deadline cut a round's pricing short (that round was dropped)
    pricing_s: float = 0.0  # the longest a pricing pass took (one the deadline cut: how long it ran)


def own_box_duals(bm: BucketModel, grid: Grid) -> Duals:
    """Multipliers pricing each cell at its cheapest box (its own tight one), limits at zero.

    At these prices no box has a negative value, so the Lagrangian is "every request
    in its own smallest box, no overheads": weak but always valid.
    """
    t_own = bm.hist.S if not bm.cost.pads_to_shape else grid.ts[np.searchsorted(grid.ts, bm.hist.S)]
    return Duals(box_unit_cost(bm, t_own, bm.hist.G))


def floor_bound(space: Space) -> Bound:
    """The Lagrangian at own-box prices: the bound column generation starts from.

    At these prices every box's value is >= 0 (a box costs each member at least its
    own box's unit cost, and its overhead and latency terms are >= 0), so every h_k is
    0 and, in strict mode, no shape opens: the Lagrangian is the bucket constants
    alone.  Computed so, it costs no pricing pass (which on a big grid is minutes).
    """
    per = tuple(bucket_constant(bm, own_box_duals(bm, g), 0.0) for bm, g in zip(space.bms, space.grids, strict=True))
    prices = tuple(np.zeros(len(g)) for g in space.grids)
    return Bound(sum(per), per if space.shapes is None else None, prices)


class NoDuals(Exception):
    """The first LP relaxation gave no duals (a time limit, a solver failure): nothing to generate from."""

    def __init__(self, result: BackendResult):
        self.result = result
        super().__init__(f"the first LP relaxation gave no duals ({result.backend}: {result.status.text})")


def generate(space: Space, res: list[Restriction], lp_solver: Backend, deadline: Deadline) -> ColumnGeneration:
    """Run column generation from ``res`` until converged, stalled, or ``deadline``.

    The LPs run on ``lp_solver`` (it must have Feature.LP_DUALS).  A round whose
    pricing the deadline cuts is dropped: its partial Lagrangian is no bound, so the
    last complete one (or the own-box floor) stands.  Raises NoDuals if the first LP
    gives no duals.
    """
    t0 = time.perf_counter()
    p = space.problem
    best = floor_bound(space)
    history: list[float] = []
    last = None
    pricing_s = 0.0
    opts = space.options
    for rnd in range(opts.max_rounds):
        model = space.model(res, relax_limits=True)
        lp = lp_solver.solve(model, SolveOptions(time_limit=max(opts.min_call_s, deadline.left()), relax=True))
        if lp.status is Status.INTERRUPTED:
            raise interrupted()
        if lp.status is not Status.OPTIMAL or lp.row_duals is None or lp.x is None:
            log.info("LP of round %d returned no duals (%s: %s)%s", rnd, lp_solver.name, lp.status.text,
                     f"; keeping round {rnd - 1}" if last is not None else "")
            if last is None:
                raise NoDuals(lp)
            return replace(last, converged=False)
        duals = [duals_from_lp(model, lp.row_duals, b, len(bm.hist)) for b, bm in enumerate(space.bms)]
        kappa = shape_cap_dual(model, lp.row_duals)
        slack = sum(float(lp.x[blk.slice()].sum()) for blk in model.col_blocks if blk.name.startswith("slack_"))
        t_price = time.perf_counter()
        try:
            bound = lagrangian_bound(space.bms, space.grids, duals, p.max_batch_size, space.shapes, kappa,
                                     p.max_shapes, check=lambda: deadline.tick("column generation pricing"))
        except DeadlineExceeded:
            log.info("column generation round %d: the time limit cut its pricing short; the bound stays at %s",
                     rnd, f"round {rnd - 1}'s" if last is not None else "the own-box floor")
            spent = max(pricing_s, time.perf_counter() - t_price)
            if last is not None:
                return replace(last, converged=False, cut=True, pricing_s=spent)
            return ColumnGeneration(res, res, model, lp, duals, kappa, best, False, slack, rounds=0, cut=True,
                                    pricing_s=spent)
        pricing_s = max(pricing_s, time.perf_counter() - t_price)
        best = bound if bound.total > best.total else best
        log.info("column generation round %d: LP %.6e, Lagrangian bound %.6e, %d boxes, %d arcs (%.1f s)",
                 rnd, lp.objective, bound.total, sum(len(r.boxes) for r in res), sum(len(r.arc_cell) for r in res),
                 time.perf_counter() - t0)
        new_res, added = [], 0
        for bm, grid, r, d, h in zip(space.bms, space.grids, res, duals, bound.prices, strict=True):
            h = h.copy()
            h[r.boxes] = 0.0
            cand = np.flatnonzero(h < -1e-9 * max(1.0, abs(lp.objective)))
            cand = cand[np.argsort(h[cand], kind="stable")][:opts.columns_per_round]
            added += len(cand)
            new_res.append(grow(bm, grid, r, d, cand, opts.arcs_per_box))
        last = ColumnGeneration(new_res, res, model, lp, duals, kappa, best, added == 0, slack, rounds=rnd + 1,
                                pricing_s=pricing_s)
        res = new_res
        history.append(lp.objective)
        stalled = len(history) >= 3 and history[-3] - history[-1] < 1e-6 * abs(lp.objective)
        tight = lp.objective - bound.total < 1e-4 * max(abs(lp.objective), 1.0)
        if added == 0 or tight or stalled or deadline.expired():
            return replace(last, converged=added == 0 or tight)
    return last


def exact_bound(space: Space, fine: list[Histogram], cg: ColumnGeneration, compile_fixed: list[float],
                deadline: Deadline = Deadline.never()) -> tuple[Bound, bool]:
    """The Lagrangian on the EXACT histograms, each fine cell priced at its coarse cell's dual.

    A coarsened model over-states costs, so its own bound could exceed the true
    optimum; evaluating the Lagrangian on the exact cells keeps the certificate valid.
    The own-box floor on the exact cells is taken too, and the larger of the two kept.
    Returns (bound, complete): if the deadline cuts the pricing, the floor alone -- and the pricing is not
    started when less time is left than column generation's took (one pass over the grid is indivisible
    and ran 1 s past a 3 s limit on 10^5 long-context requests).
    """
    p = space.problem
    fbms, fgrids, fduals = [], [], []
    for b, (hf, bm_c, d, f) in enumerate(zip(fine, space.bms, cg.duals, compile_fixed, strict=True)):
        bm = bucket_model(hf, hf.gen_min, p.limits[b], p.cost)
        fbms.append(replace(bm, const_cost=bm.const_cost + f))
        fgrids.append(candidate_grid(fbms[-1], space.shapes))
        coarse_of_fine = bm_c.hist.of_fine if bm_c.hist.of_fine is not None else np.arange(len(hf))
        fduals.append(replace(d, pi=d.pi[coarse_of_fine]))
    fine_space = Space(p, fbms, fgrids, space.shapes, space.fixed_shapes, space.options)
    floor = floor_bound(fine_space)
    if deadline.left() < cg.pricing_s:
        return floor, False
    try:
        bound = lagrangian_bound(fbms, fgrids, fduals, p.max_batch_size, space.shapes, cg.kappa, p.max_shapes,
                                 check=lambda: deadline.tick("exact-histogram bound"))
    except DeadlineExceeded:
        return floor, False
    return max((bound, floor), key=lambda bd: bd.total), True
