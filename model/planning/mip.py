"""The MIP planner: histograms -> shapes -> column generation -> MIP -> batches, with a certified bound.

Flow (data one way):
  1. aggregate each bucket into (S, G) cells;
  2. settle the shapes: in reference mode they only move compile cost (one per bucket,
     exact DP); in strict mode an exact DP over a shape relaxation picks them and
     certifies a bound (``model.shapes``);
  3. column generation over the box grid (``model.colgen``): LP duals price every box,
     giving the boxes worth holding and a Lagrangian bound for the whole problem;
  4. MIP: first over the LP's support (seconds), then -- while the gap exceeds
     TARGET_GAP -- over every generated box that reduced costs cannot rule out,
     warm-started from the incumbent (``model.search``);
  5. expansion and exact re-evaluation with the one cost model: the cheaper of the MIP
     plan and the greedy packer's plan that meets every limit is returned; if the MIP
     plan breaks a limit the model thought it met (a compile spike it could not place
     harmlessly), the limit is tightened by the excess and the search repeated.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace

import numpy as np

from model.cost.analytic import compile_cost, member_latency
from model.cost.metrics import plan_metrics
from model.errors import InfeasibleError
from model.evaluation.validate import limit_checks, plan_rows
from model.expand.assemble import assemble, box_of_requests
from model.formulation.boxes import BucketModel, bucket_model, candidate_grid
from model.histogram.cells import Histogram, build_histogram, gen_min_of
from model.planning.colgen import exact_bound, generate
from model.planning.diagnose import explain_infeasible
from model.planning.search import (
    FULL_ARCS,
    Space,
    assignment_from_batching,
    full_restriction,
    full_size,
    merge,
    prune,
    seed_restriction,
    solve_restricted,
    support,
)
from model.planning.shapes import choose_shapes
from model.schema import Batching, Planned, Problem, SolveReport
from solvers.backends import get_backend
from solvers.packers.grouping import group_batching

log = logging.getLogger("shapeplan")

MAX_GEN_VALUES = 1024  # gen values per bucket before the histogram is coarsened
PRICING_BUDGET = 2.5e7  # (box t values) x (gen values) x (cells) per pricing pass before coarsening
TARGET_GAP = 1e-3  # once the incumbent is this close to the bound, only polish it
POLISH_S = 3.0  # seconds the full MIP gets to polish an incumbent already within TARGET_GAP
MAX_REPAIRS = 2
GREEDY_MAX_REQUESTS = 1_000_000  # above this the greedy warm start is skipped
ALL_SHAPES_MAX = 24  # strict mode searches every candidate shape up to this many


@dataclass(frozen=True, eq=False)
class ShapeSetup:
    """What the shape choice settles before the search, and the bound it certifies (strict mode)."""

    shapes: np.ndarray | None  # strict: the shapes the search may use; reference: None
    ref_shape: list[int] | None  # reference: the one shape each bucket compiles
    compile_fixed: list[float]  # compile cost settled outside the model, per bucket
    bound: float  # certified bound from the shape relaxation (-inf in reference mode)
    covers_all: bool  # the search space is the whole problem, so its Lagrangian certifies too
    notes: tuple[str, ...]


@dataclass(frozen=True, eq=False)
class Outcome:
    """One search: its plan (or None), the model's objective and the certified bound."""

    batchings: tuple[Batching, ...] | None
    objective: float | None
    bound: float
    bucket_bounds: tuple[float, ...] | None
    status: str
    backend: str
    version: str
    notes: tuple[str, ...]


def bucket_models(problem: Problem, hists: list[Histogram], reserves: tuple[int, ...] | None = None
                  ) -> list[BucketModel]:
    """Bucket constants for each histogram under the problem's limits and cost model."""
    reserves = reserves or (0,) * len(hists)
    return [bucket_model(h, gen_min_of(b.gen_len, h), lim, problem.params, problem.mode, r)
            for h, b, lim, r in zip(hists, problem.buckets, problem.limits, reserves)]


def spike_reserves(problem: Problem, fine: list[Histogram]) -> tuple[int, ...]:
    """One P95 member per bucket held back when even its fastest request cannot absorb a spike.

    If every member's own latency plus the 1500 ms compile spike exceeds the limit, the
    spike surely pushes one member over (unless it lands on one already over).
    """
    out = []
    for h, lim in zip(fine, problem.limits):
        limit = lim.max_p95_latency_ms
        fastest = float(member_latency(h.S, h.S, h.G, problem.params).min())
        out.append(int(limit is not None and fastest + problem.params.Tshape_compile_ms > limit))
    return tuple(out)


def reference_shapes(bms: list[BucketModel], max_shapes: int) -> list[int]:
    """Reference mode: the declared shape only sets compile cost, so each bucket compiles ONE shape.

    Any plan must give bucket b a shape >= its largest aligned prompt; extra shapes only
    add compile cost and spikes.  With K shapes across buckets, pick K of the bucket
    maxima minimising total compile cost (each bucket uses the smallest pick above its
    maximum) -- exact by dynamic programming over the sorted maxima.
    """
    need = [int(bm.hist.S.max()) for bm in bms]
    values = sorted(set(need))
    cost = [float(compile_cost(v, bms[0].params)) for v in values]
    count = [need.count(v) for v in values]
    inf = float("inf")
    best = [[inf] * (max_shapes + 1) for _ in values]  # best[j][k]: values[j] picked, k picks so far
    back = [[-1] * (max_shapes + 1) for _ in values]
    for j in range(len(values)):
        best[j][1] = sum(count[:j + 1]) * cost[j]
        for k in range(2, max_shapes + 1):
            for i in range(j):
                val = best[i][k - 1] + sum(count[i + 1:j + 1]) * cost[j]
                if val < best[j][k]:
                    best[j][k], back[j][k] = val, i
    j = len(values) - 1
    k = min(range(1, max_shapes + 1), key=lambda kk: best[j][kk])
    picks = []
    while j >= 0 and k >= 1:
        picks.append(values[j])
        j, k = back[j][k], k - 1
    return [min(v for v in picks if v >= n) for n in need]


def shape_setup(problem: Problem, fine: list[Histogram]) -> ShapeSetup:
    """Settle the shapes the search works with (see module docstring, step 2)."""
    bms = bucket_models(problem, fine)
    if problem.mode == "reference":
        ref = reference_shapes(bms, problem.max_shapes)
        note = (f"reference mode: one compiled shape per bucket ({', '.join(map(str, ref))}); the declared "
                "shape moves only compile cost, so more shapes never pay")
        return ShapeSetup(None, ref, [float(compile_cost(s, problem.params)) for s in ref], -np.inf, True, (note,))
    all_shapes = np.unique(np.concatenate([h.S for h in fine]))
    if problem.max_seq_len is not None:
        all_shapes = all_shapes[all_shapes <= problem.max_seq_len]
    choice = choose_shapes(bms, all_shapes, problem.max_shapes)
    log.info("strict mode: shape relaxation bound %.6e at shapes %s", choice.bound, list(choice.shapes))
    # few candidates: search them all (exact); many: at the relaxation's shapes, since a large
    # shape layer left fractional by the LP stalls column generation
    shapes = all_shapes if len(all_shapes) <= ALL_SHAPES_MAX else np.asarray(choice.shapes, dtype=np.int64)
    note = ("strict mode: shapes chosen by the shape relaxation; the bound is that relaxation (every request at "
            "its own gen_len under the best K shapes) or the Lagrangian, whichever is higher")
    return ShapeSetup(shapes, None, [0.0] * len(fine), choice.bound, len(shapes) == len(all_shapes), (note,))


def gen_budget(hist: Histogram, n_t: int) -> int:
    """How many gen values a bucket may keep so that one pricing pass stays within PRICING_BUDGET."""
    return int(np.clip(PRICING_BUDGET / (n_t * max(len(hist), 1)), 48, MAX_GEN_VALUES))


def greedy_plan(problem: Problem) -> tuple[Batching, ...] | None:
    """The greedy packer's plan (a warm start and a fallback), or None if it finds none.

    Skipped above GREEDY_MAX_REQUESTS: its merges work per request, not per cell, and
    would spend the whole time limit before the optimiser starts.
    """
    from solvers.packers import PACKERS

    packer = PACKERS.get("greedy")
    if packer is None or sum(len(b) for b in problem.buckets) > GREEDY_MAX_REQUESTS:
        return None
    try:
        return packer(problem)
    except InfeasibleError:
        return None


def search(problem: Problem, fine: list[Histogram], setup: ShapeSetup, greedy, solver, deadline: float,
           reserves: tuple[int, ...] | None = None) -> Outcome:
    """Column generation then MIP over one problem (steps 3-4); never raises for infeasibility."""
    t_start = time.perf_counter()
    n_t = len(setup.shapes) if setup.shapes is not None else len(np.unique(np.concatenate([h.S for h in fine])))
    budgets = [gen_budget(h, n_t) for h in fine]
    hists = [build_histogram(b, k) if k < len(np.unique(h.G)) else h
             for b, h, k in zip(problem.buckets, fine, budgets)]
    bms = [replace(bm, const_cost=bm.const_cost + f) for bm, f in zip(bucket_models(problem, hists, reserves),
                                                                      setup.compile_fixed)]
    grids = [candidate_grid(bm, setup.shapes) for bm in bms]
    space = Space(problem, bms, grids, setup.shapes, [1] * len(bms))
    warm = None
    if greedy is not None:
        warm = [assignment_from_batching(bm, g, bt) for bm, g, bt in zip(bms, grids, greedy)]
        warm = None if any(w is None for w in warm) else warm
    empty = np.zeros(0, np.int64)
    if sum(full_size(bm, g) for bm, g in zip(bms, grids)) <= FULL_ARCS:
        res = [full_restriction(bm, g) for bm, g in zip(bms, grids)]
    else:
        res = [seed_restriction(bm, g, w.arc_cell if w else empty, w.arc_box if w else empty)
               for bm, g, w in zip(bms, grids, warm or [None] * len(bms))]
    cg = generate(space, res, deadline, budget=0.45 * max(0.0, deadline - t_start))
    notes = list(setup.notes)
    bound, bucket_bounds = setup.bound, None
    if setup.covers_all:
        lag = exact_bound(space, fine, cg, setup.compile_fixed) if any(h.coarsened for h in hists) \
            else cg.bound
        if any(h.coarsened for h in hists):
            notes.append("gen values were coarsened for the search; the bound is certified on the exact histogram")
        if lag.total > bound:
            bound, bucket_bounds = lag.total, lag.per_bucket
    sup = [support(bm, g, r, cg.lp_model, cg.lp.x, b) for b, (bm, g, r) in enumerate(zip(bms, grids, cg.lp_res))]
    best = solve_restricted(space, solver, sup, warm, min(deadline, time.perf_counter()
                                                          + 0.25 * max(0.0, deadline - time.perf_counter())))
    close = best is not None and best.objective - cg.bound.total <= TARGET_GAP * best.objective
    if time.perf_counter() < deadline and (best is None or best.objective > cg.bound.total):
        grown = cg.res
        if best is not None and problem.mode == "reference":
            gap = best.objective - cg.bound.total
            grown = [merge(bm, g, prune(bm, g, r, d, gap), inc)
                     for bm, g, r, d, inc in zip(bms, grids, cg.res, cg.duals, best.res)]
        # already within TARGET_GAP: a short polish (small models finish it, large ones stop early)
        until = min(deadline, time.perf_counter() + POLISH_S) if close else deadline
        full = solve_restricted(space, solver, grown, best.assignment if best else warm, until)
        if full is not None and (best is None or full.objective < best.objective):
            best = full
    if best is None:
        return Outcome(None, None, bound, bucket_bounds, "infeasible", solver.NAME, solver.version(), tuple(notes))
    batchings = []
    for b, (bm, g, a) in enumerate(zip(bms, grids, best.assignment)):
        box_of = box_of_requests(bm.hist.cell_of, a.arc_box, a.arc_cell, a.count)
        declared = np.full(len(box_of), setup.ref_shape[b]) if setup.ref_shape is not None else g.box(box_of)[0]
        # one batch per box, split under a batch-size cap by the packers' own splitter
        batchings.append(group_batching(problem.buckets[b], declared, (box_of,), problem.max_batch_size))
    return Outcome(tuple(batchings), best.objective, bound, bucket_bounds, best.result.status, best.result.backend,
                   best.result.version, tuple(notes))


@dataclass(frozen=True)
class Judged:
    """A candidate plan judged exactly: total cost and each broken limit (bucket, metric, value, limit)."""

    name: str
    cost: float
    broken: tuple[tuple[int, str, float, float], ...]


def judge(problem: Problem, name: str, batchings: tuple[Batching, ...]) -> Judged:
    """Expand a candidate (spike placement included) and evaluate it with the one cost model."""
    total, broken = 0.0, []
    for b, (bucket, bt, lim) in enumerate(zip(problem.buckets, batchings, problem.limits)):
        plan = assemble(bucket, bt, problem.params, problem.mode, lim)
        rows, _ = plan_rows(bucket, plan)
        m = plan_metrics(bucket.prompt_len[rows], bucket.gen_len[rows], plan.batch_ids, plan.seq_align,
                         problem.params, problem.mode)
        total += m.cost
        broken += [(b, c.metric, c.value, c.limit) for c in limit_checks(m, lim) if not c.ok]
    return Judged(name, total, tuple(broken))


def tightened(problem: Problem, reserves: tuple[int, ...], broken: tuple[tuple[int, str, float, float], ...]
              ) -> tuple[Problem, tuple[int, ...]]:
    """Tighten what the exact evaluation found broken: one more P95 member held back for a spike,
    or the limit lowered by its excess (a spike's worth at least for sequential time)."""
    limits, reserves = list(problem.limits), list(reserves)
    field = {"cost": "max_cost", "pad_ratio": "max_pad_ratio", "sequential_ms": "max_sequential_ms"}
    for b, metric, value, limit in broken:
        if metric == "p95_latency_ms":
            reserves[b] += 1
            continue
        excess = value - limit
        if metric == "sequential_ms":
            excess = max(excess, problem.params.Tshape_compile_ms)
        current = getattr(limits[b], field[metric])
        limits[b] = replace(limits[b], **{field[metric]: current - 1.01 * excess})
    return replace(problem, limits=tuple(limits)), tuple(reserves)


def plan_mip(problem: Problem, backend: str = "highs", time_limit: float = 60.0) -> Planned:
    """Plan every bucket by optimisation; the report carries a certified lower bound and its gap."""
    t0 = time.perf_counter()
    deadline = t0 + time_limit
    solver = get_backend(backend)
    fine = [build_histogram(b) for b in problem.buckets]
    setup = shape_setup(problem, fine)
    greedy = greedy_plan(problem)
    first, mip_ok, attempt_problem = None, None, problem
    reserves = spike_reserves(problem, fine)
    for attempt in range(MAX_REPAIRS + 1):
        outcome = search(attempt_problem, fine, setup, greedy, solver, deadline, reserves)
        first = first or outcome  # its bound is for the original limits: the only one certified
        if outcome.batchings is None:
            break
        judged = judge(problem, "mip", outcome.batchings)
        if not judged.broken:
            mip_ok = (judged, outcome.batchings)
            break
        if attempt == MAX_REPAIRS or time.perf_counter() > deadline:
            break
        log.info("exact re-evaluation: the MIP plan breaks %s; tightening and solving again",
                 ", ".join(f"{problem.buckets[b].name} {m}" for b, m, _, _ in judged.broken))
        attempt_problem, reserves = tightened(attempt_problem, reserves, judged.broken)
    options = [mip_ok] if mip_ok else []
    if greedy is not None:
        judged_greedy = judge(problem, "greedy", greedy)
        if not judged_greedy.broken:
            options.append((judged_greedy, greedy))
    if not options:
        raise InfeasibleError(explain_infeasible(problem, deadline_s=max(10.0, 0.5 * time_limit)))
    chosen, batchings = min(options, key=lambda o: o[0].cost)
    notes = list(first.notes)
    if chosen.name != "mip":
        notes.append("the greedy packer's plan is cheaper under the exact cost model than the MIP's and is returned "
                     "(the MIP searched a coarsened or time-limited space)")
    if attempt:
        notes.append(f"repaired: re-solved {attempt} time(s) with limits tightened by what the exact evaluation "
                     "found the model had missed")
    gap = (chosen.cost - first.bound) / chosen.cost if chosen.cost > 0 else 0.0
    status = "optimal" if gap <= 1e-4 else ("time_limit" if outcome.status == "time_limit" else "feasible")
    report = SolveReport(status, chosen.cost, first.bound, gap, time.perf_counter() - t0, outcome.backend,
                         outcome.version, first.bucket_bounds, tuple(notes))
    return Planned(batchings, report)
