"""The windowed planner: one shape set for the whole trace, every window planned under it, many candidates judged.

With arrival windows the shapes stay global (at most K across every window and bucket)
while batches never span two windows.  So:

1. Bound (``model.planning.window_bound``): a certified lower bound for the windowed problem,
   and the shapes of its relaxation under every cap k <= K as starts.
2. Tiny problems (``model.planning.window_exact``): every plan enumerated, cheapest first, and
   judged until one meets every limit -- the optimum, with a gap of 0 (or a proof that no plan
   meets the limits).  The rest is for problems too big for that.
3. The un-windowed plan: the MIP planner on the trace without windows, its batches cut at the
   window ends (``window_merge.split_at_windows``) -- a candidate, and its shapes a start.
4. Shapes.  Where members are processed at the declared shape (strict and device mode), the
   starts (the bound's sets for every k <= K, so a cap K starts from the shapes a cap K - 1
   would plan with; dpfill's; the un-windowed plan's) are scored by the exact cost of the
   windows' runs plan and improved one shape at a time (``search_shapes``).  Reference mode
   takes the bound's shapes: there a declared shape moves only compile cost.
5. Windows.  With the shapes fixed the windows are independent: the runs plan (exact DP over
   gen runs, ``model.planning.window_runs``) plans all of them at once; then the MIP planner
   plans window after window (largest first, on several processes when they are many) under
   the one deadline -- once it has passed, no MIP starts and the remaining windows keep the
   fast plan (the runs plan, or in reference mode dpfill's under the shapes).  Each window
   keeps the cheaper of its MIP plan and its fast plan.
6. Every candidate -- runs plan, per-window MIPs, the un-windowed plan cut at windows, every
   packer (windowed packers respect windows) -- is judged exactly (waits, compile spikes,
   limits); the cheapest that meets every limit gets the final shape pass and is returned.
   With none, the packers are judged past the deadline until one meets every limit (a late
   plan beats none; the status says time limit); only then is it NoPlanFound (not a proof).

One deadline runs through every step: the bound gets 25% of the limit, the per-window MIPs
start only before 85%, the rest judges and compares.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace

import numpy as np

from model.base.errors import InfeasibleError, NoPlanFound
from model.base.runtime import Deadline
from model.domain.schema import Batching, Planned, Problem
from model.domain.windowing import WindowPart, n_windows
from model.packers import PACKERS
from model.packers.dpfill import pad_shapes
from model.planning.contract import Candidates, Judge, Judged, select
from model.planning.mip import final_shapes, packer_plans, plan_mip, until_acceptable
from model.planning.move_up import moved_candidates
from model.planning.options import PlannerOptions
from model.planning.parallel import run_items, shared, workers_available
from model.planning.rebatch import rebatched_candidates
from model.planning.window_bound import WindowBound, candidate_shapes, window_bound
from model.planning.window_exact import Exact, exact_plan
from model.planning.window_merge import overlay, split_at_windows, window_slices
from model.planning.window_parts import WindowIndex, WindowLimits, window_index, window_limits, window_part
from model.planning.window_runs import IntervalCosts, shape_set_cost, window_plan, window_pools
from solvers.backends import get_backend

log = logging.getLogger("shapeplan")

BOUND_SHARE = 0.25  # of the time limit
EXACT_SHARE = 0.5  # of the time left: tiny problems only, which it settles in well under a second
PLAIN_SHARE = 0.2  # of the time left: the MIP planner on the trace without windows
SEARCH_SHARE = 0.5  # of the time left: the shape search
RUNS_SHARE = 0.3  # of the time left: the runs plan's moves between shapes
WINDOWS_END = 0.85  # no window's MIP starts once this share of the time limit has passed
MIN_WINDOW_MIP_S = 0.05  # nor with less than this left: a MIP call costs about that before it searches
FEWER_SHARE = 0.3  # of the time left: the plan for K - 1 shapes, one more candidate (recursively)
FEWER_MAX_REQUESTS = 2000  # above this, the K - 1 shapes' start alone stands for it (a whole run per K costs)
FEWER_MIN_S = 0.2  # nor with less time than this for it: each level judges a few plans past a tiny limit
WINDOW_MIP_OPTIONS = PlannerOptions(rebatch_share=0.0, on_shapes_share=0.0, chain_shapes_share=0.0,
                                    prefix_share=0.0)
# every packer, the usual winners first; greedy merges per request, so it is skipped on big inputs
PACKER_ORDER = ("dpfill", "greedy", "exp", "pow2", "cells", "solo", "baseline")


def search_shapes(problem: Problem, costs: list[IntervalCosts], cands: np.ndarray, starts: list[np.ndarray],
                  deadline: Deadline) -> tuple[np.ndarray, float]:
    """The best shape set found: each start scored exactly, then one-shape moves (to a nearby candidate),
    drops and additions taken while they lower the exact total, until none does or the deadline."""
    top = int(cands[-1])
    seen: dict[tuple[int, ...], float] = {}
    slowest = [0.0]  # the longest scoring so far: a new one starts only if one as long still fits

    def score(shapes) -> float:
        key = tuple(sorted(set(int(s) for s in shapes) | {top}))
        if len(key) > problem.max_shapes:
            return np.inf
        if key not in seen:
            t = time.perf_counter()
            seen[key] = shape_set_cost(problem, costs, np.asarray(key, dtype=np.int64))
            slowest[0] = max(slowest[0], time.perf_counter() - t)
        return seen[key]

    def time_left() -> bool:
        """A scoring as long as the longest so far still fits (progress said every few seconds)."""
        if deadline.left() <= slowest[0]:
            return False
        deadline.tick("windowed shape search", "%d shape sets scored, best %.6g", len(seen), min(seen.values(),
                                                                                                default=np.inf))
        return True

    # the starts in the order given (the likeliest first), each while a scoring still fits -- the first always
    # (at 10^4 windows a scoring takes a second, and there are up to K + 4 starts)
    best, current = None, np.inf
    for start in starts:
        if best is not None and not time_left():
            break
        trial = np.asarray(sorted(set(int(x) for x in start) | {top}), dtype=np.int64)
        if score(trial) < current:
            best, current = trial, score(trial)
    if best is None:  # every start has more than K shapes with the top one added: the top one alone
        best = np.asarray([top], dtype=np.int64)
        current = score(best)
    improved = True
    while improved and time_left():
        improved = False
        for trial in moves(best, cands, problem.max_shapes):
            if not time_left():
                break
            value = score(trial)
            if value < current * (1 - 1e-9):
                best, current, improved = trial, value, True
                break
    log.info("windows: shape search ends at %.6e with shapes %s (%d sets scored)", current,
             [int(s) for s in best], len(seen))
    return best, current


def moves(shapes: np.ndarray, cands: np.ndarray, k: int) -> list[np.ndarray]:
    """Neighbouring shape sets: each shape but the largest moved 1, 2 or 4 candidates either way, dropped,
    and (below K shapes) one candidate added midway in each gap."""
    out = []
    pos = np.searchsorted(cands, shapes)
    for i in range(len(shapes) - 1):
        for step in (-1, 1, -2, 2, -4, 4):
            q = pos[i] + step
            lo = pos[i - 1] if i else -1
            if lo < q < pos[i + 1]:
                out.append(np.sort(np.r_[np.delete(shapes, i), cands[q]]))
        out.append(np.delete(shapes, i))
    if len(shapes) < k:
        for lo, hi in zip(np.r_[-1, pos[:-1]], pos, strict=True):
            if hi - lo > 1:
                out.append(np.sort(np.r_[shapes, cands[(lo + hi + 1) // 2]]))
    return out


def dpfill_shapes(problem: Problem, pools) -> np.ndarray:
    """dpfill's shapes: the padding DP over the whole trace (every bucket, every window)."""
    every = np.concatenate([np.concatenate(p.S) for p in pools])
    values, counts = np.unique(every, return_counts=True)
    return pad_shapes(values, counts, problem.max_shapes)


def acceptable(problem: Problem, judge: Judge, name: str, batchings: tuple[Batching, ...] | None,
               notes: tuple[str, ...] = ()) -> Judged | None:
    """The candidate judged exactly, with the notes it carries if returned; None when it breaks a rule or a
    limit (or does not exist)."""
    if batchings is None:
        return None
    judged = judge(problem, name, batchings)
    if judged.acceptable:
        return replace(judged, notes=notes)
    log.info("windows: the %s plan breaks %s", name,
             ", ".join(f"{problem.buckets[b].name} {m}" for b, m, _, _ in judged.broken) or "a rule")
    return None


def window_problem(part: WindowPart, shapes: np.ndarray, k: int) -> Problem:
    """One window's problem under the chosen shapes; compile is charged once for the whole trace, so the
    window pays none (the merged plan is judged with its compile costs and spikes)."""
    cost = part.problem.cost.without_compile()
    allowed = tuple(int(s) for s in shapes)
    if part.problem.allowed_shapes is not None:
        allowed = tuple(s for s in allowed if s in set(part.problem.allowed_shapes))
    return replace(part.problem, cost=cost, allowed_shapes=allowed, max_shapes=k)


def batching_cost(problem: Problem, batchings: tuple[Batching, ...]) -> float:
    """The batches' cost (prefill, decode, overhead; compiles aside, the shapes being shared) by the cost
    model's own arithmetic: what one window's candidates are compared by."""
    cm, total = problem.cost, 0.0
    for b, bt in zip(problem.buckets, batchings, strict=True):
        codes = np.asarray(bt.batch_of, dtype=np.int64)
        shape_of = np.asarray(bt.shape_of, dtype=np.int64)
        S, s_max, g_max = cm.batch_extents(b.prompt_len, b.gen_len, codes, shape_of)
        n_b = np.bincount(codes, minlength=len(shape_of))
        pre, dec, over, _ = cm.batch_costs(n_b, shape_of, s_max, g_max, cm.prefill_total(S))
        total += pre + dec + over
    return float(total)


def _plan_window(item: tuple[int, float]) -> tuple[int, WindowPart | None, tuple[Batching, ...] | None]:
    """Worker: one window's MIP plan under the shared deadline: (window, its part, its batchings), the part and
    batchings None when no MIP starts -- past the deadline, or with less than a MIP call's set-up left -- and
    the batchings None when the MIP finds none (the window keeps its fast plan either way)."""
    problem, pools, index, limits, shapes, backend, judge, end = shared()
    i, share = item
    left = end.left()
    if left < MIN_WINDOW_MIP_S:
        return i, None, None
    part = window_part(problem, pools, index, limits, i)
    sub = window_problem(part, shapes, problem.max_shapes)
    try:
        # no re-batching inside: the merged plan is re-batched per window once, at the end
        planned = plan_mip(sub, backend=backend, time_limit=min(left, max(MIN_WINDOW_MIP_S, share)), judge=judge,
                           options=WINDOW_MIP_OPTIONS)
    except (InfeasibleError, NoPlanFound) as exc:  # under these shapes and shares only: proves nothing
        log.info("windows: window %d: %s", part.index, exc)
        return i, part, None
    return i, part, planned.batchings


def mip_per_window(problem: Problem, pools: list, index: WindowIndex, limits: WindowLimits, shapes: np.ndarray,
                   backend: str, end: Deadline, judge: Judge) -> tuple[list[tuple[WindowPart, tuple[Batching, ...]]],
                                                                     int]:
    """The windows' MIP plans under ``shapes`` while ``end`` allows, largest windows first, each granted its
    share (by requests) of the time left: (part, batchings) of every window that got one, and how many MIPs
    started.  A window's sub-problem is built only when its MIP starts (``window_parts``)."""
    left = end.left()
    if left < MIN_WINDOW_MIP_S:
        return [], 0
    total = max(1, int(index.sizes.sum()))
    # no more windows than MIPs of the least length fit in the time on every core (10^5 items that each
    # only find the deadline passed cost seconds of messages between processes)
    most = int(left / MIN_WINDOW_MIP_S) * workers_available() + 1
    order = np.argsort(-index.sizes, kind="stable")[:most].tolist()
    items = [(i, left * int(index.sizes[i]) / total) for i in order]
    big = len(items) > 2 and total > 2000
    results = run_items(_plan_window, items, (problem, pools, index, limits, shapes, backend, judge, end), big)
    planned = [(part, bts) for _, part, bts in results if part is not None and bts is not None]
    return planned, sum(part is not None for _, part, _ in results)


def fast_plan(problem: Problem, shapes: np.ndarray) -> tuple[Batching, ...] | None:
    """Reference mode's fast plan under ``shapes``: dpfill's (then every request alone) with the allowed set
    narrowed to them, which keeps each batch inside its window."""
    allowed = tuple(int(s) for s in shapes)
    if problem.allowed_shapes is not None:
        allowed = tuple(s for s in allowed if s in set(problem.allowed_shapes))
    narrowed = replace(problem, allowed_shapes=allowed)
    for name in ("dpfill", "solo"):
        try:
            return PACKERS[name](narrowed)
        except InfeasibleError:
            continue
    return None


def window_candidates(problem: Problem, planned: list[tuple[WindowPart, tuple[Batching, ...]]],
                      fast: tuple[Batching, ...]) -> list[tuple[str, tuple[Batching, ...]]]:
    """From the windows' MIP plans and the fast plan: every window on its MIP plan where it has one, and every
    window on the cheaper of the two (each window's limits are its own shares, so the two can differ)."""
    if not planned:
        return []
    parts = [part for part, _ in planned]
    slices = window_slices(parts, fast)
    cheaper = [(p, m) for (p, m), f in zip(planned, slices, strict=True)
               if batching_cost(p.problem, m) < batching_cost(p.problem, f)]
    out = [("every window's MIP plan", overlay(problem, fast, planned))]
    if len(cheaper) < len(planned):
        out.append(("each window's cheaper of its MIP plan and the fast plan", overlay(problem, fast, cheaper)))
    return out


def plain_plan(problem: Problem, backend: str, judge: Judge, deadline: Deadline) -> tuple[Batching, ...] | None:
    """The MIP planner's plan of the trace without windows, its batches cut at the window ends (None if it has
    none).  Without windows every windowed plan is still a plan whose latencies only drop (no waits), so a proof
    that the limits cannot all be met there is one here too: it is raised."""
    try:
        planned = plan_mip(replace(problem, windowing=None), backend=backend, time_limit=max(1e-3, deadline.left()),
                           judge=judge)
    except NoPlanFound as exc:
        log.info("windows: the un-windowed plan: %s", exc)
        return None
    except InfeasibleError as exc:
        raise InfeasibleError(f"{exc} (without arrival windows already; windows only add waits)") from None
    return split_at_windows(problem, planned.batchings)


def fewer_shapes(problem: Problem, backend: str, judge: Judge, deadline: Deadline, options: PlannerOptions
                 ) -> Judged | None:
    """The windowed plan for one shape fewer (K - 1), as a candidate: every plan with fewer shapes is a plan
    here, so a cap K never returns worse than the cap K - 1 would (three requests once cost 6577 at K = 2 and
    9562 at K = 3).  Planned recursively while the problem is small enough to plan once per K in the time; None
    at K = 1, above ``FEWER_MAX_REQUESTS``, with less than ``FEWER_MIN_S`` for it, or when it finds no plan.
    Planned in less time than a run of its own, it may come out dearer than that run."""
    if (problem.max_shapes <= 1 or sum(len(b) for b in problem.buckets) > FEWER_MAX_REQUESTS
            or deadline.left() < FEWER_MIN_S):
        return None
    try:
        planned = plan_windowed(replace(problem, max_shapes=problem.max_shapes - 1), backend,
                                max(1e-3, deadline.left()), judge=judge, options=options)
    except (InfeasibleError, NoPlanFound) as exc:  # with fewer shapes only: proves nothing here
        log.info("windows: K = %d: %s", problem.max_shapes - 1, exc)
        return None
    return acceptable(problem, judge, "mip", planned.batchings,
                      (f"the plan for K = {problem.max_shapes - 1} (one shape fewer) is the cheapest",))


def packer_candidates(problem: Problem, judge: Judge, deadline: Deadline, spent: float,
                      options: PlannerOptions) -> list[Judged]:
    """Every packer's windowed plan judged exactly, while a judging still fits before ``deadline`` (greedy
    skipped above its request limit)."""
    n = sum(len(b) for b in problem.buckets)
    names = tuple(p for p in PACKER_ORDER if p != "greedy" or n <= options.greedy_max_requests)
    return packer_plans(problem, judge, names, deadline, spent, options)


def late_packers(problem: Problem, judge: Judge, tried: set[str]) -> list[Judged]:
    """Nothing met every limit in time: the packers not tried yet, judged past the deadline until one does (a
    time limit too short for the search must not end in "no plan" while a packer has one)."""
    return until_acceptable(problem, judge, [p for p in PACKER_ORDER if p not in tried])


def exact_answer(problem: Problem, exact: Exact, bound: WindowBound, t0: float, deadline: Deadline,
                 notes: list[str]) -> Planned:
    """The exact enumeration's optimum as the planner's answer (its cost is the certified bound: gap 0), or the
    proof that no plan meets the limits."""
    if exact.judged is None:
        none = [problem.buckets[i].name for i, v in enumerate(exact.bucket_bounds) if not np.isfinite(v)]
        raise InfeasibleError(f"the limits cannot all be met: every windowed plan of these "
                              f"{sum(len(b) for b in problem.buckets)} requests was enumerated ({exact.layouts} "
                              "bucket layouts: every batching within the windows, every declared shape within K) "
                              "and judged exactly, and none meets every limit"
                              + (f" (bucket {', '.join(none)})" if none and len(none) < len(problem.buckets) else ""))
    judged = replace(exact.judged, notes=(f"every windowed plan enumerated ({exact.layouts} bucket layouts) and "
                                          "judged cheapest first: the plan is the optimum",))
    buckets = tuple(max(a, b) for a, b in zip(bound.bucket_bounds, exact.bucket_bounds, strict=True))
    chosen, report = select(Candidates((judged,), max(bound.bound, exact.optimum), "windows-exact", "1", t0,
                                       deadline, bucket_bounds=buckets, lead=tuple(notes)))
    return Planned(chosen.batchings, report, chosen.plans, chosen.evaluation)


def plan_windowed(problem: Problem, backend: str = "highs", time_limit: float = 60.0, *, judge: Judge,
                  options: PlannerOptions = PlannerOptions()) -> Planned:
    """Plan a windowed problem (see module docstring); the report's bound covers the windowed problem."""
    t0 = time.perf_counter()
    deadline = Deadline.after(time_limit)

    def part(share: float) -> Deadline:
        """The instant ``share`` of the time limit after the start."""
        return Deadline(t0 + share * time_limit)

    solver = get_backend(backend)  # an unknown backend is bad input whichever path runs
    pools = window_pools(problem)
    runs_mode = problem.cost.pads_to_shape  # a batch's cost follows from (declared shape, longest gen, size)
    bound = window_bound(problem, pools, part(BOUND_SHARE), use_lp=problem.cost.shared_batch_time,
                         raise_until=part(BOUND_SHARE))
    log.info("windows: %d windows of %g s; bound %.6e (LP prices in %d of %d window-buckets) at shapes %s",
             n_windows(problem), problem.windowing.seconds, bound.bound, bound.lp_windows, bound.windows,
             list(bound.shapes))
    cands = candidate_shapes(pools, problem.max_seq_len)
    notes = [f"arrival windows of {problem.windowing.seconds:g} s ({n_windows(problem)} windows): batches never span "
             "two windows, the shapes are one set for every window; latency includes each member's wait to its "
             "window's end"]
    exact = exact_plan(problem, judge, cands, deadline.share(EXACT_SHARE))
    if exact is not None:
        return exact_answer(problem, exact, bound, t0, deadline, notes)
    n_requests = sum(len(b) for b in problem.buckets)
    spent = options.judge_s_per_request * n_requests  # a judging, until one is timed
    candidates: list[Judged] = []

    def consider(name: str, batchings: tuple[Batching, ...] | None, said: tuple[str, ...]) -> None:
        nonlocal spent
        t = time.perf_counter()
        found = acceptable(problem, judge, name, batchings, said)
        spent = max(spent, time.perf_counter() - t) if batchings is not None else spent
        if found is not None:
            candidates.append(found)

    fewer = fewer_shapes(problem, backend, judge, deadline.share(FEWER_SHARE), options)
    if fewer is not None:
        candidates.append(fewer)
    plain = plain_plan(problem, backend, judge, deadline.share(PLAIN_SHARE))
    consider("mip", plain, ("the MIP planner's plan of the trace without windows, its batches cut at the window "
                            "ends, is the cheapest",))
    if runs_mode:
        costs = [IntervalCosts(p, problem.cost, problem.max_batch_size) for p in pools]
        known = [np.unique(np.concatenate([bt.shape_of for bt in k])) for k in
                 (fewer.batchings if fewer is not None else None, plain) if k is not None]
        # the likeliest first: the bound's shapes, the K - 1 plan's, dpfill's, the un-windowed plan's, then
        # the bound's best sets under smaller caps
        starts = [np.asarray(bound.shapes), *known[:1], dpfill_shapes(problem, pools), *known[1:],
                  *(np.asarray(s) for s in bound.shape_sets[::-1])]
        shapes, score = search_shapes(problem, costs, cands, starts, deadline.share(SEARCH_SHARE))
        if np.isfinite(score):  # else some request fits no batch on the shape above it (the KV capacity)
            fast = window_plan(problem, costs, shapes, deadline.share(RUNS_SHARE))
            consider("mip", fast, ("shapes by local search scored with each window's exact-for-its-family plan "
                                   "(requests on the smallest used shape, optimal runs of gens per shape)",))
        else:
            fast = fast_plan(problem, shapes)
    else:
        shapes = np.asarray(bound.shapes, dtype=np.int64)
        fast = fast_plan(problem, shapes)
    if fast is not None:
        index = window_index(pools)
        limits = window_limits(problem, index, fast)
        planned, started = mip_per_window(problem, pools, index, limits, shapes, backend, part(WINDOWS_END), judge)
        log.info("windows: %d of %d windows planned by the MIP planner before its deadline", started, len(index))
        for what, batchings in window_candidates(problem, planned, fast):
            consider("mip", batchings, (f"{what} under the searched shapes ({started} of {len(index)} windows got "
                                        "a MIP before the deadline, the rest the fast plan)",))
    packers = packer_candidates(problem, judge, deadline, spent, options)
    tried = {j.name for j in packers}
    late = [] if candidates or any(j.acceptable for j in packers) else late_packers(problem, judge, tried)
    for j in (*packers, *late):
        if j.acceptable:
            candidates.append(replace(j, notes=(f"the windowed {j.name} packer's plan is the cheapest under the "
                                                "exact cost model" + (", judged after the time limit (nothing "
                                                                     "else met every limit)" if j in late else ""),)))
    if not candidates:
        raise NoPlanFound("no windowed plan meets every limit (the per-window plans, the un-windowed plan cut at the "
                          "windows and every windowed packer's each break one; not proven unmeetable); try longer "
                          "windows or looser limits")
    # each window's (bucket, shape) members re-batched exactly under the limits: the per-window DP of the runs
    # plan sees only its window's share of a limit, the MIPs a coarsened space, the packers no optimum
    candidates += rebatched_candidates(problem, judge, candidates, Deadline(deadline.at - options.judge_margin
                                                                            * spent))
    candidates += moved_candidates(problem, judge, candidates, Deadline(deadline.at - options.judge_margin * spent))
    best = min(candidates, key=lambda j: j.cost)
    passed, pass_note = final_shapes(problem, judge, best, deadline, spent, options)
    if pass_note:
        candidates.append(replace(passed, notes=(*best.notes, pass_note)))
    chosen, report = select(Candidates(tuple(candidates), bound.bound, solver.name, solver.version(), t0, deadline,
                                       bucket_bounds=bound.bucket_bounds, lead=tuple(notes),
                                       closing=(bound_note(bound),)))
    return Planned(chosen.batchings, report, chosen.plans, chosen.evaluation)


def bound_note(bound: WindowBound) -> str:
    """What the certified bound is, said plainly."""
    how = (f"LP prices (set-partitioning duals at each window's shapes) in {bound.lp_windows} of {bound.windows} "
           "window-buckets, per-request floors in the rest" if bound.lp_windows else "per-request floors")
    return ("the bound is certified for the windowed problem: min over every shape set (|Y| <= K, one set for "
            f"all windows) of per-request prices at their smallest covering shape ({how}), plus one compile per "
            "bucket; it does not charge a request for riding above its own shape, so it is loose where windows "
            "are small")
