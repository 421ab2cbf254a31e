"""Device mode: the best batches for requests already assigned to shapes, and shapes improved by local search.

For one shape s, a batch's time depends only on its size n and its longest gen, so with
the requests sorted by gen some optimal batching cuts the sorted list into consecutive
runs (swapping two members across two batches never shortens the longer one's gen).
``optimal_runs`` finds the cheapest cuts exactly by dynamic programming:

    C[i] = min over n <= cap(s, g_i) of  C[i - n] + T(n, s, g_i)     (g_i = gen of member i, sorted)

with T the device batch time (``model.cost.device.batch_time``) and cap the KV capacity
and batch-size cap.  ``improve_shapes`` then moves one shape at a time to the neighbouring
candidate that lowers the exact total, each shape's requests re-batched by the DP.  The
result is a plan (the planner's warm start and a fallback), never a bound.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from model.cost.common import align
from model.cost.device import DeviceProfile, batch_time
from model.schema import Batching, Problem
from solvers.packers.grouping import batch_capacity

log = logging.getLogger("shapeplan")


def optimal_runs(gens: np.ndarray, s: int, prof: DeviceProfile, max_batch: int | None) -> tuple[float, np.ndarray]:
    """Cheapest cut of ``gens`` (sorted ascending) into consecutive batches at shape s.

    Returns (total batch time, batch number of each member).  Exact for the order given.
    """
    n = len(gens)
    kv = prof.kv_capacity_tokens
    best = np.full(n + 1, np.inf)
    best[0] = 0.0
    take = np.zeros(n + 1, dtype=np.int64)
    caps = batch_capacity(s, gens, max_batch, kv)
    if (caps < 1).any():
        raise ValueError(f"a request does not fit one batch at shape {s}")
    for i in range(1, n + 1):
        cap = int(min(caps[i - 1], i))
        sizes = np.arange(1, cap + 1)
        cost = best[i - sizes] + batch_time(sizes, s, gens[i - 1], prof)
        k = int(np.argmin(cost))
        best[i], take[i] = cost[k], sizes[k]
    cuts = []
    i = n
    while i > 0:
        cuts.append(i)
        i -= int(take[i])
    bounds = np.asarray(sorted(cuts), dtype=np.int64)
    batch = np.searchsorted(bounds, np.arange(n), side="right")
    return float(best[n]), batch


def shape_cost(problem: Problem, gens_by_shape: dict[int, np.ndarray], s: int) -> float:
    """Exact device time of one shape's requests (sorted gens) batched optimally, plus its compile time."""
    gens = gens_by_shape.get(s)
    if gens is None or len(gens) == 0:
        return 0.0
    return optimal_runs(gens, s, problem.params, problem.max_batch_size)[0] + problem.params.compile_ms


def runs_batching(problem: Problem, shapes: np.ndarray) -> tuple[Batching, ...]:
    """Every bucket's requests on the smallest given shape covering them, batched by ``optimal_runs``."""
    out = []
    for bucket in problem.buckets:
        shape_of = shapes[np.searchsorted(shapes, align(bucket.prompt_len))]
        n = len(bucket)
        order = np.lexsort((np.arange(n), bucket.gen_len, shape_of))
        batch_of = np.empty(n, dtype=np.int64)
        shape_out: list[np.ndarray] = []
        base = 0
        for s in np.unique(shape_of).tolist():
            members = order[shape_of[order] == s]
            _, batch = optimal_runs(bucket.gen_len[members], int(s), problem.params, problem.max_batch_size)
            batch_of[members] = base + batch
            nb = int(batch.max()) + 1
            shape_out.append(np.full(nb, s, dtype=np.int64))
            base += nb
        out.append(Batching(batch_of, np.concatenate(shape_out) if shape_out else np.zeros(0, np.int64)))
    return tuple(out)


def improve_shapes(problem: Problem, shapes: np.ndarray, candidates: np.ndarray, deadline: float) -> np.ndarray:
    """Move one shape at a time to a neighbouring candidate while the exact total drops (until the deadline).

    The largest shape stays (it must cover the longest prompt).  Each bucket's
    requests run on the smallest shape covering them, so a shape's cost depends only
    on it and the shape below it: interval costs are cached, and a move re-batches the
    two intervals it changes.
    """
    shapes = np.asarray(sorted(set(int(s) for s in shapes)), dtype=np.int64)
    aligned = [align(b.prompt_len) for b in problem.buckets]
    gens = [b.gen_len for b in problem.buckets]
    cache: dict[tuple[int, int], float] = {}

    def interval(lo: int, hi: int) -> float:
        """Exact cost of the requests with aligned prompt in (lo, hi] run at hi, over every bucket."""
        if (lo, hi) not in cache:
            cost = 0.0
            for a, g in zip(aligned, gens, strict=True):
                sel = (a > lo) & (a <= hi)
                if sel.any():
                    cost += shape_cost(problem, {hi: np.sort(g[sel])}, hi)
            cache[(lo, hi)] = cost
        return cache[(lo, hi)]

    def total(sh: np.ndarray) -> float:
        lows = np.r_[0, sh[:-1]]
        return sum(interval(int(lo), int(hi)) for lo, hi in zip(lows, sh, strict=True))

    current = total(shapes)
    improved = True
    while improved and time.perf_counter() < deadline:
        improved = False
        for k in range(len(shapes) - 1):
            pos = int(np.searchsorted(candidates, shapes[k]))
            for step in (-1, 1):
                q = pos + step
                if q < 0 or q >= len(candidates) or time.perf_counter() > deadline:
                    continue
                trial = np.sort(np.r_[np.delete(shapes, k), candidates[q]])
                if len(np.unique(trial)) < len(trial):
                    continue
                cost = total(trial)
                if cost < current * (1 - 1e-12):
                    shapes, current, improved = trial, cost, True
                    break
    log.info("device mode: shape local search ends at %.6e ms with shapes %s", current, list(shapes))
    return shapes


def device_start(problem: Problem, packed: tuple[Batching, ...] | None, deadline: float) -> tuple[Batching, ...] | None:
    """The planner's start in device mode: a packer's shapes improved by local search, batched exactly."""
    if packed is None:
        return None
    shapes = np.unique(np.concatenate([bt.shape_of for bt in packed]))
    candidates = np.unique(np.concatenate([align(b.prompt_len) for b in problem.buckets]))
    if problem.max_seq_len is not None:
        candidates = candidates[candidates <= problem.max_seq_len]
    return runs_batching(problem, improve_shapes(problem, shapes, candidates, deadline))
