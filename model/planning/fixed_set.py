"""Device mode: what a FIXED shape set allows -- the bound on every plan of a bucket on given shapes, and how far a
plan's batching is from it.

Two certified bounds exist for one bucket's batches on a shape set (compiles aside): the rider chain's
(``model.planning.rider_chain``: a second or less, within 0.1 % of the LP on the embedded default's chat
bucket) and the set-partitioning LP's by column generation (``model.planning.shape_lp``: the LP optimum
when it converges, a minute on that bucket).  Both are Lagrangian bounds, so the larger holds: the chain
runs first and the LP gets what time is left, so a short deadline still leaves a bound.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from model.base.runtime import Deadline, check_interrupt
from model.cost.common import align, allowed_above
from model.domain.shapeset import usable
from model.planning.reshape import batch_needs
from model.planning.rider_chain import MU_BISECTIONS, ChainBound, chain_bound
from model.planning.shape_lp import ShapeLP, shape_lp

FIXED_SET_MAX_ENTRIES = 2_000_000  # (requests x allowed shapes) beyond which the fixed-set bound is not tried
FIXED_SET_SHARE = 0.5  # of the time left after the search, at most


@dataclass(frozen=True)
class SetBound:
    """One bucket's bounds on a shape set: the rider chain's and the LP's (either -inf where the deadline left it
    nothing); ``bound`` is the larger, ``exact`` whether it is the LP optimum."""

    chain: ChainBound
    lp: ShapeLP

    @property
    def bound(self) -> float:
        return max(self.chain.bound, self.lp.bound)

    @property
    def exact(self) -> bool:
        return self.lp.converged and self.lp.bound >= self.chain.bound


NO_LP = ShapeLP(-np.inf, False, 0, 0)  # the LP not run


def set_bound(cost, S: np.ndarray, G: np.ndarray, shapes, limit: float | None, max_batch: int | None,
              start: list[tuple[int, np.ndarray]] = (), deadline: Deadline = Deadline.never(),
              backend: str = "highs", lp: bool = True, bisections: int = MU_BISECTIONS) -> SetBound:
    """Both bounds on the batches of any plan of these requests that declares only ``shapes`` and keeps the P95
    latency within ``limit``: the chain first, then (with ``lp``) the LP (``start`` its first boxes) until
    ``deadline``."""
    chain = chain_bound(cost, S, G, shapes, limit, max_batch, deadline, bisections=bisections)
    return SetBound(chain, shape_lp(cost, S, G, shapes, limit, max_batch, start, deadline, backend) if lp
                    else NO_LP)


@dataclass(frozen=True)
class BucketSplit:
    """One bucket of a plan: its shapes, what its batches cost (compiles aside), their compile charge, and the
    bound on the batches of any plan of the bucket on those shapes (``set_bound``)."""

    bucket: str
    shapes: tuple[int, ...]
    batches: float
    compiles: float
    on_shapes: SetBound


def batching_split(problem, batchings, deadline: Deadline = Deadline.never(), backend: str = "highs",
                   lp: bool = True, bisections: int = MU_BISECTIONS) -> tuple[BucketSplit, ...] | None:
    """Per bucket, how far the plan's batches are from the best its own shapes allow: the plan's batch cost
    beside ``set_bound`` at its shapes, its batches the LP's start.  Any plan that compiles the same shapes in
    every bucket costs at least the sum of the bounds plus the same compiles, so the difference between that and
    the plan is at most what better batching on these shapes could save, and the difference between that and
    the certified bound is what the bound does not charge or other shapes might save.  Device mode with a free
    batch only (None otherwise: a graph's compile and the windows' split are not modelled here); the deadline is
    shared equally by the buckets still to go; without ``lp`` the chain alone.

    Where the batches would not be free (windows: a batch never spans two), every bound still holds: the
    windows only take plans away."""
    cost = problem.cost
    if not (cost.shared_batch_time and cost.batch_buckets is None):
        return None
    out = []
    for b, (bucket, bt) in enumerate(zip(problem.buckets, batchings, strict=True)):
        S, G = align(bucket.prompt_len), np.asarray(bucket.gen_len, dtype=np.int64)
        nb = len(bt.shape_of)
        _, sizes, g_max = batch_needs(bucket, bt)
        batches = float(np.sum(cost.batch_total(sizes, bt.shape_of, g_max)))
        shapes = tuple(int(s) for s in np.unique(bt.shape_of))
        members = np.argsort(bt.batch_of, kind="stable")
        ends = np.cumsum(sizes)
        start = [(int(bt.shape_of[k]), members[ends[k] - sizes[k]:ends[k]]) for k in range(nb)]
        share = deadline.share(1.0 / (len(problem.buckets) - b))
        on_shapes = set_bound(cost, S, G, shapes, problem.limits[b].max_p95_latency_ms, problem.max_batch_size,
                              start, share, backend, lp, bisections)
        out.append(BucketSplit(bucket.name, shapes, batches, float(np.sum(cost.shape_charge(np.array(shapes)))),
                               on_shapes))
    return tuple(out)


def on_shapes_bound(problem, batchings, deadline: Deadline) -> float | None:
    """A certified lower bound on every plan that compiles the same shapes in every bucket as ``batchings``: the
    chain's bound per bucket on its own shapes plus their compiles (``batching_split`` without the LP, one round
    of bisections of its multiplier: 0.1 % lower on the embedded default than three, 0.3 s sooner); None
    outside device mode with a free batch or where the deadline left a bucket unpriced."""
    split = batching_split(problem, batchings, deadline, lp=False, bisections=1)
    if split is None or not all(np.isfinite(row.on_shapes.bound) for row in split):
        return None
    return float(sum(row.on_shapes.bound + row.compiles for row in split))


MAX_SUBSETS = 256  # subsets of the allowed shapes priced one by one at most (beyond: one compile per bucket)


def subsets_bound(cost, S: np.ndarray, G: np.ndarray, shapes: np.ndarray, limit: float | None, max_batch: int | None,
                  max_shapes: int, mu: float, deadline: Deadline) -> float:
    """One bucket's bound over the subsets U of the allowed ``shapes`` it may use (covering its longest prompt, at
    most ``max_shapes``): the least over them of the chain's certified bound on U at multiplier mu plus U's
    compiles (any plan of the bucket uses some such U and compiles each of its shapes); -inf where there are more
    than MAX_SUBSETS or ``deadline`` cut the enumeration."""
    from itertools import combinations

    from model.planning.rider_chain import certified, chain_duals
    from model.planning.shape_lp import all_boxes, cells_of

    top = int(S.max())
    subsets = [u for k in range(1, min(max_shapes, len(shapes)) + 1) for u in combinations(shapes.tolist(), k)
               if max(u) >= top]
    if len(subsets) > MAX_SUBSETS:
        return -np.inf
    allowed = allowed_above(len(S)) if limit is not None else None
    mu = mu if limit is not None else 0.0
    best = np.inf
    for u in subsets:
        check_interrupt()
        if deadline.expired():
            return -np.inf
        arr = np.asarray(u, dtype=np.int64)
        cells = cells_of(S, G, arr)
        boxes = all_boxes(cost, cells, arr, limit, max_batch)
        pi = chain_duals(cells, boxes, mu, deadline)  # cut short: the intervals left are priced 0 (still valid)
        if deadline.expired():
            return -np.inf  # ... but the least over the subsets needs every one of them priced
        value = certified(cells, boxes, pi, mu, allowed, len(S))
        best = min(best, value + float(np.sum(cost.shape_charge(arr))))
    return float(best)


def fixed_set_bound(problem, deadline: Deadline = Deadline.never(), backend: str = "highs") -> float:
    """With a fixed set of allowed shapes, a certified bound on every plan of the problem: per bucket the larger of
    (the better of the chain's and the LP's bound on every batch on the allowed shapes, ``set_bound``, its P95
    limit kept, plus one compile: every bucket compiles at least one shape) and the least over the subsets of the
    allowed shapes it may use of the chain's bound plus their compiles (``subsets_bound``, at the multiplier the
    first chain found); the shape cap across buckets is relaxed.  Device mode with a free batch only, and only
    where the LP's size (requests x allowed shapes) is modest; -inf where it does not apply or the deadline leaves
    nothing.  The LP runs only where the subsets could not all be priced.  Windows only restrict which batches
    exist, so the bound holds with them too."""
    cost = problem.cost
    shapes = usable(problem)
    if shapes is None or not (cost.shared_batch_time and cost.batch_buckets is None):
        return -np.inf
    if not len(shapes) or sum(len(b) for b in problem.buckets) * len(shapes) > FIXED_SET_MAX_ENTRIES:
        return -np.inf
    total = 0.0
    for b, bucket in enumerate(problem.buckets):
        S = align(bucket.prompt_len)
        if (S > shapes[-1]).any():
            return -np.inf  # no plan exists; the planner says so by its own proof
        G = np.asarray(bucket.gen_len, dtype=np.int64)
        limit = problem.limits[b].max_p95_latency_ms
        share = deadline.share(1.0 / (len(problem.buckets) - b))
        chain = chain_bound(cost, S, G, shapes, limit, problem.max_batch_size, share)
        subsets = subsets_bound(cost, S, G, shapes, limit, problem.max_batch_size, problem.max_shapes, chain.mu,
                                share.share(0.5))
        # the LP (a minute on the embedded default's chat bucket) only where the subsets could not be priced: on
        # every set it bounds one compile, which the subsets' compiles beat wherever a compile is dear
        lp = SetBound(chain, shape_lp(cost, S, G, shapes, limit, problem.max_batch_size, (), share, backend)
                      if not np.isfinite(subsets) else NO_LP)
        whole = lp.bound + float(np.min(cost.shape_charge(shapes)))
        if not np.isfinite(max(whole, subsets)):
            return -np.inf
        total += max(whole, subsets)
    return total
