"""Expansion: turn a batching (who rides with whom, at which shape) into a concrete plan.

Batch ids matter: each shape's compile spike (+1500 ms) lands on the first member,
in plan-file order, of the batch whose id sorts first as a string among that
shape's batches.  We choose ids and member order so that it lands where it hurts
least (``model.expand.spikes``): on a member it does not push over the P95 limit,
where it raises its batch's largest latency (the sequential-time contribution) the
least -- trading the two off exactly when both limits are set.

With arrival windows a member's P95 latency includes its wait to its window's end, its
sequential time does not (the spike is placed by the latencies the evaluator judges each
limit by), ids carry the window
(``s<seq_align>-<k>-w<window>``) and the plan lists windows in order.
"""

from __future__ import annotations

import numpy as np

from model.cost.metrics import segment_max
from model.cost.model import CostModel, ReferenceCost
from model.domain.schema import Batching, Bucket, Limits, Plan, Problem
from model.domain.windowing import waits_of, windows_of
from model.expand.spikes import member_order, spike_leads


def assemble(bucket: Bucket, batching: Batching, cost: CostModel = ReferenceCost(),
             limits: Limits = Limits(), wait_ms: np.ndarray | None = None, windows: np.ndarray | None = None) -> Plan:
    """A plan with spike-aware batch ids (``s<seq_align>-<k>``, zero-padded) and member order.

    ``wait_ms`` and ``windows`` (per request, file order) describe arrival windows: the
    waits count in the latencies the spike is placed by, and each id ends in ``-w<window>``.
    """
    codes = np.asarray(batching.batch_of, dtype=np.int64)
    shape_of = np.asarray(batching.shape_of, dtype=np.int64)
    nb = len(shape_of)
    latency = cost.batch_latencies(bucket.prompt_len, bucket.gen_len, codes, shape_of)[0]
    wait = np.zeros(len(codes)) if wait_ms is None else np.asarray(wait_ms, dtype=np.float64)
    # per shape, the member that takes the spike (``model.expand.spikes``) leads the batch that ranks 0;
    # every other batch leads with its gentlest member, the one with the least latency
    by_batch = member_order(codes, latency)
    lead, takes = spike_leads(codes, shape_of, latency, cost.spike_ms, limits, order=by_batch, wait=wait)
    first_lat = latency[lead]
    batch_max = segment_max(np.asarray(latency, dtype=np.float64), codes, nb)
    seq_hurt = np.maximum(0.0, first_lat + cost.spike_ms - batch_max)  # sequential time: no waits
    limit = limits.max_p95_latency_ms
    waited = first_lat + wait[lead]  # P95: with the wait
    crosses = (waited <= limit) & (waited + cost.spike_ms > limit) if limit is not None else np.zeros(nb, bool)
    # per shape, the batch that takes the spike ranks 0; the rest keep their order
    rank = shape_ranks(shape_of, np.lexsort((np.arange(nb), first_lat, seq_hurt, crosses, ~takes, shape_of)))
    order = lead_first(by_batch, codes, lead)
    if windows is None:
        ids = ranked_ids(shape_of, rank)
        batch_order = np.lexsort((rank, shape_of))
    else:
        # the spike's batch keeps rank 0 of its shape; the others follow window by window
        win = np.zeros(nb, dtype=np.int64)
        win[codes] = np.asarray(windows, dtype=np.int64)
        rank = shape_ranks(shape_of, np.lexsort((np.arange(nb), win, rank != 0, shape_of)))
        ids = ranked_ids(shape_of, rank, win)
        batch_order = np.lexsort((rank, shape_of, win))
    rec = batches_in_order(order, codes, batch_order)
    return Plan(request_ids=bucket.request_ids[rec], batch_ids=ids[codes[rec]],
                seq_align=shape_of[codes[rec]], source=f"<plan {bucket.name}>", rows=rec)


def lead_first(order: np.ndarray, codes: np.ndarray, lead: np.ndarray) -> np.ndarray:
    """``order`` (records grouped by batch code 0..nb-1, ascending, every batch non-empty) with each batch's
    ``lead`` record moved to the front of its group, the others keeping their order: O(n), no sort."""
    n = len(order)
    starts, seg = _segments(codes[order])
    rank = np.arange(n) - starts[seg]
    where = np.empty(n, dtype=np.int64)
    where[order] = np.arange(n)
    lead_rank = where[lead] - starts  # group k holds code k
    is_lead = rank == lead_rank[seg]
    out = np.empty(n, dtype=np.int64)
    out[starts[seg] + np.where(is_lead, 0, rank + (rank < lead_rank[seg]))] = order
    return out


def batches_in_order(order: np.ndarray, codes: np.ndarray, batch_order: np.ndarray) -> np.ndarray:
    """The records of ``order`` (grouped by batch code, ascending) with the groups laid out in ``batch_order``,
    each group's records in the order they had: O(n), no sort."""
    n = len(order)
    starts, seg = _segments(codes[order])
    size = np.diff(np.r_[starts, n])
    new_start = np.empty(len(starts), dtype=np.int64)
    new_start[batch_order] = np.r_[0, np.cumsum(size[batch_order])[:-1]]
    out = np.empty(n, dtype=np.int64)
    out[new_start[seg] + np.arange(n) - starts[seg]] = order
    return out


def _segments(sorted_codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(start of each group, group of each position) of a sorted code array."""
    n = len(sorted_codes)
    starts = np.flatnonzero(np.r_[True, sorted_codes[1:] != sorted_codes[:-1]]) if n else np.zeros(0, np.int64)
    seg = np.repeat(np.arange(len(starts)), np.diff(np.r_[starts, n]))
    return starts, seg


def shape_ranks(shape_of: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Each batch's rank among the batches of its shape, taken in ``order`` (batch indices sorted by shape
    first): rank 0 is the batch whose id sorts first, so its first member takes the shape's compile spike."""
    nb = len(shape_of)
    s = shape_of[order]
    head = np.r_[True, s[1:] != s[:-1]] if nb else np.zeros(0, bool)
    rank = np.empty(nb, dtype=np.int64)
    rank[order] = np.arange(nb) - np.maximum.accumulate(np.where(head, np.arange(nb), 0))
    return rank


def ranked_ids(shape_of: np.ndarray, rank: np.ndarray, windows: np.ndarray | None = None) -> np.ndarray:
    """Batch ids ``s<seq_align>-<rank>`` (``-w<window>`` with arrival windows), numbers zero-padded so the ids
    sort as their ranks do."""
    width = len(str(max(int(rank.max(initial=0)), 0)))
    if windows is None:
        return np.array([f"s{s}-{r:0{width}d}" for s, r in zip(shape_of.tolist(), rank.tolist(), strict=True)],
                        dtype=object)
    wwidth = len(str(max(int(windows.max(initial=0)), 0)))
    return np.array([f"s{s}-{r:0{width}d}-w{w:0{wwidth}d}" for s, r, w in
                     zip(shape_of.tolist(), rank.tolist(), windows.tolist(), strict=True)], dtype=object)


def assemble_all(problem: Problem, batchings: tuple[Batching, ...]) -> tuple[Plan, ...]:
    """Every bucket's batching as a plan (with the problem's arrival windows, if any)."""
    return tuple(assemble(b, bt, problem.cost, lim, waits_of(problem, b),
                          windows_of(problem, b) if problem.windowing is not None else None)
                 for b, bt, lim in zip(problem.buckets, batchings, problem.limits, strict=True))
