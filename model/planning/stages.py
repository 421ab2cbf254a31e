"""The planner's steps for one problem: settle the shapes, then column generation and the MIP search.

``model.planning.mip`` runs these (and repairs, and judges the result);
``model.planning.diagnose`` probes pairs of limits with the same ``search``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import numpy as np

from model.base.errors import InfeasibleError
from model.base.runtime import Deadline, DeadlineExceeded
from model.domain.schema import Batching, CellRuns, Problem, Status
from model.domain.shapeset import round_up_to, usable
from model.formulation.boxes import BucketModel, Grid, bucket_model, candidate_grid
from model.histogram.cells import Histogram, coarsen
from model.packers import PACKERS
from model.packers.greedy import pack as greedy_pack
from model.planning.beside import Beside
from model.planning.cell_runs import batching_of_runs, box_runs, deal
from model.planning.colgen import NoDuals, exact_bound, floor_bound, generate
from model.planning.options import PlannerOptions
from model.planning.reshape import reference_shape_set
from model.planning.search import (
    Assignment,
    Space,
    assignment_from_batching,
    cover_arcs,
    full_restriction,
    full_size,
    merge,
    prune,
    seed_restriction,
    solve_restricted,
    support,
)
from model.planning.shapes import choose_shapes
from solvers.backends import Backend, get_backend
from solvers.backends.result import Feature

log = logging.getLogger("shapeplan")


@dataclass(frozen=True, eq=False)
class ShapeSetup:
    """What the shape choice settles before the search, and the bound it certifies (strict mode)."""

    shapes: np.ndarray | None  # strict: the shapes the search may use; reference: None
    ref_shape: list[int] | None  # reference: the one shape each bucket compiles
    compile_fixed: list[float]  # compile cost settled outside the model, per bucket
    bound: float  # certified bound from the shape relaxation (-inf in reference mode)
    covers_all: bool  # the search space is the whole problem, so its Lagrangian certifies too
    notes: tuple[str, ...]
    chosen: np.ndarray | None = None  # strict: the relaxation's K shapes (a start that meets the cap)


@dataclass(frozen=True, eq=False)
class SearchOutcome:
    """One search: its plan (or None), the model's objective and the certified bound.

    ``status`` is the last MIP's; ``exact`` says the search's last MIP held the whole
    problem (every box, exact cells, no held-back P95 members, exact spike placement), so its INFEASIBLE is
    a proof for the problem, not only for the boxes the search kept.
    """

    batchings: tuple[Batching, ...] | None
    objective: float | None
    bound: float
    bucket_bounds: tuple[float, ...] | None
    status: Status
    backend: str
    version: str
    notes: tuple[str, ...]
    exact: bool = False
    native: str = ""  # the last MIP's status in the solver's own words
    runs: tuple[CellRuns, ...] | None = None  # the plan by cells (None with no plan); ``batchings`` needs requests
    bound_by: str = ""  # the method whose bound is ``bound``
    stalled: bool = False  # the last MIP ended by finding nothing better for a while (time given back)
    beside: Beside | None = None  # the search over shape sets still running beside the planner (``beside``)
    bound_open: bool = False  # the planner's own search over shape sets left a bucket unfinished, none beside

    @property
    def proven_infeasible(self) -> bool:
        return self.batchings is None and self.exact and self.status is Status.INFEASIBLE


def bucket_models(problem: Problem, hists: list[Histogram], reserves: tuple[int, ...] | None = None
                  ) -> list[BucketModel]:
    """Bucket constants for each histogram under the problem's limits and cost model."""
    reserves = reserves or (0,) * len(hists)
    return [bucket_model(h, h.gen_min, lim, problem.cost, r, problem.max_batch_size)
            for h, lim, r in zip(hists, problem.limits, reserves, strict=True)]


def reference_shapes(bms: list[BucketModel], max_shapes: int, allowed: np.ndarray | None = None) -> list[int]:
    """Reference mode: the declared shape only sets compile cost, so each bucket compiles ONE shape.

    Any plan must give bucket b a shape >= its largest aligned prompt; extra shapes only
    add compile cost and spikes.  With K shapes across buckets, the exact DP of
    ``model.planning.reshape.reference_shape_set`` picks them (with a fixed set of
    ``allowed`` shapes, over each bucket's smallest allowed shape covering its maximum,
    so the compile cost stays a valid part of the bound for the restricted problem).
    """
    return reference_shape_set([int(bm.hist.S.max()) for bm in bms], bms[0].cost, max_shapes, allowed)


def shape_setup(problem: Problem, fine: list[Histogram], options: PlannerOptions = PlannerOptions(),
                deadline: Deadline = Deadline.never()) -> ShapeSetup:
    """Settle the shapes the search works with (see module docstring, step 2).

    If the deadline cuts the strict-mode shape relaxation short, the search gets the
    one shape that covers every prompt, and no bound from the relaxation.
    """
    bms = bucket_models(problem, fine)
    allowed = usable(problem)
    if allowed is not None and (not len(allowed) or max(int(h.S.max()) for h in fine) > allowed[-1]):
        raise InfeasibleError(f"the longest aligned prompt {max(int(h.S.max()) for h in fine)} is longer than every "
                              f"allowed shape ({', '.join(map(str, problem.allowed_shapes))})")
    if not problem.cost.pads_to_shape:
        ref = reference_shapes(bms, problem.max_shapes, allowed)
        note = (f"reference mode: one compiled shape per bucket ({', '.join(map(str, ref))}); the declared "
                "shape moves only compile cost, so more shapes never pay")
        return ShapeSetup(None, ref, [float(problem.cost.shape_charge(s)) for s in ref], -np.inf, True, (note,))
    all_shapes = np.unique(np.concatenate([h.S for h in fine]))
    if problem.max_seq_len is not None:
        all_shapes = all_shapes[all_shapes <= problem.max_seq_len]
    if allowed is not None:
        # a batch's shape can always be lowered to the smallest allowed shape covering its longest member,
        # which never raises a metric: those are the only candidates, so the relaxation's DP over them
        # and the Lagrangian over their boxes bound the restricted problem
        all_shapes = np.unique(round_up_to(all_shapes, allowed))
    try:
        choice = choose_shapes(bms, all_shapes, problem.max_shapes, deadline)
    except DeadlineExceeded:
        top = all_shapes[-1:]
        note = (f"{problem.cost.name} mode: the time limit cut the shape relaxation short; searching the one shape "
                f"{int(top[0])} that covers every prompt, with no bound from the relaxation")
        log.info(note)
        return ShapeSetup(top, None, [0.0] * len(fine), -np.inf, len(all_shapes) == 1, (note,))
    log.info("%s mode: shape relaxation bound %.6e at shapes %s", problem.cost.name, choice.bound, list(choice.shapes))
    # few candidates: search them all (exact); many: at the relaxation's shapes, since a large
    # shape layer left fractional by the LP stalls column generation
    shapes = all_shapes if len(all_shapes) <= options.all_shapes_max else np.asarray(choice.shapes, dtype=np.int64)
    note = ("strict mode: shapes chosen by the shape relaxation; the bound is that relaxation (every request at "
            "its own gen_len under the best K shapes) or the Lagrangian, whichever is higher")
    return ShapeSetup(shapes, None, [0.0] * len(fine), choice.bound, len(shapes) == len(all_shapes), (note,),
                      np.asarray(choice.shapes, dtype=np.int64))


def gen_budget(hist: Histogram, n_t: int, options: PlannerOptions) -> int:
    """How many gen values a bucket may keep so that its box grid (shapes x gens) stays within the pricing
    budget (pricing sweeps each cell over the boxes it reaches, so the cells do not count)."""
    return int(np.clip(options.pricing_budget / max(n_t, 1), 48, options.max_gen_values))


def greedy_plan(problem: Problem, options: PlannerOptions = PlannerOptions(),
                deadline: Deadline = Deadline.never()) -> tuple[Batching, ...] | None:
    """The greedy packer's plan (dpfill's in device mode): a warm start and a fallback, or None if it finds
    none in time.

    Skipped above ``options.greedy_max_requests``: its merges work per request, not per
    cell, and would spend the whole time limit before the optimiser starts.
    """
    if sum(len(b) for b in problem.buckets) > options.greedy_max_requests:
        return None
    try:
        return PACKERS["dpfill"](problem) if problem.cost.shared_batch_time else greedy_pack(problem, deadline)
    except InfeasibleError:
        return None
    except DeadlineExceeded:
        log.info("greedy warm start: cut by its share of the time limit; the search starts without it")
        return None


def search(problem: Problem, fine: list[Histogram], setup: ShapeSetup, greedy, solver: Backend, deadline: Deadline,
           reserves: tuple[int, ...] | None = None, options: PlannerOptions = PlannerOptions()) -> SearchOutcome:
    """Column generation then MIP over one problem (steps 3-4); never raises for infeasibility.

    Column generation's LPs run on ``solver`` if it has LP duals, else on HiGHS (a
    note says which).  Every phase stops by ``deadline``; a bound the deadline cut
    short falls back to the last complete one (a note says so).
    """
    n_t = len(setup.shapes) if setup.shapes is not None else len(np.unique(np.concatenate([h.S for h in fine])))
    budgets = [gen_budget(h, n_t, options) for h in fine]
    hists = [coarsen(h, k) if k < len(np.unique(h.G)) else h for h, k in zip(fine, budgets, strict=True)]
    coarsened = any(h.coarsened for h in hists)
    bms = [replace(bm, const_cost=bm.const_cost + f) for bm, f in zip(bucket_models(problem, hists, reserves),
                                                                      setup.compile_fixed, strict=True)]
    grids = [candidate_grid(bm, setup.shapes) for bm in bms]
    space = Space(problem, bms, grids, setup.shapes, [1] * len(bms), options)
    warm = None
    if greedy is not None:
        warm = [assignment_from_batching(bm, g, bt) for bm, g, bt in zip(bms, grids, greedy, strict=True)]
        warm = None if any(w is None for w in warm) else warm
    empty = np.zeros(0, np.int64)
    whole = sum(full_size(bm, g, options.full_arcs) for bm, g in zip(bms, grids, strict=True)) <= options.full_arcs
    if whole:
        res = [full_restriction(bm, g) for bm, g in zip(bms, grids, strict=True)]
    else:
        # no warm start under a shape choice: every cell also at the relaxation's K shapes (``cover_arcs``), so
        # the first LP is feasible
        seeds = [(w.arc_cell, w.arc_box) if w else cover_arcs(bm, g, setup.chosen) if setup.shapes is not None
                 else (empty, empty)
                 for bm, g, w in zip(bms, grids, warm or [None] * len(bms), strict=True)]
        res = [seed_restriction(bm, g, c, x) for bm, g, (c, x) in zip(bms, grids, seeds, strict=True)]
    # the MIP over every box of exact cells, nothing held back, spikes placed exactly, is the problem itself
    exact = (whole and setup.covers_all and not coarsened and not any(reserves or ())
             and space.spike_per_arc(res))
    lp_solver = solver if Feature.LP_DUALS in solver.features else get_backend("highs")
    notes = list(setup.notes)
    notes.append(f"column generation's LPs ran on {lp_solver.name}"
                 + ("" if lp_solver is solver else f" ({solver.name} has no LP duals)"))
    try:
        cg = generate(space, res, lp_solver, deadline.share(options.colgen_share))
    except NoDuals as exc:
        notes.append(f"{exc}: no search")
        bound, per = setup.bound, None
        if setup.covers_all and not coarsened:
            # the own-box floor needs no LP: a first LP cut short by a loaded host still leaves a bound
            floor = floor_bound(space)
            if floor.total > bound:
                bound, per = floor.total, floor.per_bucket
                notes.append("the bound is the own-box floor (still valid)")
        by = "own-box floor" if per is not None else "shape relaxation" if np.isfinite(bound) else ""
        return SearchOutcome(None, None, bound, per, exc.result.status, lp_solver.name, lp_solver.version(),
                             tuple(notes), native=f"its first LP relaxation gave no duals ({exc.result.native})",
                             bound_by=by)
    if cg.cut:
        notes.append(f"the time limit cut column generation's pricing short: its bound is from "
                     f"{f'{cg.rounds} complete round(s)' if cg.rounds else 'the own-box floor'} (still valid)")
    # the exact-histogram bound runs after the MIP, with a share of the time kept for it
    later = setup.covers_all and coarsened
    mip_deadline = deadline.share(1.0 - options.exact_bound_share) if later else deadline
    sup = [support(bm, g, r, cg.lp_model, cg.lp.x, b)
           for b, (bm, g, r) in enumerate(zip(bms, grids, cg.lp_res, strict=True))]
    first = solve_restricted(space, solver, sup, warm, mip_deadline.share(options.support_share))
    best = first if first.assignment is not None else None
    last = first
    close = best is not None and best.objective - cg.bound.total <= options.target_gap * best.objective
    grown = None
    # a plan already on the bound (to rounding) needs no second search
    proven = best is not None and best.objective - cg.bound.total <= 1e-6 * abs(best.objective)
    if not mip_deadline.expired() and not proven:
        grown = cg.res
        if best is not None and not problem.cost.pads_to_shape:
            gap = best.objective - cg.bound.total
            per_box = max(1, options.max_polish_arcs // max(1, sum(len(r.boxes) for r in cg.res)))

            def check() -> None:
                mip_deadline.tick("reduced-cost fixing")

            try:
                if mip_deadline.left() < cg.pricing_s:  # one pass over the grid, as a pricing: it would overrun
                    raise DeadlineExceeded("reduced-cost fixing")
                grown = [merge(bm, g, prune(bm, g, r, d, gap, per_box, check), inc)
                         for bm, g, r, d, inc in zip(bms, grids, cg.res, cg.duals, best.res, strict=True)]
            except DeadlineExceeded:
                grown = None
                notes.append("the time limit cut reduced-cost fixing short: the MIP searched only the LP's support")
    if grown is not None:
        # already within the target gap: a short polish (small models finish it, large ones stop early)
        until = mip_deadline.within(max(options.polish_s, options.polish_share * mip_deadline.left())) \
            if close else mip_deadline
        last = solve_restricted(space, solver, grown, best.assignment if best else warm, until)
        if last.assignment is not None and (best is None or last.objective < best.objective):
            best = last
    else:
        exact = False  # the whole model was not searched
    bound, bucket_bounds = setup.bound, None
    by = "shape relaxation" if np.isfinite(bound) else ""
    if setup.covers_all:
        lag, complete = cg.bound, True
        if later:
            lag, complete = exact_bound(space, fine, cg, setup.compile_fixed, deadline)
            notes.append("gen values were coarsened for the search; the bound is certified on the exact histogram"
                         if complete else "gen values were coarsened for the search and the time limit cut the "
                         "exact-histogram bound short: the bound is the own-box floor on the exact histogram")
        if lag.total > bound:
            bound, bucket_bounds = lag.total, lag.per_bucket
            by = "column generation's Lagrangian" if cg.rounds and complete else "own-box floor"
    if best is None:
        return SearchOutcome(None, None, bound, bucket_bounds, last.result.status, solver.name, solver.version(),
                             tuple(notes), exact, last.result.native, bound_by=by)
    runs = tuple(runs_of(problem, b, h, bm, g, a, setup) for b, (h, bm, g, a)
                 in enumerate(zip(fine, bms, grids, best.assignment, strict=True)))
    batchings = tuple(batching_of_runs(h.cell_of, r) for h, r in zip(fine, runs, strict=True)) \
        if all(h.cell_of is not None for h in fine) else None
    return SearchOutcome(batchings, best.objective, bound, bucket_bounds, best.result.status,
                         best.result.backend, best.result.version, tuple(notes), exact, runs=runs, bound_by=by)


def runs_of(problem: Problem, b: int, fine: Histogram, bm: BucketModel, grid: Grid, a: Assignment,
            setup: ShapeSetup) -> CellRuns:
    """One bucket's solution as batches of cells (``model.planning.cell_runs``): the exact cells dealt to the boxes,
    each box cut into its batches -- one per box, split under a batch-size cap, or in device mode the box's
    m_k batches of near-equal size, which keeps each inside the size class lo_k..hi_k the model chose."""
    cell, box, count = deal(fine, bm.hist, a.arc_cell, a.arc_box, a.count)
    declared = np.full(len(box), setup.ref_shape[b]) if setup.ref_shape is not None else grid.box(box)[0]
    batches = None
    if problem.cost.shared_batch_time:
        per_box = np.zeros(len(grid), dtype=np.int64)
        per_box[a.box] = a.batches
        batches = per_box[box]
    return box_runs(fine, cell, box, count, declared, problem.cost, problem.max_batch_size, batches)
