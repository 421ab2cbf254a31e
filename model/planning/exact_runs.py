"""Device mode: the best batches for requests already assigned to shapes, and shapes improved by local search.

For one shape s, a batch's time depends only on its size n and its longest gen, so with
the requests sorted by gen some optimal batching cuts the sorted list into consecutive
runs (swapping two members across two batches never shortens the longer one's gen).
``optimal_runs`` finds the cheapest cuts exactly by dynamic programming:

    C[i] = min over n <= cap(s, g_i) of  C[i - n] + T(n, s, g_i)     (g_i = gen of member i, sorted)

with T the cost model's batch time (with batch buckets T(B(n)): a run of n members runs in
its graph) and cap the KV capacity and batch-size cap (and the largest bucket whose graph fits).
With batch buckets each graph a shape's runs use is one more compile, which ``priced_runs``
weighs by dropping buckets while that lowers the exact total.  ``improve_shapes`` then
moves one shape at a time to the neighbouring candidate that lowers the exact total, each
shape's requests re-batched by the DP.  The result is a plan (the planner's warm start and a fallback), never a bound.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from model.base.runtime import check_interrupt
from model.cost.common import align
from model.cost.model import CostModel
from model.domain.schema import Batching, Problem
from model.planning.shapes import shape_dp

log = logging.getLogger("shapeplan")


def size_parts(gens: np.ndarray, s: int, cost: CostModel, sizes: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(fixed[c, i], per[c, i], class row of each size): T = fixed + n * per for a batch of n members in size
    class c whose longest gen is gens[i] -- the decode regimes, or with batch buckets one class per bucket
    (constant time T(B)) -- so the DP prices every size by the cost model's own linear parts."""
    kinds = cost.size_classes()
    parts = [cost.linear_parts(s, gens, np.full(len(gens), c)) for c in kinds]
    fixed = np.stack([f for f, _ in parts])
    per = np.stack([u for _, u in parts])
    row = np.searchsorted(np.asarray(kinds, dtype=np.int64), np.asarray(cost.size_class(sizes), dtype=np.int64))
    return fixed, per, row


def optimal_runs(gens: np.ndarray, s: int, cost: CostModel, max_batch: int | None,
                 latency_limit: float | None = None, classes: set | None = None) -> tuple[float, np.ndarray]:
    """Cheapest cut of ``gens`` (sorted ascending) into consecutive batches at shape s.

    Returns (total batch time, batch number of each member).  Exact for the order given
    (T from the cost model's per-batch and per-member parts, each size class on its own
    sizes: with batch buckets a run of n costs its graph's T(B(n))).  With a
    ``latency_limit`` no batch takes longer than it, except batches of members that
    exceed it even alone (every member's latency is its batch's time): a P95 limit then
    counts no member over it that need not be.  ``classes`` keeps only the sizes of those
    size classes (None: every size); ValueError when the runs cannot be cut into them.
    """
    n = len(gens)
    best = np.full(n + 1, np.inf)
    best[0] = 0.0
    take = np.zeros(n + 1, dtype=np.int64)
    caps = cost.batch_cap(s, gens, max_batch)
    if (caps < 1).any():
        raise ValueError(f"a request does not fit one batch at shape {s}")
    sizes = np.arange(1, int(min(caps.max(), n)) + 1)
    fixed, per, row = size_parts(gens, s, cost, sizes)
    allowed = None if classes is None else np.isin(np.asarray(cost.size_class(sizes)), list(classes))
    if allowed is not None and not allowed.any():
        raise ValueError(f"no batch size of the classes {sorted(classes)} fits at shape {s}")
    smallest = 0 if allowed is None else int(np.argmax(allowed))  # the smallest size a member may ride in
    # members over the limit even alone: a suffix of the gen order (time grows with gen)
    first_over = n
    if latency_limit is not None:
        alone = fixed[row[smallest]] + sizes[smallest] * per[row[smallest]]
        first_over = int(np.searchsorted(alone > latency_limit, True))  # alone is non-decreasing in gen
    for i in range(1, n + 1):
        cap = int(min(caps[i - 1], i))
        sz = sizes[:cap]
        time_ = fixed[row[:cap], i - 1] + sz * per[row[:cap], i - 1]
        cost_ = best[i - sz] + time_
        if latency_limit is not None:
            keep = time_ <= latency_limit if i <= first_over else sz <= i - first_over
            cost_ = np.where(keep | (sz == sizes[smallest]), cost_, np.inf)
        if allowed is not None:
            cost_ = np.where(allowed[:cap], cost_, np.inf)
        k = int(np.argmin(cost_))
        best[i], take[i] = cost_[k], sz[k]
    if not np.isfinite(best[n]):
        raise ValueError(f"the requests cannot be cut into batches of the classes {sorted(classes)} at shape {s}")
    cuts = []
    i = n
    while i > 0:
        cuts.append(i)
        i -= int(take[i])
    bounds = np.asarray(sorted(cuts), dtype=np.int64)
    batch = np.searchsorted(bounds, np.arange(n), side="right")
    return float(best[n]), batch


def compile_units(sizes: np.ndarray, cost: CostModel) -> int:
    """How many compiles batches of these sizes need at one shape: 1 where the compile is per shape, one per
    distinct graph (batch bucket) they run in where it is per graph."""
    if not len(sizes):
        return 0
    return len(np.unique(cost.compile_class(cost.size_class(np.asarray(sizes, dtype=np.int64)))))


def priced_runs(gens: np.ndarray, s: int, cost: CostModel, max_batch: int | None,
                latency_limit: float | None = None) -> tuple[float, np.ndarray]:
    """``optimal_runs`` with the compile its runs need at shape s: (device time plus compiles, batch of each
    member).  With batch buckets every bucket a run uses is one more graph to compile, which the DP does not
    see: the buckets it uses are then dropped one at a time while the exact total (time plus one compile per
    graph) drops, each trial re-cut by the DP over the remaining buckets' sizes."""
    t, batch = optimal_runs(gens, s, cost, max_batch, latency_limit)
    charge = float(cost.shape_charge(s))
    total = t + charge * compile_units(np.bincount(batch), cost)
    if cost.n_compile_classes == 1:
        return total, batch
    keep = set(cost.size_classes())
    improved = True
    while improved:
        improved = False
        used = sorted(set(cost.size_class(np.bincount(batch)).tolist()))
        for c in used if len(used) > 1 else []:
            try:
                t2, batch2 = optimal_runs(gens, s, cost, max_batch, latency_limit, keep - {c})
            except ValueError:
                continue
            total2 = t2 + charge * compile_units(np.bincount(batch2), cost)
            if total2 < total * (1 - 1e-12):
                total, batch, keep, improved = total2, batch2, keep - {c}, True
                break
    return total, batch


def filled_cost(gens: np.ndarray, s: int, cost: CostModel, max_batch: int | None) -> float:
    """Device time of ``gens`` (sorted ascending) cut greedily into runs filled to capacity at shape s, plus
    the compiles those runs need (``compile_units``).

    An upper bound on ``priced_runs`` that costs one step per batch instead of one per
    member: what the shape DP ranks intervals by before the chosen shapes are batched exactly.
    """
    n = len(gens)
    total, p = 0.0, 0
    sizes = []
    while p < n:
        window = int(min(n - p, cost.batch_cap(s, gens[p:p + 1], max_batch)[0] + 1))
        fits = np.arange(1, window + 1) <= cost.batch_cap(s, gens[p:p + window], max_batch)
        take = int(np.argmin(fits)) if not fits.all() else window
        if take == 0:
            raise ValueError(f"a request does not fit one batch at shape {s}")
        total += float(cost.batch_total(take, s, gens[p + take - 1]))
        sizes.append(take)
        p += take
    return total + float(cost.shape_charge(s)) * compile_units(np.asarray(sizes), cost)


class IntervalRuns:
    """Exact batchings of shape intervals, each computed once: ``(lo, hi]`` holds every bucket's requests whose
    aligned prompt lies in it, run at shape hi and batched by ``optimal_runs`` (P95 limit respected).

    With every request on the smallest shape covering it, a shape set's plan is its intervals' batchings, so
    the start's costing, the local search's moves and the final batching share one cache.  It keeps each
    interval's cost and run boundaries (one entry per batch, not per request); members are re-sorted on
    demand.  One cache serves one ``device_start`` call: it is mutable state, never shared between problems.
    """

    def __init__(self, problem: Problem):
        self.problem = problem
        self.aligned = [align(b.prompt_len) for b in problem.buckets]
        self._cache: dict[tuple[int, int], tuple[float, tuple[np.ndarray, ...]]] = {}

    def members(self, b: int, lo: int, hi: int) -> np.ndarray:
        """Bucket b's requests in (lo, hi], by gen then index (the order the runs cut)."""
        idx = np.flatnonzero((self.aligned[b] > lo) & (self.aligned[b] <= hi))
        return idx[np.argsort(self.problem.buckets[b].gen_len[idx], kind="stable")]

    def interval(self, lo: int, hi: int) -> tuple[float, tuple[np.ndarray, ...]]:
        """(device time plus the compiles of every bucket with members, per bucket the runs' end positions)."""
        key = (lo, hi)
        if key not in self._cache:
            prob = self.problem
            cost, ends = 0.0, []
            for b, lim in enumerate(prob.limits):
                members = self.members(b, lo, hi)
                if len(members) == 0:
                    ends.append(np.zeros(0, np.int64))
                    continue
                t, batch = priced_runs(prob.buckets[b].gen_len[members], hi, prob.cost, prob.max_batch_size,
                                       lim.max_p95_latency_ms)
                cost += t
                ends.append(np.flatnonzero(np.diff(np.r_[batch, -1])) + 1)
            self._cache[key] = (cost, tuple(ends))
        return self._cache[key]

    def total(self, shapes: np.ndarray, deadline: float = np.inf) -> float:
        """Exact device time of the plan these shapes (sorted, distinct) make; inf when ``deadline`` passes
        before every interval is costed (those costed stay cached)."""
        lows = np.r_[0, shapes[:-1]]
        cost = 0.0
        for lo, hi in zip(lows.tolist(), shapes.tolist(), strict=True):
            check_interrupt()  # an interval's exact DP takes up to a second on 10^5 requests
            if time.perf_counter() > deadline:
                return np.inf
            cost += self.interval(lo, hi)[0]
        return cost

    def batching(self, shapes: np.ndarray) -> tuple[Batching, ...]:
        """Every bucket's requests on the smallest of ``shapes`` covering them, in their intervals' runs."""
        lows = np.r_[0, shapes[:-1]]
        parts = [self.interval(int(lo), int(hi))[1] for lo, hi in zip(lows, shapes, strict=True)]
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
    has another plan); the final batching reuses the costings' runs."""
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
    return runs.batching(improve_shapes(runs, best, candidates, deadline))

