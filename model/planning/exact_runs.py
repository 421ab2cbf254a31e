"""Device mode: the best batches for requests already assigned to shapes, and shapes improved by local search.

Every request rides on the smallest chosen shape covering it, and each shape's requests
are cut into runs exactly (``model.planning.run_cuts``: a DP over the gen-sorted requests,
with batch buckets at each run's graph time).  ``IntervalRuns`` caches those batchings per
shape interval, ``improve_shapes`` moves one shape at a time to the neighbouring candidate
that lowers the exact total, and with a graph cap ``within_graph_cap`` drops the graphs that
cost least to do without until the plan runs few enough.  The result is a plan (the
planner's warm start and a fallback), never a bound.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from model.base.runtime import check_interrupt
from model.cost.common import align, allowed_above
from model.domain.schema import Batching, Problem
from model.planning.run_cuts import filled_cost, members_over, priced_runs
from model.planning.shapes import shape_dp

log = logging.getLogger("shapeplan")


Classes = dict[int, frozenset]  # per shape, the size classes its runs may use (a shape not named: all of them)


class IntervalRuns:
    """Exact batchings of shape intervals, each computed once: ``(lo, hi]`` holds every bucket's requests whose
    aligned prompt lies in it, run at shape hi and batched by ``priced_runs`` (P95 limit respected; with
    ``classes``, only in the size classes allowed at hi).

    With every request on the smallest shape covering it, a shape set's plan is its intervals' batchings, so
    the start's costing, the local search's moves and the final batching share one cache.  It keeps each
    interval's cost, run boundaries (one entry per batch, not per request), the compile classes its runs use
    and the members over the P95 limit per bucket; members are re-sorted on demand.  One cache serves one
    ``device_start`` call: it is mutable state, never shared between problems.
    """

    def __init__(self, problem: Problem):
        self.problem = problem
        self.aligned = [align(b.prompt_len) for b in problem.buckets]
        self._cache: dict[tuple, tuple[float, tuple[np.ndarray, ...], frozenset, tuple[int, ...]]] = {}

    def members(self, b: int, lo: int, hi: int) -> np.ndarray:
        """Bucket b's requests in (lo, hi], by gen then index (the order the runs cut)."""
        idx = np.flatnonzero((self.aligned[b] > lo) & (self.aligned[b] <= hi))
        return idx[np.argsort(self.problem.buckets[b].gen_len[idx], kind="stable")]

    def interval(self, lo: int, hi: int, classes: frozenset | None = None
                 ) -> tuple[float, tuple[np.ndarray, ...], frozenset, tuple[int, ...]]:
        """(device time plus the compiles of every bucket with members, per bucket the runs' end positions, the
        compile classes the runs use, per bucket the members over its P95 limit); inf cost where the requests
        cannot be cut into the allowed classes."""
        key = (lo, hi, classes)
        if key not in self._cache:
            prob = self.problem
            cost, ends, used, over = 0.0, [], set(), []
            for b, lim in enumerate(prob.limits):
                members = self.members(b, lo, hi)
                over.append(0)
                if len(members) == 0:
                    ends.append(np.zeros(0, np.int64))
                    continue
                gens = prob.buckets[b].gen_len[members]
                try:
                    t, batch = priced_runs(gens, hi, prob.cost, prob.max_batch_size, lim.max_p95_latency_ms, classes)
                except ValueError:
                    self._cache[key] = (np.inf, (), frozenset(), ())
                    return self._cache[key]
                cost += t
                ends.append(np.flatnonzero(np.diff(np.r_[batch, -1])) + 1)
                sizes = np.bincount(batch)
                used |= set(prob.cost.compile_class(prob.cost.size_class(sizes)).tolist())
                over[-1] = members_over(gens, batch, hi, prob.cost, lim.max_p95_latency_ms)
            self._cache[key] = (cost, tuple(ends), frozenset(used), tuple(over))
        return self._cache[key]

    def parts(self, shapes: np.ndarray, classes: Classes | None = None) -> list[tuple]:
        """Every interval of these shapes (sorted, distinct), computed or from the cache."""
        lows = np.r_[0, shapes[:-1]]
        return [self.interval(int(lo), int(hi), (classes or {}).get(int(hi)))
                for lo, hi in zip(lows.tolist(), shapes.tolist(), strict=True)]

    def total(self, shapes: np.ndarray, deadline: float = np.inf, classes: Classes | None = None) -> float:
        """Exact device time of the plan these shapes (sorted, distinct) make; inf when ``deadline`` passes
        before every interval is costed (those costed stay cached)."""
        lows = np.r_[0, shapes[:-1]]
        cost = 0.0
        for lo, hi in zip(lows.tolist(), shapes.tolist(), strict=True):
            check_interrupt()  # an interval's exact DP takes up to a second on 10^5 requests
            if time.perf_counter() > deadline:
                return np.inf
            cost += self.interval(lo, hi, (classes or {}).get(hi))[0]
        return cost

    def batching(self, shapes: np.ndarray, classes: Classes | None = None) -> tuple[Batching, ...]:
        """Every bucket's requests on the smallest of ``shapes`` covering them, in their intervals' runs."""
        lows = np.r_[0, shapes[:-1]]
        parts = [p[1] for p in self.parts(shapes, classes)]
        out = []
        for b, bucket in enumerate(self.problem.buckets):
            batch_of = np.empty(len(bucket), dtype=np.int64)
            shape_out: list[np.ndarray] = []
            base = 0
            for lo, hi, ends in zip(lows.tolist(), shapes.tolist(), (p[b] for p in parts), strict=True):
                if len(ends) == 0:
                    continue
                members = self.members(b, lo, hi)
                batch_of[members] = base + np.searchsorted(ends, np.arange(len(members)), side="right")
                shape_out.append(np.full(len(ends), hi, dtype=np.int64))
                base += len(ends)
            out.append(Batching(batch_of, np.concatenate(shape_out) if shape_out else np.zeros(0, np.int64)))
        return tuple(out)


def graph_count(runs: IntervalRuns, shapes: np.ndarray, classes: Classes | None = None) -> int:
    """Distinct graphs the plan of these shapes runs across all buckets (a shape's compile classes in use)."""
    return sum(len(p[2]) for p in runs.parts(shapes, classes))


def within_p95(runs: IntervalRuns, shapes: np.ndarray, classes: Classes | None, before: list[int]) -> bool:
    """Whether no bucket ends with more members over its P95 limit than it may (``allowed_above``, less one per
    compile spike), or than ``before`` where it was already over."""
    parts = runs.parts(shapes, classes)
    for b, bucket in enumerate(runs.problem.buckets):
        over = sum(p[3][b] for p in parts if p[3])
        spikes = sum(len(p[2]) for p in parts if p[3] and len(p[1][b]))
        if over > before[b] and over + spikes > allowed_above(len(bucket)):
            return False
    return True


def within_graph_cap(runs: IntervalRuns, shapes: np.ndarray, cap: int, deadline: float) -> Classes | None:
    """The size classes per shape that bring the plan of ``shapes`` within ``cap`` graphs: while it runs more,
    the graph (shape, class) whose loss raises the exact total least is dropped -- the requests at that shape
    re-cut without it -- as long as the P95 count stays within its allowance.  None when no drop is left, or
    the deadline passes first."""
    classes: Classes = {}
    kinds = frozenset(runs.problem.cost.size_classes())
    before = [sum(p[3][b] for p in runs.parts(shapes) if p[3]) for b in range(len(runs.problem.buckets))]
    while graph_count(runs, shapes, classes) > cap:
        best, best_cost = None, np.inf
        for hi, part in zip(shapes.tolist(), runs.parts(shapes, classes), strict=True):
            for c in sorted(part[2]) if len(part[2]) > 1 else []:
                if time.perf_counter() > deadline:
                    return None
                trial = {**classes, hi: classes.get(hi, kinds) - {c}}
                cost = runs.total(shapes, deadline, trial)
                if cost < best_cost and within_p95(runs, shapes, trial, before):
                    best, best_cost = trial, cost
        if best is None:
            return None
        classes = best
    return classes


def distinct_shapes(shapes: np.ndarray) -> np.ndarray:
    """Shapes sorted, each once, as int64."""
    return np.asarray(sorted(set(int(s) for s in shapes)), dtype=np.int64)


def improve_shapes(runs: IntervalRuns, shapes: np.ndarray, candidates: np.ndarray, deadline: float) -> np.ndarray:
    """Move one shape at a time to a neighbouring candidate, or drop it, while the exact total drops.

    The largest shape stays (it must cover the longest prompt).  Every request runs on
    the smallest shape covering it, so a shape's cost depends only on it and the shape
    below it: ``runs`` caches interval costs, and a move re-batches the intervals it
    changes.  Stops at the deadline with the best set so far.
    """
    shapes = distinct_shapes(shapes)
    current = runs.total(shapes)
    improved = True
    while improved and time.perf_counter() < deadline:
        check_interrupt()
        improved = False
        for k in range(len(shapes) - 1):
            pos = int(np.searchsorted(candidates, shapes[k]))
            trials = [np.delete(shapes, k)]
            trials += [np.sort(np.r_[np.delete(shapes, k), candidates[q]]) for q in (pos - 1, pos + 1)
                       if 0 <= q < len(candidates) and candidates[q] not in shapes]
            for trial in trials:
                if time.perf_counter() > deadline:
                    break
                cost = runs.total(trial, deadline)
                if cost < current * (1 - 1e-12):
                    shapes, current, improved = trial, cost, True
                    break
            if improved:
                break
    log.info("device mode: shape local search ends at %.6e ms with shapes %s", current, [int(s) for s in shapes])
    return shapes


def interval_costs(problem: Problem, candidates: np.ndarray, deadline: float) -> np.ndarray | None:
    """cost[lo+1, hi]: the requests with aligned prompt in (candidates[lo], candidates[hi]] (every bucket)
    run at candidates[hi], filled to capacity in gen order (``filled_cost``), plus one compile per bucket
    that has any; None if the deadline passes first."""
    T = len(candidates)
    cost = np.full((T + 1, T), np.inf)
    aligned = [align(b.prompt_len) for b in problem.buckets]
    for hi in range(T):
        top = int(candidates[hi])
        for lo in range(-1, hi):
            low = int(candidates[lo]) if lo >= 0 else 0
            total = 0.0
            for a, bucket in zip(aligned, problem.buckets, strict=True):
                sel = (a > low) & (a <= top)
                if sel.any():
                    total += filled_cost(np.sort(bucket.gen_len[sel]), top, problem.cost, problem.max_batch_size)
            cost[lo + 1, hi] = total
            check_interrupt()
            if time.perf_counter() > deadline:
                return None
    return cost


def device_start(problem: Problem, starts: list[np.ndarray], candidates: np.ndarray, coarse: np.ndarray,
                 deadline: float, required: bool = True) -> tuple[Batching, ...] | None:
    """The planner's start in device mode: the best of the given shape sets and of an exact interval DP
    over the ``coarse`` candidates, every request on the smallest chosen shape covering it and each
    shape's requests batched exactly (``optimal_runs``), then improved by moving or dropping one shape at
    a time among the candidates until the deadline.

    Each start's exact costing takes seconds on 10^5 long-context requests, so they are costed in order
    of promise while the deadline allows: the first given set (the caller's best guess; ``starts`` is
    never empty), the DP's (when
    its interval costs finish within half the time left), then the other given sets.  A costing runs
    past the deadline only when a start is ``required`` and none is costed yet (else None: the caller
    has another plan); the final batching reuses the costings' runs.  Under a graph cap the start's
    graphs are then brought within it where a drop can (``within_graph_cap``)."""
    runs = IntervalRuns(problem)
    best, best_cost = None, np.inf

    def consider(sh: np.ndarray) -> None:
        nonlocal best, best_cost
        if (best is not None or not required) and time.perf_counter() > deadline:
            return
        sh = distinct_shapes(sh)
        c = runs.total(sh, deadline if best is not None or not required else np.inf)
        if c < best_cost:
            best, best_cost = sh, c

    consider(starts[0])
    now = time.perf_counter()
    cost = interval_costs(problem, coarse, now + 0.5 * max(0.0, deadline - now))
    if cost is not None:
        consider(np.asarray(shape_dp(cost, coarse, problem.max_shapes)[1]))
    for sh in starts[1:]:
        consider(sh)
    if best is None:
        return None
    cap = problem.graph_cap
    now = time.perf_counter()
    # under a graph cap the local search leaves part of the time to the drops that meet the cap
    shapes = improve_shapes(runs, best, candidates, deadline if cap is None else now + 0.6 * max(0.0, deadline - now))
    if cap is None or graph_count(runs, shapes) <= cap:
        return runs.batching(shapes)
    classes = within_graph_cap(runs, shapes, cap, max(deadline, time.perf_counter() + 1.0))
    log.info("device mode: the start runs %d graphs, over the cap %d: %s", graph_count(runs, shapes), cap,
             "graphs dropped where they cost least" if classes is not None else "no drop within it found")
    return runs.batching(shapes, classes) if classes is not None else runs.batching(shapes)

