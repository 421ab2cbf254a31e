"""Expansion: turn a batching (who rides with whom, at which shape) into a concrete plan.

Batch ids matter: each shape's compile spike (+1500 ms) lands on the first member,
in plan-file order, of the batch whose id sorts first as a string among that
shape's batches.  We choose ids and member order so that it lands where it hurts
least (``model.expand.spikes``): on a member it does not push over the P95 limit,
where it raises its batch's largest latency (the sequential-time contribution) the
least -- trading the two off exactly when both limits are set.

With arrival windows a member's latency includes its wait to its window's end (so the
spike is placed by the latency the evaluator judges), ids carry the window
(``s<seq_align>-<k>-w<window>``) and the plan lists windows in order.
"""

from __future__ import annotations

import numpy as np

from model.cost.analytic import CostParams
from model.cost.common import Mode, align
from model.cost.metrics import Coefficients, batch_latencies, spike_ms
from model.expand.spikes import spike_leads
from model.schema import Batching, Bucket, Limits, Plan, Problem
from model.windows.split import waits_of, windows_of


def batch_extents(bucket: Bucket, batching: Batching, mode: Mode) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-record effective prompt length and per-batch (S_max, G_max) under the cost mode."""
    nb = len(batching.shape_of)
    S = batching.shape_of[batching.batch_of] if mode != "reference" else align(bucket.prompt_len)
    s_max = np.zeros(nb, dtype=np.int64)
    g_max = np.zeros(nb, dtype=np.int64)
    np.maximum.at(s_max, batching.batch_of, S)
    np.maximum.at(g_max, batching.batch_of, bucket.gen_len)
    return S, s_max, g_max


def assemble(bucket: Bucket, batching: Batching, params: Coefficients = CostParams(), mode: Mode = "reference",
             limits: Limits = Limits(), wait_ms: np.ndarray | None = None, windows: np.ndarray | None = None) -> Plan:
    """A plan with spike-aware batch ids (``s<seq_align>-<k>``, zero-padded) and member order.

    ``wait_ms`` and ``windows`` (per request, file order) describe arrival windows: the
    waits count in the latencies the spike is placed by, and each id ends in ``-w<window>``.
    """
    codes = np.asarray(batching.batch_of, dtype=np.int64)
    shape_of = np.asarray(batching.shape_of, dtype=np.int64)
    nb = len(shape_of)
    latency = batch_latencies(bucket.prompt_len, bucket.gen_len, codes, shape_of, params, mode)[0]
    if wait_ms is not None:
        latency = latency + np.asarray(wait_ms, dtype=np.float64)
    # per shape, the member that takes the spike (``model.expand.spikes``) leads the batch that ranks 0;
    # every other batch leads with its gentlest member, the one with the least latency
    lead, takes = spike_leads(codes, shape_of, latency, spike_ms(params), limits)
    first_lat = latency[lead]
    batch_max = np.full(nb, -np.inf)
    np.maximum.at(batch_max, codes, latency)
    spiked = first_lat + spike_ms(params)
    seq_hurt = np.maximum(0.0, spiked - batch_max)
    limit = limits.max_p95_latency_ms
    crosses = (first_lat <= limit) & (spiked > limit) if limit is not None else np.zeros(nb, bool)
    # per shape, the batch that takes the spike ranks 0; the rest keep their order
    pick_order = np.lexsort((np.arange(nb), first_lat, seq_hurt, crosses, ~takes, shape_of))
    shapes_sorted = shape_of[pick_order]
    head = np.r_[True, shapes_sorted[1:] != shapes_sorted[:-1]]
    rank = np.empty(nb, dtype=np.int64)
    group_start = np.maximum.accumulate(np.where(head, np.arange(nb), 0))
    not_lead = np.ones(len(codes), dtype=bool)
    not_lead[lead] = False
    order = np.lexsort((np.arange(len(codes)), latency, not_lead, codes))
    if windows is None:
        rank[pick_order] = np.arange(nb) - group_start
        width = len(str(max(int(rank.max()), 0))) if nb else 1
        ids = np.array([f"s{s}-{r:0{width}d}" for s, r in zip(shape_of.tolist(), rank.tolist(), strict=True)],
                       dtype=object)
        batch_order = np.lexsort((rank, shape_of))
    else:
        # the spike's batch keeps rank 0 of its shape; the others follow window by window
        win = np.zeros(nb, dtype=np.int64)
        win[codes] = np.asarray(windows, dtype=np.int64)
        spiked_batch = np.zeros(nb, dtype=bool)
        spiked_batch[pick_order[head]] = True
        order2 = np.lexsort((np.arange(nb), win, ~spiked_batch, shape_of))
        start2 = np.maximum.accumulate(np.where(np.r_[True, shape_of[order2][1:] != shape_of[order2][:-1]],
                                                np.arange(nb), 0)) if nb else np.zeros(0, np.int64)
        rank[order2] = np.arange(nb) - start2
        width = len(str(max(int(rank.max()), 0))) if nb else 1
        wwidth = len(str(max(int(win.max()), 0))) if nb else 1
        ids = np.array([f"s{s}-{r:0{width}d}-w{w:0{wwidth}d}" for s, r, w in
                        zip(shape_of.tolist(), rank.tolist(), win.tolist(), strict=True)], dtype=object)
        batch_order = np.lexsort((rank, shape_of, win))
    pos = np.empty(nb, dtype=np.int64)
    pos[batch_order] = np.arange(nb)
    member_rank = np.empty(len(codes), dtype=np.int64)
    member_rank[order] = np.arange(len(codes))
    rec = np.lexsort((member_rank, pos[codes]))
    return Plan(request_ids=bucket.request_ids[rec], batch_ids=ids[codes[rec]],
                seq_align=shape_of[codes[rec]], source=f"<plan {bucket.name}>", rows=rec)


def assemble_all(problem: Problem, batchings: tuple[Batching, ...]) -> tuple[Plan, ...]:
    """Every bucket's batching as a plan (with the problem's arrival windows, if any)."""
    return tuple(assemble(b, bt, problem.params, problem.mode, lim, waits_of(problem, b),
                          windows_of(problem, b) if problem.windowing is not None else None)
                 for b, bt, lim in zip(problem.buckets, batchings, problem.limits, strict=True))


def box_of_requests(cell_of: np.ndarray, arc_box: np.ndarray, arc_cell: np.ndarray, count: np.ndarray) -> np.ndarray:
    """The box each request rides in, from a solution given as request counts per (cell, box).

    Requests sorted by cell (file order within) are dealt to the arcs sorted by (cell,
    box): the cumulative arc counts line up with the cell boundaries, so one
    searchsorted places every request.
    """
    n_cells = int(cell_of.max()) + 1
    if (np.bincount(arc_cell, weights=count, minlength=n_cells) != np.bincount(cell_of, minlength=n_cells)).any():
        raise RuntimeError("solution does not plan every request exactly once")
    order = np.argsort(cell_of, kind="stable")
    arcs = np.lexsort((arc_box, arc_cell))
    cum = np.cumsum(count[arcs])
    box_of = np.empty(len(cell_of), np.int64)
    box_of[order] = arc_box[arcs][np.searchsorted(cum, np.arange(len(cell_of)), side="right")]
    return box_of
