"""Column generation: grow the restricted LP with the boxes its prices say are missing.

Each round solves the LP relaxation (limits softened by priced slacks, so it is
always feasible and its duals always exist), prices every box of the full grid with
those duals (``model.pricing``) -- which also evaluates the Lagrangian bound -- and
adds the most negative boxes.  It stops when nothing prices out, the LP stalls, or
its time share is spent.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace

import numpy as np

from model.errors import InfeasibleError
from model.formulation.arrays import MipArrays, Restriction
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
    duals_from_lp,
    lagrangian_bound,
    shape_cap_dual,
)
from model.histogram.cells import Histogram, gen_min_of
from model.planning.search import Space, grow
from solvers.backends import get_backend
from solvers.backends.result import BackendResult, SolveOptions

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


def own_box_duals(bm: BucketModel, grid: Grid) -> Duals:
    """Multipliers pricing each cell at its cheapest box (its own tight one), limits at zero.

    At these prices no box has a negative value, so the Lagrangian is "every request
    in its own smallest box, no overheads": weak but always valid.
    """
    t_own = bm.hist.S if bm.mode == "reference" else grid.ts[np.searchsorted(grid.ts, bm.hist.S)]
    return Duals(box_unit_cost(bm, t_own, bm.hist.G))


def floor_bound(space: Space) -> Bound:
    """The Lagrangian at own-box prices: the bound column generation starts from."""
    p = space.problem
    duals = [own_box_duals(bm, g) for bm, g in zip(space.bms, space.grids, strict=True)]
    return lagrangian_bound(space.bms, space.grids, duals,
                            p.max_batch_size, space.shapes, 0.0, p.max_shapes)


def generate(space: Space, res: list[Restriction], deadline: float, budget: float) -> ColumnGeneration:
    """Run column generation from ``res`` until converged, stalled, or ``budget`` seconds are spent."""
    t0 = time.perf_counter()
    lp_solver = get_backend("highs")  # duals come from HiGHS whatever backend solves the MIP
    p = space.problem
    best = floor_bound(space)
    history: list[float] = []
    last = None
    opts = space.options
    for rnd in range(opts.max_rounds):
        model = space.model(res, relax_limits=True)
        lp = lp_solver.solve(model, SolveOptions(time_limit=max(opts.min_call_s, deadline - time.perf_counter()),
                                                 relax=True))
        if lp.row_duals is None or lp.x is None:
            if last is None:
                raise InfeasibleError(f"the LP relaxation failed (status {lp.status})")
            log.info("LP of round %d returned no duals (%s); keeping round %d", rnd, lp.status, rnd - 1)
            return replace(last, converged=False)
        duals = [duals_from_lp(model, lp.row_duals, b, len(bm.hist)) for b, bm in enumerate(space.bms)]
        kappa = shape_cap_dual(model, lp.row_duals)
        bound = lagrangian_bound(space.bms, space.grids, duals, p.max_batch_size, space.shapes, kappa, p.max_shapes)
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
        slack = sum(float(lp.x[blk.slice()].sum()) for blk in model.col_blocks if blk.name.startswith("slack_"))
        last = ColumnGeneration(new_res, res, model, lp, duals, kappa, best, added == 0, slack)
        res = new_res
        history.append(lp.objective)
        stalled = len(history) >= 3 and history[-3] - history[-1] < 1e-6 * abs(lp.objective)
        tight = lp.objective - bound.total < 1e-4 * max(abs(lp.objective), 1.0)
        if added == 0 or tight or stalled or time.perf_counter() - t0 > budget or time.perf_counter() > deadline:
            return replace(last, converged=added == 0 or tight)
    return last


def exact_bound(space: Space, fine: list[Histogram], cg: ColumnGeneration, compile_fixed: list[float]) -> Bound:
    """The Lagrangian on the EXACT histograms, each fine cell priced at its coarse cell's dual.

    A coarsened model over-states costs, so its own bound could exceed the true
    optimum; evaluating the Lagrangian on the exact cells keeps the certificate valid.
    The own-box floor on the exact cells is taken too, and the larger of the two kept.
    """
    p = space.problem
    fbms, fgrids, fduals = [], [], []
    for b, (hf, bm_c, d, f) in enumerate(zip(fine, space.bms, cg.duals, compile_fixed, strict=True)):
        bucket = p.buckets[b]
        bm = bucket_model(hf, gen_min_of(bucket.gen_len, hf), p.limits[b], p.params, p.mode)
        fbms.append(replace(bm, const_cost=bm.const_cost + f))
        fgrids.append(candidate_grid(fbms[-1], space.shapes))
        coarse_of_fine = np.zeros(len(hf), np.int64)
        coarse_of_fine[hf.cell_of] = bm_c.hist.cell_of
        fduals.append(replace(d, pi=d.pi[coarse_of_fine]))
    fine_space = Space(p, fbms, fgrids, space.shapes, space.fixed_shapes, space.options)
    bound = lagrangian_bound(fbms, fgrids, fduals, p.max_batch_size, space.shapes, cg.kappa, p.max_shapes)
    floor = floor_bound(fine_space)
    return max((bound, floor), key=lambda bd: bd.total)
