"""greedy: start from ``cells`` and merge the cheapest neighbouring batches until the sequential-time limit holds.

What a hand-tuned static-batch server operator does (and what the workloads'
README calls "a simple greedy merge"): begin with no padding (one batch per
identical (aligned prompt, gen_len) cell, shapes capped as in ``cells``), then
repeatedly merge the pair of batches that adds the least cost per millisecond of
sequential time it saves, and stop as soon as the bucket's ``max_sequential_ms``
holds.  Without a sequential-time limit nothing needs merging and the cells plan is
returned as is; so it is in device mode, where a batch's time grows with its size, which
this merge's latency arithmetic (the analytic member latency) does not model (it read
the analytic coefficients off a device profile and crashed).

Candidate set: two batches may merge only if they are declared at the same capped
shape (so the shape count never changes) and are neighbours in one of two orders
of that shape's batches -- by (box prompt, box gen) or by (box gen, box prompt).
The first pairs cells of one prompt length with the next generation length, the
second pairs equal generation lengths across adjacent prompt lengths.  A merged
batch keeps the position of the lower-numbered partner in both orders.

A merge is taken only if
- the bucket's pad tokens stay within ``max_pad_ratio`` of its real tokens (or the
  merge adds no pad at all, e.g. in strict mode where prompt pad is fixed by the
  shape and may already break the limit), and
- the P95 cannot break: the members above ``max_p95_latency_ms``, plus one per
  shape that a compile spike could push over (members within 1500 ms below the
  limit), stay within what nearest-rank P95 lets lie above it, and
- the merged batch holds at most ``max_batch_size`` requests (such pairs are never
  candidates), and with arrival windows both batches come from the same window
  (neighbours are taken within a window).
Merging only ever raises pad tokens and member latencies, so a rejected merge can
never become acceptable later and is dropped.  The stopping test is conservative:
the estimated sequential time plus one 1500 ms compile spike per shape must meet
the limit (less a 1e-9 relative margin for float summation order), so the plan
meets it however ``expand.assemble`` places the spikes.

Costs and latencies come from ``model.cost`` (decode_cost, member_latency,
prefill_latency through member_latency) with the effective lengths of
``CostModel.batch_extents``, so strict mode (prefill and decode at the declared shape)
is handled by the same arithmetic.  Merges are kept in a heap and re-scored only
for the batches a merge touches: 800 requests take milliseconds, 20k a second or so.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from model.base.errors import InfeasibleError
from model.base.runtime import Deadline
from model.cost.analytic import CostParams, decode_cost, member_latency
from model.cost.common import allowed_above
from model.cost.model import CostModel
from model.domain.schema import Batching, Bucket, Limits, Problem
from model.domain.windowing import windows_of
from model.packers.per_cell import pack as pack_cells


def box_latency(s_box, g_box, p: CostParams):
    """A batch's largest member latency (its sequential time, spike aside): the member at S_box."""
    return member_latency(s_box, s_box, g_box, p)


def merge_score(n_a, s_a, g_a, n_b, s_b, g_b, p: CostParams):
    """(cost added, sequential ms saved) by merging two batches with boxes (s, g) and sizes n.

    Works on scalars and on arrays alike.  Prefill and compile costs do not change
    (same members, same shape); decode is paid by every member at the merged box,
    and one batch overhead disappears.
    """
    s, g = np.maximum(s_a, s_b), np.maximum(g_a, g_b)
    added = ((n_a + n_b) * decode_cost(s, g, p) - n_a * decode_cost(s_a, g_a, p)
             - n_b * decode_cost(s_b, g_b, p) - p.Kbatch_overhead_cost)
    saved = box_latency(s_a, g_a, p) + box_latency(s_b, g_b, p) - box_latency(s, g, p)
    return added, saved


@dataclass
class MergeState:
    """The evolving batches of one bucket during one greedy run (never shared between runs)."""

    n: np.ndarray  # members per batch
    s_box: np.ndarray  # largest effective prompt length (strict: the declared shape)
    g_box: np.ndarray  # largest gen_len
    shape: np.ndarray  # declared shape
    prompts: list[dict[int, int]]  # effective prompt length -> member count, per batch
    owner: np.ndarray  # batch a dead batch was merged into (itself while alive)
    version: np.ndarray  # bumped on every change, so stale heap entries are skipped
    prev: np.ndarray  # prev[o, b]: neighbour before b in order o (-1 none)
    next: np.ndarray  # next[o, b]: neighbour after b in order o (-1 none)
    window: np.ndarray  # arrival window of each batch (all 0 without windows)


def initial_state(bucket: Bucket, batching: Batching, cost: CostModel, windows: np.ndarray | None = None) -> MergeState:
    """Batches of the cells plan with their boxes and the two neighbour orders (within a window, when
    ``windows`` gives each request's arrival window)."""
    S, s_box, g_box = cost.batch_extents(bucket.prompt_len, bucket.gen_len, batching.batch_of, batching.shape_of)
    nb = len(batching.shape_of)
    shape = np.asarray(batching.shape_of, dtype=np.int64)
    window = np.zeros(nb, dtype=np.int64)
    if windows is not None:
        window[batching.batch_of] = windows
    prompts: list[dict[int, int]] = [{} for _ in range(nb)]
    for b, s in zip(batching.batch_of.tolist(), S.tolist(), strict=True):
        prompts[b][s] = prompts[b].get(s, 0) + 1
    ids = np.arange(nb)
    orders = [np.lexsort((ids, g_box, s_box, shape, window)), np.lexsort((ids, s_box, g_box, shape, window))]
    prev = np.full((len(orders), nb), -1, dtype=np.int64)
    nxt = np.full((len(orders), nb), -1, dtype=np.int64)
    for o, order in enumerate(orders):
        prev[o, order[1:]] = order[:-1]
        nxt[o, order[:-1]] = order[1:]
    return MergeState(np.bincount(batching.batch_of, minlength=nb), s_box, g_box, shape, prompts,
                      ids.copy(), np.zeros(nb, dtype=np.int64), prev, nxt, window)


def candidates(st: MergeState, pairs: list[tuple[int, int]], p: CostParams,
               max_batch_size: int | None) -> list[tuple]:
    """Heap entries (cost per ms saved, a, b, versions, ms saved) for the pairs that may and should merge.

    Scored in one vectorised call, because per-pair scalar calls into the cost model
    dominate the run time otherwise.
    """
    ab = np.array([(min(x, y), max(x, y)) for x, y in pairs if x >= 0 and y >= 0], dtype=np.int64).reshape(-1, 2)
    a, b = ab[:, 0], ab[:, 1]
    keep = (st.shape[a] == st.shape[b]) & (st.window[a] == st.window[b])
    if max_batch_size is not None:
        keep &= st.n[a] + st.n[b] <= max_batch_size
    a, b = a[keep], b[keep]
    added, saved = merge_score(st.n[a], st.s_box[a], st.g_box[a], st.n[b], st.s_box[b], st.g_box[b], p)
    return [(float(c / s), int(x), int(y), int(st.version[x]), int(st.version[y]), float(s))
            for c, s, x, y in zip(added, saved, a, b, strict=True) if s > 0]


def zones(prompts: dict[int, int], s_box: int, g_box: int, limit: float | None, p: CostParams) -> np.ndarray:
    """[members above the P95 limit, members a compile spike could push above it] of one batch.

    Spikes aside; "at risk" means within ``Tshape_compile_ms`` below the limit.
    """
    if limit is None:
        return np.zeros(2, dtype=np.int64)
    lengths = np.fromiter(prompts, dtype=np.int64, count=len(prompts))
    counts = np.fromiter(prompts.values(), dtype=np.int64, count=len(prompts))
    latency = member_latency(lengths, s_box, g_box, p)
    return np.array([counts[latency > limit].sum(),
                     counts[(latency > limit - p.Tshape_compile_ms) & (latency <= limit)].sum()], dtype=np.int64)


def worst_above(zone_total: np.ndarray, n_shapes: int) -> int:
    """Most members that can end above the P95 limit once spikes land: each shape's one spike may
    push one at-risk member over (``expand.assemble`` tries not to, but this bound holds regardless)."""
    return int(zone_total[0] + min(n_shapes, zone_total[1]))


def unlink(st: MergeState, j: int) -> list[tuple[int, int]]:
    """Remove batch j from both orders; return the pairs that became neighbours."""
    joined = []
    for o in range(st.prev.shape[0]):
        before, after = st.prev[o, j], st.next[o, j]
        if before >= 0:
            st.next[o, before] = after
        if after >= 0:
            st.prev[o, after] = before
        joined.append((int(before), int(after)))
    return joined


def merged_prompts(x: dict[int, int], y: dict[int, int]) -> dict[int, int]:
    """Member counts per effective prompt length of two batches together."""
    out = dict(x)
    for length, count in y.items():
        out[length] = out.get(length, 0) + count
    return out


def apply_merge(st: MergeState, a: int, b: int, prompts: dict[int, int]) -> list[tuple[int, int]]:
    """Fold batch b into batch a; return the pairs whose neighbourhood changed and need scoring."""
    st.n[a], st.prompts[a] = st.n[a] + st.n[b], prompts
    st.s_box[a], st.g_box[a] = max(st.s_box[a], st.s_box[b]), max(st.g_box[a], st.g_box[b])
    st.owner[b] = a
    st.version[a] += 1
    rejoined = unlink(st, b)
    return [*rejoined, *((a, int(x)) for x in st.prev[:, a]), *((a, int(x)) for x in st.next[:, a])]


def merge(bucket: Bucket, batching: Batching, limits: Limits, problem: Problem,
          deadline: Deadline = Deadline.never()) -> Batching:
    """The greedy merge of one bucket's cells plan (see the module docstring).

    Raises DeadlineExceeded if ``deadline`` passes first (checked every 1024 merges).
    """
    p = problem.cost.params
    if limits.max_sequential_ms is None or len(batching.shape_of) == 0 or problem.cost.shared_batch_time:
        return batching
    st = initial_state(bucket, batching, problem.cost,
                       windows_of(problem, bucket) if problem.windowing is not None else None)
    n_shapes = len(np.unique(st.shape))
    # room for one spike per shape, and a 1e-9 relative margin for float summation order
    target = limits.max_sequential_ms * (1 - 1e-9) - n_shapes * p.Tshape_compile_ms
    seq = float(box_latency(st.s_box, st.g_box, p).sum())
    S, _, _ = problem.cost.batch_extents(bucket.prompt_len, bucket.gen_len, batching.batch_of, batching.shape_of)
    pad = int((S - bucket.prompt_len).sum() + (st.g_box[batching.batch_of] - bucket.gen_len).sum())
    real = int(bucket.prompt_len.sum() + bucket.gen_len.sum())
    pad_cap = limits.max_pad_ratio * real if limits.max_pad_ratio is not None else np.inf
    p95 = limits.max_p95_latency_ms
    zone = np.array([zones(d, s, g, p95, p)
                     for d, s, g in zip(st.prompts, st.s_box.tolist(), st.g_box.tolist(), strict=True)],
                    dtype=np.int64).reshape(-1, 2)
    zone_total = zone.sum(axis=0)
    budget = allowed_above(len(bucket))
    heap = candidates(st, [(b, int(nx)) for row in st.next for b, nx in enumerate(row)], p,
                      problem.max_batch_size)
    heapq.heapify(heap)
    rejected: set[str] = set()
    popped = 0
    while seq > target and heap:
        popped += 1
        if popped % 1024 == 0:
            deadline.tick("greedy warm start", "bucket %s: %d merges tried", bucket.name, popped)
        _, a, b, va, vb, saved = heapq.heappop(heap)
        if st.owner[a] != a or st.owner[b] != b or st.version[a] != va or st.version[b] != vb:
            continue
        s, g = max(st.s_box[a], st.s_box[b]), max(st.g_box[a], st.g_box[b])
        d_pad = int(st.n[a] * (g - st.g_box[a]) + st.n[b] * (g - st.g_box[b]))
        prompts = merged_prompts(st.prompts[a], st.prompts[b])
        new_zone = zones(prompts, int(s), int(g), p95, p)
        zone_after = zone_total - zone[a] - zone[b] + new_zone
        breaks = [name for name, bad in (("max_pad_ratio", pad + d_pad > pad_cap and d_pad > 0),
                                         ("max_p95_latency_ms", worst_above(zone_after, n_shapes) > budget)) if bad]
        if breaks:
            rejected.update(breaks)
            continue
        seq -= saved
        pad += d_pad
        zone_total, zone[a], zone[b] = zone_after, new_zone, 0
        for c in candidates(st, apply_merge(st, a, b, prompts), p, problem.max_batch_size):
            heapq.heappush(heap, c)
    if seq > target:
        raise InfeasibleError(
            f"greedy: bucket {bucket.name}: max_sequential_ms {limits.max_sequential_ms:g} cannot be met: "
            f"merging stops at {seq + n_shapes * p.Tshape_compile_ms:.6g} ms (spikes included); "
            f"further merges would break {', '.join(sorted(rejected)) or 'nothing: no neighbours left'}")
    return relabel(st, batching)


def relabel(st: MergeState, batching: Batching) -> Batching:
    """The merged batches numbered 0..nb-1 in (shape, box prompt, box gen) order."""
    root = st.owner.copy()
    while (root[root] != root).any():
        root = root[root]
    alive = np.flatnonzero(root == np.arange(len(root)))
    alive = alive[np.lexsort((alive, st.g_box[alive], st.s_box[alive], st.shape[alive]))]
    number = np.empty(len(root), dtype=np.int64)
    number[alive] = np.arange(len(alive))
    return Batching(batch_of=number[root[batching.batch_of]], shape_of=st.shape[alive])


def pack(problem: Problem, deadline: Deadline = Deadline.never()) -> tuple[Batching, ...]:
    """Greedy merge of every bucket's cells plan until its sequential-time limit holds."""
    return tuple(merge(b, bt, lim, problem, deadline)
                 for b, bt, lim in zip(problem.buckets, pack_cells(problem), problem.limits, strict=True))
