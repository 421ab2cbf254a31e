"""The windowed planner: one shape set for the whole trace, then every window planned under it.

With arrival windows the shapes stay global (at most K across every window and bucket)
while batches never span two windows.  So:

1. Bound (``model.planning.window_bound``): a certified lower bound for the windowed problem,
   and the shapes of its relaxation as a first guess.
2. Shapes.  Device mode: the bound's shapes, dpfill's (an exact padding DP over the whole
   trace) and the previous shapes are scored by the exact cost of the plan step 3 makes
   with them, then improved by moving, dropping or adding one shape at a time (interval
   costs are cached, so a move re-batches only the intervals it changes).  The analytic
   modes take the bound's shapes: there the relaxation is nearly exact.
3. Windows.  With the shapes fixed the windows are independent.  Device mode plans all of
   them at once by an exact DP over runs (``model.planning.window_runs``); the analytic modes run
   the MIP planner on every window (allowed shapes = the chosen set, compile cost left to
   the whole), on several processes when the windows are many and large.
4. Merge and judge: the windows' batchings become one plan per bucket, judged exactly
   (waits, compile spikes, limits).  A window meets per-window shares of the bucket's
   absolute limits and the bucket's pad and P95 limits, which imply the bucket's own.  If
   the merged plan still breaks a limit, each window is re-planned by the MIP planner
   with those limits; the cheaper of that plan and the windowed dpfill packer's that
   meets every limit is returned; if neither does, no plan was found (NoPlanFound: not a proof).

The time limit bounds the whole run: the bound gets 35% of it, the shape search up to
75%, the rest expands, judges and compares.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace

import numpy as np

from model.base.errors import InfeasibleError, NoPlanFound
from model.base.runtime import Deadline
from model.domain.schema import Batching, Planned, Problem
from model.domain.windowing import WindowPart, n_windows, split
from model.packers import PACKERS
from model.packers.dpfill import pad_shapes
from model.planning.contract import Candidates, Judge, Judged, select
from model.planning.mip import plan_mip
from model.planning.parallel import run_items, shared
from model.planning.window_bound import WindowBound, candidate_shapes, window_bound
from model.planning.window_merge import merge
from model.planning.window_runs import IntervalCosts, shape_set_cost, window_plan, window_pools
from solvers.backends import get_backend

log = logging.getLogger("shapeplan")

BOUND_SHARE = 0.35
SEARCH_SHARE = 0.75


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

    best = min((np.asarray(sorted(set(int(x) for x in s) | {top}), dtype=np.int64) for s in starts), key=score)
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
    log.info("windows: shape search ends at %.6e ms with shapes %s (%d sets scored)", current,
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


def acceptable(problem: Problem, judge: Judge, name: str, batchings: tuple[Batching, ...] | None) -> Judged | None:
    """The candidate judged exactly, or None when it breaks a rule or a limit (or does not exist)."""
    if batchings is None:
        return None
    judged = judge(problem, name, batchings)
    if judged.acceptable:
        return judged
    log.info("windows: the %s plan breaks %s", name,
             ", ".join(f"{problem.buckets[b].name} {m}" for b, m, _, _ in judged.broken) or "a rule")
    return None


def packer_plan(problem: Problem, name: str) -> tuple[Batching, ...] | None:
    """A packer's windowed plan, or None if it cannot plan."""
    try:
        return PACKERS[name](problem)
    except InfeasibleError:
        return None


def window_problem(part: WindowPart, shapes: np.ndarray, k: int) -> Problem:
    """One window's problem under the chosen shapes; compile is charged once for the whole trace, so the
    window pays none (the merged plan is judged with its compile costs and spikes)."""
    cost = part.problem.cost.without_compile()
    allowed = tuple(int(s) for s in shapes)
    if part.problem.allowed_shapes is not None:
        allowed = tuple(s for s in allowed if s in set(part.problem.allowed_shapes))
    return replace(part.problem, cost=cost, allowed_shapes=allowed, max_shapes=k)


def _plan_window(item: tuple[int, float]) -> tuple[tuple[Batching, ...] | None, str, str]:
    """Worker: one window's MIP plan (batchings or None, backend, version)."""
    parts, shapes, k, backend, judge = shared()
    w, time_limit = item
    sub = window_problem(parts[w], shapes, k)
    try:
        planned = plan_mip(sub, backend=backend, time_limit=max(0.2, time_limit), judge=judge)
    except (InfeasibleError, NoPlanFound) as exc:  # under these shapes only: proves nothing for the trace
        log.info("windows: window %d: %s", parts[w].index, exc)
        return None, backend, ""
    return planned.batchings, planned.report.backend, planned.report.version


def mip_per_window(problem: Problem, parts: list[WindowPart], shapes: np.ndarray, backend: str,
                   deadline: Deadline, judge: Judge) -> tuple[tuple[Batching, ...] | None, str, str]:
    """Every window planned by the MIP planner under ``shapes``, merged (None if a window has no plan)."""
    left = max(1.0, deadline.left())
    total = max(1, sum(p.n_requests for p in parts))
    items = [(w, left * part.n_requests / total) for w, part in enumerate(parts)]
    big = len(parts) > 2 and total > 2000
    results = run_items(_plan_window, items, (parts, shapes, problem.max_shapes, backend, judge), big)
    _, backend_name, version = results[0]
    if any(r[0] is None for r in results):
        return None, backend_name, version
    return merge(problem, parts, [r[0] for r in results]), backend_name, version


def plan_windowed(problem: Problem, backend: str = "highs", time_limit: float = 60.0, *, judge: Judge) -> Planned:
    """Plan a windowed problem (see module docstring); the report's bound covers the windowed problem."""
    t0 = time.perf_counter()
    deadline = Deadline.after(time_limit)

    def part(share: float) -> Deadline:
        """The instant ``share`` of the time limit after the start."""
        return Deadline(t0 + share * time_limit)

    get_backend(backend)  # an unknown backend is bad input whichever path runs
    pools = window_pools(problem)
    device = problem.cost.shared_batch_time
    bound = window_bound(problem, pools, part(BOUND_SHARE), use_lp=device)
    log.info("windows: %d windows of %g s; bound %.6e (LP prices in %d of %d window-buckets) at shapes %s",
             n_windows(problem), problem.windowing.seconds, bound.bound, bound.lp_windows, bound.windows,
             list(bound.shapes))
    cands = candidate_shapes(pools, problem.max_seq_len)
    notes = [f"arrival windows of {problem.windowing.seconds:g} s ({n_windows(problem)} windows): batches never span "
             "two windows, the shapes are one set for every window; latency includes each member's wait to its "
             "window's end"]
    candidates: list[Judged] = []
    backend_name, version = "windows", "1"
    parts = None
    if device:
        costs = [IntervalCosts(p, problem.cost.params, problem.max_batch_size) for p in pools]
        starts = [np.asarray(bound.shapes), dpfill_shapes(problem, pools)]
        shapes, _ = search_shapes(problem, costs, cands, starts, part(SEARCH_SHARE))
        judged = acceptable(problem, judge, "mip", window_plan(problem, costs, shapes, part(0.9)))
        backend_name = "windows-runs-dp"
        notes.append("device mode: shapes by local search scored with each window's exact-for-its-family plan "
                     "(requests on the smallest used shape, optimal runs of gens per shape)")
        if judged is None:
            parts = split(problem)
            batchings, backend_name, version = mip_per_window(problem, parts, shapes, backend, deadline, judge)
            judged = acceptable(problem, judge, "mip", batchings)
            notes.append("the runs plan broke a limit: every window re-planned by the MIP planner under the shapes")
        if judged is not None:
            candidates.append(judged)
    else:
        shapes = np.asarray(bound.shapes, dtype=np.int64)
        parts = split(problem)
        batchings, backend_name, version = mip_per_window(problem, parts, shapes, backend, deadline, judge)
        judged = acceptable(problem, judge, "mip", batchings)
        if judged is not None:
            candidates.append(judged)
    packer = "dpfill" if device else "greedy"
    other = acceptable(problem, judge, packer, packer_plan(problem, packer))
    if other is not None:
        candidates.append(other)
    if not candidates:
        raise NoPlanFound("no windowed plan meets every limit (the per-window plans and the windowed "
                          f"{packer} packer's each break one; not proven unmeetable); try longer windows or "
                          "looser limits")
    said = tuple(j if j.name == "mip" else replace(j, notes=(f"the windowed {j.name} packer's plan is cheaper under "
                                                              "the exact cost model and is returned",))
                 for j in candidates)
    chosen, report = select(Candidates(said, bound.bound, backend_name,
                                       version if backend_name != "windows-runs-dp" else "1", t0, deadline,
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
