"""Tiny windowed problems solved exactly: every plan listed, cheapest first, judged until one meets every limit.

The windowed planner's decomposition (one shape set, then every window on its own under
per-window shares of the limits) is a heuristic: the limits bind the whole bucket, not each
window, and the per-window MIP does not see the members' waits.  With a handful of requests
the whole windowed problem is small enough to enumerate instead:

1. Per bucket, every layout: each window's requests partitioned into batches (a batch never
   spans two windows), each batch declared at a candidate shape covering it (within the
   batch-size cap and the KV capacity), at most K distinct shapes.  A layout's cost is its
   batches' costs plus one compile per shape it declares -- where the spikes land changes
   latency, never cost -- so the layouts are sorted by cost before any is judged.
2. The buckets' sorted lists are merged lazily, cheapest combination first, skipping those
   over the joint shape cap; each bucket's layout is judged exactly (the judge's expansion
   places every spike where it meets the P95 and sequential limits if any placement does:
   ``model.expand.spikes``), and the first combination whose layouts all meet their limits is
   the optimum.

Why it is a proof.  The candidates are the entry shapes (each request's smallest usable
shape): a batch declared at any other shape, lowered together with every batch at that shape
to the largest entry shape below it, costs no more, has no longer latency and no more pad,
and its spike moves with it (or merges with that shape's own), so some optimum declares entry
shapes only.  Visited cheapest first, the first combination meeting every limit is optimal,
and its cost is a certified bound (gap 0); when every layout of a bucket has been judged and
none meets its limits, no plan does (a proof of infeasibility).  Beyond ``MAX_REQUESTS``
requests or ``MAX_LAYOUTS`` layouts in a bucket, or once its deadline passes, it gives up
(None) and the windowed heuristics plan.
"""

from __future__ import annotations

import heapq
import itertools
import logging
from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np

from model.base.runtime import Deadline
from model.domain.schema import Batching, Bucket, Problem
from model.domain.windowing import windows_of
from model.planning.contract import Judge, Judged
from model.planning.window_runs import entry_shapes

log = logging.getLogger("shapeplan")

MAX_REQUESTS = 9  # over every bucket: Bell(9) = 21147 partitions of one window, before shapes
MAX_LAYOUTS = 20_000  # per bucket: listing and sorting them takes well under a second
MAX_COMBINATIONS = 200_000  # of several buckets' layouts visited in the merge before it gives up


class TooBig(Exception):
    """The exact enumeration would not fit its budget (layouts, combinations or time): no claim is made."""


@dataclass(frozen=True, eq=False)
class Layout:
    """One bucket's plan up to batch numbering: its batches (rows of the bucket) and their declared shapes."""

    cost: float
    blocks: tuple[tuple[int, ...], ...]
    shapes: tuple[int, ...]

    def batching(self, n: int) -> Batching:
        """The layout as a Batching of a bucket of n requests."""
        batch_of = np.full(n, -1, dtype=np.int64)
        for k, blk in enumerate(self.blocks):
            batch_of[list(blk)] = k
        return Batching(batch_of, np.asarray(self.shapes, dtype=np.int64))


@dataclass(frozen=True, eq=False)
class Exact:
    """The enumeration's answer: the optimum judged (None: proven, no plan meets every limit), its cost (the
    certified bound; inf when none exists), each bucket's own least acceptable cost, and layouts listed."""

    judged: Judged | None
    optimum: float
    bucket_bounds: tuple[float, ...]
    layouts: int


def set_partitions(items: list[int]) -> Iterator[list[list[int]]]:
    """Every partition of ``items`` into non-empty blocks (Bell(n) of them)."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for part in set_partitions(rest):
        yield [[first], *part]
        for i in range(len(part)):
            yield [*part[:i], [first, *part[i]], *part[i + 1:]]


def window_partitions(wins: np.ndarray) -> Iterator[list[list[int]]]:
    """Every batching of a bucket's rows that keeps each batch inside one window: the product over its windows
    of each window's set partitions."""
    groups = [np.flatnonzero(wins == w).tolist() for w in np.unique(wins).tolist()]
    for parts in itertools.product(*(list(set_partitions(g)) for g in groups)):
        yield [blk for part in parts for blk in part]


def shape_choices(options: list[list[int]], k: int, used: tuple[int, ...] = ()) -> Iterator[tuple[int, ...]]:
    """Every choice of one option per block with at most k distinct values, pruned as it goes."""
    if not options:
        yield ()
        return
    for v in options[0]:
        now = used if v in used else (*used, v)
        if len(now) <= k:
            for rest in shape_choices(options[1:], k, now):
                yield (v, *rest)


def batch_cost(problem: Problem, bucket: Bucket, rows: list[int], shape: int) -> float:
    """One batch's cost at ``shape``, compile aside (the cost model's own batch arithmetic)."""
    cm = problem.cost
    prompt, gen = bucket.prompt_len[rows], bucket.gen_len[rows]
    codes, shape_of = np.zeros(len(rows), dtype=np.int64), np.array([shape], dtype=np.int64)
    S, s_max, g_max = cm.batch_extents(prompt, gen, codes, shape_of)
    pre, dec, over, _ = cm.batch_costs(np.array([len(rows)]), shape_of, s_max, g_max, cm.prefill_total(S))
    return float(pre + dec + over)


def bucket_layouts(problem: Problem, i: int, cands: np.ndarray, deadline: Deadline) -> list[Layout]:
    """Every layout of bucket i (see the module docstring), cheapest first; TooBig past the budget or deadline."""
    bucket = problem.buckets[i]
    wins, S, G = windows_of(problem, bucket), entry_shapes(problem, bucket), bucket.gen_len
    cap = problem.max_batch_size
    priced: dict[tuple[tuple[int, ...], int], float] = {}
    charge = {int(c): float(problem.cost.shape_charge(c)) for c in cands}
    out: list[Layout] = []
    for part in window_partitions(wins):
        if cap is not None and max(len(blk) for blk in part) > cap:
            continue
        blocks = tuple(tuple(blk) for blk in part)
        options = [[int(c) for c in cands if c >= S[list(blk)].max()
                    and bool(problem.cost.batch_fits(len(blk), int(c), int(G[list(blk)].max())))] for blk in blocks]
        for shapes in shape_choices(options, problem.max_shapes):
            total = 0.0
            for blk, s in zip(blocks, shapes, strict=True):
                if (blk, s) not in priced:
                    priced[(blk, s)] = batch_cost(problem, bucket, list(blk), s)
                total += priced[(blk, s)]
            out.append(Layout(total + sum(charge[s] for s in set(shapes)), blocks, shapes))
            if len(out) > MAX_LAYOUTS:
                raise TooBig(f"bucket {bucket.name}: over {MAX_LAYOUTS} layouts")
        if deadline.expired():
            raise TooBig("the deadline passed while listing layouts")
    out.sort(key=lambda lay: lay.cost)
    return out


class BucketJudge:
    """Whether a bucket's layout meets every limit of its bucket, judged exactly once per layout."""

    def __init__(self, problem: Problem, judge: Judge, i: int, layouts: list[Layout]) -> None:
        self.sub = replace(problem, buckets=(problem.buckets[i],), limits=(problem.limits[i],))
        self.judge, self.layouts, self.n = judge, layouts, len(problem.buckets[i])
        self.seen: dict[int, bool] = {}

    def ok(self, j: int) -> bool:
        if j not in self.seen:
            self.seen[j] = self.judge(self.sub, "exact", (self.layouts[j].batching(self.n),)).acceptable
        return self.seen[j]

    def first_ok(self, upto: int | None = None, deadline: Deadline = Deadline.never()) -> int | None:
        """The cheapest acceptable layout's index (among the first ``upto``), None if there is none."""
        for j in range(len(self.layouts) if upto is None else upto):
            if deadline.expired():
                raise TooBig("the deadline passed while judging layouts")
            if self.ok(j):
                return j
        return None


def cheapest_combination(problem: Problem, layouts: list[list[Layout]], judges: list[BucketJudge],
                         deadline: Deadline) -> tuple[int, ...] | None:
    """The cheapest combination of the buckets' layouts within the joint shape cap whose layouts all meet their
    limits (a lazy merge of the sorted lists), or None when no combination does."""
    start = (0,) * len(layouts)
    heap = [(sum(lays[0].cost for lays in layouts), start)]
    seen = {start}
    visited = 0
    while heap:
        visited += 1
        if visited > MAX_COMBINATIONS or deadline.expired():
            raise TooBig("too many combinations of the buckets' layouts")
        _, idx = heapq.heappop(heap)
        shapes = set().union(*(set(lays[j].shapes) for lays, j in zip(layouts, idx, strict=True)))
        if len(shapes) <= problem.max_shapes and all(jb.ok(j) for jb, j in zip(judges, idx, strict=True)):
            return idx
        for i in range(len(idx)):
            nxt = (*idx[:i], idx[i] + 1, *idx[i + 1:])
            if nxt[i] < len(layouts[i]) and nxt not in seen:
                seen.add(nxt)
                heapq.heappush(heap, (sum(lays[j].cost for lays, j in zip(layouts, nxt, strict=True)), nxt))
    return None


def exact_plan(problem: Problem, judge: Judge, cands: np.ndarray, deadline: Deadline) -> Exact | None:
    """The windowed problem solved exactly by enumeration (module docstring), or None when it is too big for
    that or the deadline passes first."""
    if sum(len(b) for b in problem.buckets) > MAX_REQUESTS:
        return None
    try:
        layouts = [bucket_layouts(problem, i, cands, deadline) for i in range(len(problem.buckets))]
        judges = [BucketJudge(problem, judge, i, lays) for i, lays in enumerate(layouts)]
        listed = sum(len(lays) for lays in layouts)
        # a bucket none of whose layouts meets its limits proves the problem infeasible, without a merge
        if any(not lays for lays in layouts) or any(jb.first_ok(deadline=deadline) is None for jb in judges):
            return Exact(None, np.inf, tuple(np.inf for _ in layouts), listed)
        idx = cheapest_combination(problem, layouts, judges, deadline)
        if idx is None:
            return Exact(None, np.inf, tuple(np.inf for _ in layouts), listed)
        own = tuple(layouts[i][jb.first_ok(j + 1, deadline)].cost for i, (jb, j) in enumerate(zip(judges, idx,
                                                                                                  strict=True)))
    except TooBig as why:
        log.info("windows: no exact enumeration (%s)", why)
        return None
    chosen = tuple(layouts[i][j] for i, j in enumerate(idx))
    judged = judge(problem, "exact", tuple(lay.batching(len(b)) for lay, b in zip(chosen, problem.buckets,
                                                                                 strict=True)))
    optimum = sum(lay.cost for lay in chosen)
    if not judged.acceptable or not np.isclose(judged.cost, optimum, rtol=1e-9, atol=0.0):
        # the listing's arithmetic and the evaluator's disagree: claim nothing
        log.info("windows: the exact enumeration's optimum %.9g is judged at %.9g (%s): not used", optimum,
                 judged.cost, "acceptable" if judged.acceptable else "broken")
        return None
    return Exact(judged, optimum, own, listed)
