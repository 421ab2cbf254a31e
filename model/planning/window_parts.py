"""The windows a MIP plans one at a time, built only when it does, with limits that add up to the bucket's.

Cutting the whole problem into one sub-problem per window up front took a Python step
per window and bucket (10^5 windows: seconds before any MIP ran, and most of them never
get one before the deadline).  Here the windows are an index over the window pools
(``WindowIndex``); a window's sub-problem is built when its MIP starts, and everything
that runs over every window -- each window's share of the limits, the fast plan's
slices -- is vectorised.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from model.domain.schema import Batching, Limits, Problem
from model.domain.windowing import WindowPart, subset, waits_of, windows_of
from model.planning.window_runs import WindowPools


@dataclass(frozen=True, eq=False)
class WindowIndex:
    """Every window holding requests (``windows``, ascending) and, per bucket, its position in that bucket's
    pools (-1 where the bucket has none there); ``sizes`` counts each window's requests over the buckets."""

    windows: np.ndarray
    at: tuple[np.ndarray, ...]
    sizes: np.ndarray

    def __len__(self) -> int:
        return len(self.windows)


def window_index(pools: list[WindowPools]) -> WindowIndex:
    """The windows of every bucket's pools, lined up."""
    windows = np.unique(np.concatenate([p.windows for p in pools]))
    at, sizes = [], np.zeros(len(windows), dtype=np.int64)
    for p in pools:
        pos = np.full(len(windows), -1, dtype=np.int64)
        where = np.searchsorted(windows, p.windows)
        pos[where] = np.arange(len(p))
        sizes[where] += np.array([len(r) for r in p.rows], dtype=np.int64)
        at.append(pos)
    return WindowIndex(windows, tuple(at), sizes)


@dataclass(frozen=True, eq=False)
class WindowLimits:
    """What each (bucket, window) may use of its bucket's limits: ``share[b][i]`` of the absolute limits left
    after the compiles and spikes (``left_cost``, ``left_seq``), and the P95 limit less the window's longest
    wait (``p95[b][i]``)."""

    share: tuple[np.ndarray, ...]
    left_cost: tuple[float | None, ...]
    left_seq: tuple[float | None, ...]
    p95: tuple[np.ndarray | None, ...]


def window_limits(problem: Problem, index: WindowIndex, fast: tuple[Batching, ...]) -> WindowLimits:
    """Limits that, met in every window, meet the bucket's (so each window's MIP may plan alone):

    - cost and sequential time: what is left of the bucket's limit after its compiles (and one compile spike
      per shape it uses), shared among its windows in proportion to the fast plan's batch costs there (by
      request count a window of one long prompt got a third of the limit and no plan);
    - P95: the limit less the window's longest wait, since the per-window MIP prices batch latencies without
      the waits; members allowed above it per window sum to at most the bucket's allowance;
    - pad ratio: the bucket's own (met in every window, met overall)."""
    cm = problem.cost
    shares, left_cost, left_seq, p95 = [], [], [], []
    for b, (bucket, bt, lim) in enumerate(zip(problem.buckets, fast, problem.limits, strict=True)):
        codes = np.asarray(bt.batch_of, dtype=np.int64)
        shape_of = np.asarray(bt.shape_of, dtype=np.int64)
        n_b = np.bincount(codes, minlength=len(shape_of))
        g_max = np.zeros(len(shape_of), dtype=np.int64)
        np.maximum.at(g_max, codes, bucket.gen_len)
        pos = np.searchsorted(index.windows, windows_of(problem, bucket))
        batch_pos = np.zeros(len(shape_of), dtype=np.int64)
        batch_pos[codes] = pos
        # a weight per batch: its cost at its declared shape and longest gen (any weights summing to 1 keep the
        # windows' limits within the bucket's; these follow where the cost lies)
        weight = np.bincount(batch_pos, weights=cm.batch_total(n_b, shape_of, g_max), minlength=len(index))
        count = np.bincount(pos, minlength=len(index)).astype(np.float64)
        total = float(weight.sum())
        shares.append(weight / total if total > 0 else count / count.sum())
        used = np.unique(shape_of)
        left_cost.append(None if lim.max_cost is None else max(0.0, lim.max_cost - float(cm.shape_charge(used).sum())))
        left_seq.append(None if lim.max_sequential_ms is None
                        else max(0.0, lim.max_sequential_ms - cm.spike_ms * len(used)))
        if lim.max_p95_latency_ms is None:
            p95.append(None)
        else:
            longest = np.zeros(len(index))
            np.maximum.at(longest, pos, waits_of(problem, bucket))
            p95.append(np.maximum(0.0, lim.max_p95_latency_ms - longest))
    return WindowLimits(tuple(shares), tuple(left_cost), tuple(left_seq), tuple(p95))


def limits_at(problem: Problem, limits: WindowLimits, b: int, i: int) -> Limits:
    """Bucket b's limits in window ``i`` of the index."""
    lim = problem.limits[b]
    if limits.left_cost[b] is not None:
        lim = replace(lim, max_cost=limits.left_cost[b] * float(limits.share[b][i]))
    if limits.left_seq[b] is not None:
        lim = replace(lim, max_sequential_ms=limits.left_seq[b] * float(limits.share[b][i]))
    if limits.p95[b] is not None:
        lim = replace(lim, max_p95_latency_ms=float(limits.p95[b][i]))
    return lim


def window_part(problem: Problem, pools: list[WindowPools], index: WindowIndex, limits: WindowLimits, i: int
                ) -> WindowPart:
    """Window ``i`` of the index as a problem of its own (its buckets, their rows, its share of the limits)."""
    bucket_of, rows, buckets, lims = [], [], [], []
    for b, pos in enumerate(index.at):
        if pos[i] >= 0:
            r = np.sort(pools[b].rows[int(pos[i])])
            bucket_of.append(b)
            rows.append(r)
            buckets.append(subset(problem.buckets[b], r))
            lims.append(limits_at(problem, limits, b, i))
    return WindowPart(int(index.windows[i]), replace(problem, buckets=tuple(buckets), limits=tuple(lims)),
                      tuple(bucket_of), tuple(rows))
