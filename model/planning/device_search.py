"""The planner in strict and device mode: the flow model (``model.formulation.device_flow``) solved, matched, batched.

1. Levels: the shapes are the distinct aligned prompts of all buckets, the gen levels
   each bucket's distinct gens -- coarsened to request-weighted quantiles when there
   are too many (``PlannerOptions.flow_shape_levels`` / ``flow_gen_levels``).
2. The plan: requests enter at the level just above them (every solution is a plan);
   the backend solves the MIP, warm-started from the dpfill packer's plan.
3. The bound: when levels are exact the plan model's own dual bound is certified;
   otherwise requests enter at the level just below them, which relaxes every cost,
   cap and limit, and that model's dual bound is the certified one.
4. Batches: the served counts are matched to requests (a dominance matching, optimal
   by an exchange argument) and each box's members dealt into its batches.
"""

from __future__ import annotations

import bisect
import logging
import time

import numpy as np

from model.base.runtime import Deadline, DeadlineExceeded, interrupted
from model.domain.schema import Batching, Problem, Status
from model.domain.shapeset import round_up_to, usable
from model.formulation.boxes import BucketModel, variant_of_size
from model.formulation.device_flow import FlowBlocks, Levels, bucket_levels, build_flow_model, entry_levels
from model.histogram.cells import Histogram
from model.packers.grouping import balanced_batching
from model.planning.beside import Beside, can_fork, start
from model.planning.fixed_set import FIXED_SET_SHARE, fixed_set_bound
from model.planning.limit_bound import p95_bound, priced_buckets, searched
from model.planning.options import PlannerOptions
from model.planning.shapes import ShapeChoice, choose_shapes
from model.planning.stages import SearchOutcome, bucket_models
from solvers.backends import Backend
from solvers.backends.result import BackendResult, Feature, SolveOptions

log = logging.getLogger("shapeplan")
# the LP-price bound's least cost, its LPs cut at once: its (requests x shapes) price table priced by floors,
# suffix-minimised and summed into intervals (1.7-2.1 s for 10^4 long-context requests x 2,000 shapes)
LP_PRICE_S_PER_CELL = 1e-7


def weighted_levels(values: np.ndarray, counts: np.ndarray, most: int) -> np.ndarray:
    """At most ``most`` levels among the distinct values: all of them if few, else request-weighted
    quantiles plus the smallest and the largest (a plan needs the largest, a relaxation the smallest)."""
    distinct, inverse = np.unique(values, return_inverse=True)
    if len(distinct) <= most:
        return distinct
    weight = np.bincount(inverse, weights=counts)
    cdf = np.cumsum(weight) / weight.sum()
    picks = np.searchsorted(cdf, np.linspace(0, 1, most)[1:-1], side="left")
    return np.unique(np.r_[distinct[0], distinct[np.minimum(picks, len(distinct) - 1)], distinct[-1]])


def entry_shapes(problem: Problem, hist: Histogram) -> np.ndarray:
    """Each cell's smallest usable shape: its aligned prompt, or with a fixed set of allowed shapes the
    smallest allowed one covering it.  Device costs depend on the declared shape alone, so a cell may enter
    the grid there, and the levels are then allowed shapes: plan and bound are for the restricted problem."""
    allowed = usable(problem)
    return hist.S if allowed is None else round_up_to(hist.S, allowed)


def shape_levels(problem: Problem, hists: list[Histogram], options: PlannerOptions,
                 extra: np.ndarray | None = None) -> np.ndarray:
    """Candidate shapes: the distinct aligned prompts of every bucket (a shape between two of them only
    costs more than the one below it), coarsened when there are too many, plus ``extra`` (a start's shapes)."""
    S = np.concatenate([entry_shapes(problem, h) for h in hists])
    count = np.concatenate([h.count for h in hists]).astype(np.float64)
    levels = weighted_levels(S, count, options.flow_shape_levels)
    if extra is not None:
        levels = np.union1d(levels, extra)
    if problem.max_seq_len is not None:
        levels = levels[levels <= problem.max_seq_len]
    return levels.astype(np.int64)


def all_shapes(problem: Problem, hists: list[Histogram]) -> np.ndarray:
    """Every shape an optimal plan may use: the distinct aligned prompts (within max_seq_len)."""
    shapes = np.unique(np.concatenate([entry_shapes(problem, h) for h in hists]))
    return shapes[shapes <= problem.max_seq_len] if problem.max_seq_len is not None else shapes


def shape_relaxation(problem: Problem, hists: list[Histogram], deadline: Deadline = Deadline.never()
                     ) -> ShapeChoice:
    """The best K shapes when every request pays only its floor (``boxes.request_floor``): a lower bound
    on any plan, and its shapes a good start.  Cut by ``deadline`` (10 s on 10^5 long-context requests):
    no bound (-inf) and the one shape that covers every prompt as the start."""
    shapes = all_shapes(problem, hists)
    try:
        return choose_shapes(bucket_models(problem, hists), shapes, problem.max_shapes, deadline)
    except DeadlineExceeded:
        log.info("device mode: the time limit cut the shape relaxation short; no bound from it, and the start "
                 "is the one shape %d", int(shapes[-1]))
        return ShapeChoice(-np.inf, (int(shapes[-1]),))


def start_levels(problem: Problem, warm: tuple[Batching, ...] | None) -> tuple[np.ndarray | None, list]:
    """The shapes and, per bucket, the batch gens of a start plan: levels that let it be expressed exactly."""
    if warm is None:
        return None, [None] * len(problem.buckets)
    gens = []
    for bucket, bt in zip(problem.buckets, warm, strict=True):
        g_max = np.zeros(len(bt.shape_of), np.int64)
        np.maximum.at(g_max, bt.batch_of, bucket.gen_len)
        gens.append(np.unique(g_max))
    return np.unique(np.concatenate([bt.shape_of for bt in warm])), gens


def flow_levels(problem: Problem, hists: list[Histogram], options: PlannerOptions, rounding: str,
                warm: tuple[Batching, ...] | None = None) -> list[Levels]:
    """Every bucket's level grid with its requests entering above (``ceil``) or below (``floor``) them."""
    extra_shapes, extra_gens = start_levels(problem, warm)
    ts = shape_levels(problem, hists, options, extra_shapes)
    out = []
    for h, eg in zip(hists, extra_gens, strict=True):
        gs = weighted_levels(h.G, h.count.astype(np.float64), options.flow_gen_levels).astype(np.int64)
        out.append(bucket_levels(entry_shapes(problem, h), h.G, h.count, ts,
                                 gs if eg is None else np.union1d(gs, eg), rounding))
    return out


def exact_levels(levels: list[Levels], hists: list[Histogram], problem: Problem | None = None) -> bool:
    """True when every cell sits exactly on a level (plan and relaxation then coincide)."""
    return all(np.isin(h.S if problem is None else entry_shapes(problem, h), lv.ts).all()
               and np.isin(h.G, lv.gs).all() for lv, h in zip(levels, hists, strict=True))


def served(model_x: np.ndarray, blocks: list[FlowBlocks]) -> list[tuple[np.ndarray, ...]]:
    """Per bucket, (box i, box j, box v, members w, batches m) of the boxes a solution uses."""
    out = []
    for fb in blocks:
        w = np.rint(model_x[fb.w.slice()]).astype(np.int64)
        m = np.rint(model_x[fb.m.slice()]).astype(np.int64)
        used = w > 0
        out.append((fb.box_i[used], fb.box_j[used], fb.box_v[used], w[used], m[used]))
    return out


def match_requests(hist: Histogram, box_t: np.ndarray, box_g: np.ndarray, box_w: np.ndarray) -> np.ndarray:
    """The box each request rides in: requests by decreasing prompt then gen, each to the open box slot
    with the smallest g >= its gen among the boxes with t >= its prompt.

    Optimal for this dominance matching: a slot open now stays open for every later
    request (their prompts are no longer), and taking the tightest gen keeps the
    longer slots for the requests that need them.  Raises if the counts cannot be
    matched (the flow model guarantees they can).
    """
    order_box = np.argsort(-box_t, kind="stable")
    cells = np.lexsort((-hist.G, -hist.S))
    keys: list[int] = []
    slots: dict[int, list[list[int]]] = {}
    nb = 0
    box_of_cell: list[list[tuple[int, int]]] = [[] for _ in range(len(hist))]
    for c in cells.tolist():
        S, G, need = int(hist.S[c]), int(hist.G[c]), int(hist.count[c])
        while nb < len(order_box) and box_t[order_box[nb]] >= S:
            k = int(order_box[nb])
            g = int(box_g[k])
            if g not in slots:
                bisect.insort(keys, g)
                slots[g] = []
            slots[g].append([k, int(box_w[k])])
            nb += 1
        pos = bisect.bisect_left(keys, G)
        while need:
            if pos >= len(keys):
                raise RuntimeError("served counts cannot be matched to requests")
            bucket = slots[keys[pos]]
            k, left = bucket[-1]
            take = min(left, need)
            box_of_cell[c].append((k, take))
            need -= take
            if take == left:
                bucket.pop()
                if not bucket:
                    del slots[keys[pos]]
                    keys.pop(pos)
            else:
                bucket[-1][1] = left - take
    box_of = np.empty(len(hist.cell_of), dtype=np.int64)
    members = np.argsort(hist.cell_of, kind="stable")
    starts = np.r_[0, np.cumsum(hist.count)]
    for c, parts in enumerate(box_of_cell):
        at = starts[c]
        for k, n in parts:
            box_of[members[at:at + n]] = k
            at += n
    return box_of


def flow_batching(problem: Problem, b: int, hist: Histogram, ts: np.ndarray, gs: np.ndarray,
                  used: tuple[np.ndarray, ...]) -> Batching:
    """One bucket's served boxes as batches: requests matched to boxes, each box dealt into its m batches."""
    i, j, _v, w, m = used
    box_of = match_requests(hist, ts[i], gs[j], w)
    return balanced_batching(problem.buckets[b], ts[i][box_of], box_of, m)


def warm_vector(problem: Problem, hists: list[Histogram], bms: list[BucketModel], levels: list[Levels],
                blocks: list[FlowBlocks], n_cols: int, batchings: tuple[Batching, ...] | None) -> np.ndarray | None:
    """A packer's plan as a start for the plan model (served counts and batches per box, shapes, and the
    flows that carry each request from its entry level to its batch's box), or None where one of its
    batches has no box on the level grid."""
    if batchings is None:
        return None
    x = np.zeros(n_cols)
    ts = levels[0].ts
    for b, (bm, h, lv, fb, bt) in enumerate(zip(bms, hists, levels, blocks, batchings, strict=True)):
        bucket = problem.buckets[b]
        nb = len(bt.shape_of)
        g_max = np.zeros(nb, np.int64)
        np.maximum.at(g_max, bt.batch_of, bucket.gen_len)
        i = np.searchsorted(ts, bt.shape_of)
        j = entry_levels(g_max, lv.gs, "ceil")
        if (i >= len(ts)).any() or (ts[np.minimum(i, len(ts) - 1)] != bt.shape_of).any() or (j >= len(lv.gs)).any():
            return None
        n = np.bincount(bt.batch_of, minlength=nb)
        key = {(int(a), int(c), int(v)): k for k, (a, c, v) in enumerate(zip(fb.box_i, fb.box_j, fb.box_v,
                                                                             strict=True))}
        v = variant_of_size(bm, ts[i], lv.gs[j], n)
        for a, c, vv, nn in zip(i.tolist(), j.tolist(), v.tolist(), n.tolist(), strict=True):
            k = key.get((a, c, vv))
            if k is None:
                return None
            x[fb.w.start + k] += nn
            x[fb.m.start + k] += 1
        x[fb.z.start + np.unique(i * fb.n_compile + bm.graph[v])] = 1.0  # the shapes (or graphs) it compiles
        entry = (entry_levels(entry_shapes(problem, h)[h.cell_of], ts, "ceil"),
                 entry_levels(bucket.gen_len, lv.gs, "ceil"))
        a_flow, d_flow = start_flows(entry, (i[bt.batch_of], j[bt.batch_of]), lv.supply.shape)
        x[fb.a.slice()] = a_flow
        x[fb.d.slice()] = d_flow
    return x


def start_flows(entry: tuple[np.ndarray, np.ndarray], box: tuple[np.ndarray, np.ndarray],
                shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """The flows (a, d in their column order) that take every request from its entry level (i0, j0) to its
    box's level (i1, j1): up the shape levels along row j0, then up the gen levels along column i1.

    Each path is added as two differences and summed by cumsum, so this costs O(requests + levels)
    and needs no LP; every level it passes is reachable (it is above the request's entry).  Raises
    ValueError when a box lies below its member's entry level (the start is not a plan on this grid)."""
    (i0, j0), (i1, j1) = entry, box
    if (i1 < i0).any() or (j1 < j0).any():
        raise ValueError("a start batch lies below a member's entry level")
    nt, ng = shape
    up = np.zeros((nt, ng))
    np.add.at(up, (i0, j0), 1.0)
    np.add.at(up, (i1, j0), -1.0)
    over = np.zeros((nt, ng))
    np.add.at(over, (i1, j0), 1.0)
    np.add.at(over, (i1, j1), -1.0)
    return np.cumsum(up, axis=0)[:-1].reshape(-1), np.cumsum(over, axis=1)[:, :-1].reshape(-1)


def start_switches(model, bms: list[BucketModel], blocks: list[FlowBlocks], start: np.ndarray, nt: int) -> None:
    """A start's global switches from its buckets' compile units: the shapes it uses (y), the graphs (q, under a
    graph cap), and per unit whether its spike finds no harmless batch (e: one more member over the P95 limit),
    so the start satisfies the spike and cap rows as the plan does."""
    used = np.zeros(nt * (blocks[0].n_compile if blocks else 1), bool)
    for b, (bm, fb) in enumerate(zip(bms, blocks, strict=True)):
        z = start[fb.z.slice()] > 0
        used |= z
        e = model.block("col", "spike_over", b)
        if e is not None:
            harmless = (bm.safe | bm.slow)[fb.box_v]
            covered = np.bincount(fb.box_u[harmless], weights=start[fb.m.slice()][harmless], minlength=len(z)) > 0
            start[e.slice()] = (z & ~covered).astype(float)
    start[model.block("col", "y").slice()] = used.reshape(nt, -1).any(axis=1).astype(float)
    q = model.block("col", "graph")
    if q is not None:
        start[q.slice()] = used.astype(float)


def unsolved(solver: Backend, what: str) -> BackendResult:
    """The result of a flow model the time limit left no time to be ``what`` (built, solved)."""
    return BackendResult(Status.TIME_LIMIT_NO_SOLUTION, None, None, None, None, 0.0, solver.name, solver.version(),
                         f"the time limit passed before the flow model was {what}")


def solve_levels(problem: Problem, hists: list[Histogram], bms: list[BucketModel], levels: list[Levels],
                 solver: Backend, until: Deadline, warm: tuple[Batching, ...] | None, spikes: bool,
                 options: PlannerOptions):
    """Build and solve one flow model; returns (model, blocks, result).  With the deadline already past
    before the model is built, nothing is built (half a second at 4 x 10^5 columns: a short limit overran by
    it) and (None, None, result) returned; past once it is built, no backend is called (a child process
    alone takes a second to start)."""
    if until.expired():
        log.info("flow model: not built, the time limit has passed")
        return None, None, unsolved(solver, "built")
    model, blocks = build_flow_model(bms, levels, problem.max_shapes, problem.max_batch_size, spikes=spikes,
                                     max_graphs=problem.graph_cap)
    start = warm_vector(problem, hists, bms, levels, blocks, model.n_cols, warm)
    if start is not None:
        start_switches(model, bms, blocks, start, len(levels[0].ts))
    if until.expired():
        result = unsolved(solver, "solved")
        log.info("flow model: %d columns, %d rows: not solved, the time limit has passed", model.n_cols,
                 model.n_rows)
        return model, blocks, result
    warm_ok = start is not None and Feature.WARM_START in solver.features
    progress = (lambda inc, bnd: log.info("  MIP incumbent %.6e", inc)) if Feature.PROGRESS in solver.features \
        else None
    # a flow MIP that finds nothing better for a while gives its time back (where the backend can stop so)
    stall = max(options.flow_stall_s, options.flow_stall_share * until.left()) \
        if Feature.STALL in solver.features else None
    result = solver.solve(model, SolveOptions(time_limit=max(options.min_call_s, until.left()),
                                              warm_start=start if warm_ok else None, on_progress=progress,
                                              stall_s=stall))
    if result.status is Status.INTERRUPTED:
        raise interrupted()
    log.info("flow model: %d columns, %d rows: %s, objective %s, bound %s (%s %.1f s)", model.n_cols, model.n_rows,
             result.status.value, result.objective, result.bound, result.backend, result.time_s)
    return model, blocks, result


def flow_search(problem: Problem, fine: list[Histogram], warm: tuple[Batching, ...] | None, solver: Backend,
                deadline: Deadline, reserves: tuple[int, ...] | None = None,
                options: PlannerOptions = PlannerOptions(), want_bound: bool = True,
                relaxation: ShapeChoice | None = None) -> SearchOutcome:
    """Plan by the flow model and certify a bound (see module docstring); never raises for infeasibility.

    ``relaxation`` is the problem's shape relaxation when the caller has it (on a long-context trace it
    takes seconds; the limits it depends on do not change between repair attempts).

    With exact levels and no held-back P95 members the model is the whole problem in
    device mode, so its INFEASIBLE is a proof (``SearchOutcome.exact``).

    A search over shape sets forked beside the planner (``SearchOutcome.beside``) is stopped if this raises."""
    started: list[Beside] = []
    try:
        return flow_outcome(problem, fine, warm, solver, deadline, reserves, options, want_bound, relaxation, started)
    except BaseException:
        for beside in started:
            beside.stop()
        raise


def flow_outcome(problem: Problem, fine: list[Histogram], warm: tuple[Batching, ...] | None, solver: Backend,
                 deadline: Deadline, reserves: tuple[int, ...] | None, options: PlannerOptions, want_bound: bool,
                 relaxation: ShapeChoice | None, started: list[Beside]) -> SearchOutcome:
    """``flow_search``'s work; a search it forks beside the planner is put in ``started`` at once."""
    bms = bucket_models(problem, fine, reserves)
    plan_levels = flow_levels(problem, fine, options, "ceil", warm)
    exact = exact_levels(plan_levels, fine, problem)
    # the LP-price bound before the flow MIP, which spends the rest of the deadline
    lp_price, lp_lams, lp_searched = -np.inf, (), False
    cells = sum(len(b) for b in problem.buckets) * len(all_shapes(problem, fine))
    # the LP-price bound prices batches of n members by the free batch's T(n): not a bound where a batch of n runs
    # in its graph's T(B(n)), which can be cheaper (decode_large), so it is left out with compiled batch sizes
    priceable = want_bound and problem.cost.shared_batch_time and problem.windowing is None \
        and problem.cost.batch_buckets is None and cells <= options.lp_price_max_cells
    lp_cut, lp_s, lp_again, beside, lp_open = False, 0.0, False, None, False
    if priceable and cells * LP_PRICE_S_PER_CELL <= 0.25 * deadline.left():
        # with P95 limits, the same bound with each limit priced by a Lagrangian (``limit_bound``)
        lp_until, t_lp = deadline.share(options.lp_price_share), time.perf_counter()
        sets_s = options.prefix_share * deadline.left()
        tables = priced_buckets(problem, lp_until)
        fork = sets_s > 0 and options.beside_slice_s > 0 and can_fork()  # then a brief search here, the rest beside
        priced = searched(tables, lp_until.within(min(sets_s, options.beside_slice_s) if fork else sets_s))
        lp_price, lp_lams, lp_searched = priced.bound, priced.lams, priced.searched
        lp_cut, lp_s = lp_until.expired(), time.perf_counter() - t_lp  # cut: some shapes priced by floors only
        if fork:
            beside = start(tables, priced, deadline, "LP-price bound" + (
                " with the P95 limits priced by a Lagrangian" if any(lp_lams) else "")
                + ", raised by a search over each bucket's shape sets (beside the planner, on a second core)")
            started += [beside] if beside is not None else []
        lp_open = beside is None and bool(priced.unfinished)
    until = deadline
    model, blocks, result = solve_levels(problem, fine, bms, plan_levels, solver, until, warm,
                                         spikes=True, options=options)
    if lp_cut and result.stalled and deadline.left() >= 2.0 * lp_s:
        # the MIP gave time back that the bound's share lacked (a loaded host): the bound again, with all of it
        again, lp_again = p95_bound(problem, deadline, sets_s), True
        if again.bound > lp_price:
            lp_price, lp_lams, lp_searched = again.bound, again.lams, again.searched
            lp_open = beside is None and bool(again.unfinished)
    graphs = problem.cost.batch_buckets
    notes = [f"{problem.cost.name} mode: flow model over {len(plan_levels[0].ts)} shape levels and "
             f"{', '.join(str(len(lv.gs)) for lv in plan_levels)} gen levels"
             + (f"; graphs: one size class per batch bucket ({', '.join(map(str, graphs))}) at its graph's time, "
                "a compile per graph" + (f", at most {problem.graph_cap} graphs" if problem.graph_cap else "")
                if graphs is not None else "")]
    bound, by = -np.inf, ""
    if want_bound:
        relaxed = (relaxation or shape_relaxation(problem, fine)).bound
        bound = max(relaxed, lp_price)
        by = ("LP-price bound" + (" with the P95 limits priced by a Lagrangian" if any(lp_lams) else "")
              + (", raised by a search over each bucket's shape sets" if lp_searched else "")
              if lp_price > relaxed else "shape relaxation" if np.isfinite(relaxed) else "")
        notes.append("the bound is the largest of the shape relaxation (every request at its own gen in a full "
                     "batch under the best K shapes), the LP-price bound (set-partitioning duals per shape, the "
                     "best K shapes by DP) and the flow model's own bound where that one is certified"
                     if graphs is None else
                     "the bound is the larger of the shape relaxation priced at graphs (every request at its own "
                     "gen in a full graph under the best K shapes, a compile per shape) and the flow model's own "
                     "bound where that one is certified (every shape and gen a level); the LP-price bound prices "
                     "the free batch and is left out")
        if lp_again:
            notes.append("the time limit cut the LP-price bound's share before the flow MIP; it was priced again "
                         "with the time the MIP gave back")
        if any(lp_lams):
            notes.append("the LP-price bound prices each P95 limit by a Lagrangian: every member of a batch over "
                         "the limit pays " + ", ".join(f"{lam:.4g} ms" for lam in lp_lams)
                         + " (per bucket), less that times the members the limit lets over")
        if exact and result.bound is not None and not any(reserves or ()) and problem.cost.shared_batch_time \
                and result.bound > bound:
            bound, by = result.bound, "the flow MIP's dual bound"
        if problem.allowed_shapes is not None and deadline.left() > 0:
            # a fixed shape set: the LP over every batch on it, with the P95 rows, bounds every plan
            fixed = fixed_set_bound(problem, deadline.share(FIXED_SET_SHARE))
            if fixed > bound:
                bound, by = fixed, ("the allowed shapes' own bound: rider-chain prices on every subset a bucket "
                                    "may use, with its compiles (or the LP over every batch on them), P95 limits kept")
    whole = exact and not any(reserves or ()) and problem.cost.shared_batch_time
    if not result.has_solution:
        return SearchOutcome(None, None, bound, None, result.status, result.backend, result.version, tuple(notes),
                             whole, result.native, bound_by=by, stalled=result.stalled, beside=beside,
                             bound_open=lp_open)
    used = served(result.x, blocks)
    ts = plan_levels[0].ts
    batchings = tuple(flow_batching(problem, b, h, ts, lv.gs, u)
                      for b, (h, lv, u) in enumerate(zip(fine, plan_levels, used, strict=True)))
    return SearchOutcome(batchings, result.objective, bound, None, result.status, result.backend, result.version,
                         tuple(notes), whole, bound_by=by, stalled=result.stalled, beside=beside,
                         bound_open=lp_open)

