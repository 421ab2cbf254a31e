"""A plan judged by the cost model: batches grouped, latencies (compile spike included), and metrics.

The evaluation rules of ``shared/cost_model.md`` -- spike placement, P95 rank,
sequential time, pad counting -- live here once, for every cost mode, and so do the
rules of arrival windows (``window_index``, ``window_wait_ms``): with windows a
member's latency also holds its wait from arrival to the end of its window (the
earliest its window's batches can start), added before the P95 rank is taken.
Sequential time stays the sum of the batches' largest member latencies WITHOUT the
waits: it is device time run back to back, and a wait occupies no device.  Cost is
unaffected by windows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from model.cost.analytic import (
    CostParams,
    compile_cost,
    decode_cost,
    decode_latency,
    prefill_cost,
    prefill_latency,
)
from model.cost.common import MODES, Mode, align, p95_rank
from model.cost.device import DeviceProfile, batch_breakdown, graph_batch, kv_tokens

Coefficients = CostParams | DeviceProfile  # analytic (reference, strict) or measured (device)
GRAPH_KEY_BITS = 32  # a graph's compile key: its shape shifted by this, or'ed with its batch dimension


def window_index(arrival_s, seconds: float, origin_s: float) -> np.ndarray:
    """The window of each arrival: ``floor((t - origin_s) / seconds)`` (origin = the earliest arrival of the
    whole problem, so windows line up across buckets)."""
    t = np.asarray(arrival_s, dtype=np.float64)
    return np.maximum(np.floor((t - origin_s) / seconds), 0).astype(np.int64)


def window_wait_ms(arrival_s, seconds: float, origin_s: float) -> np.ndarray:
    """Each request's wait (ms) from its arrival to the end of its window, the earliest its batch can start:
    ``(origin_s + (k + 1) * seconds - t) * 1000`` with k its window (in (0, seconds * 1000])."""
    t = np.asarray(arrival_s, dtype=np.float64)
    k = window_index(t, seconds, origin_s)
    return np.clip(((k + 1) * seconds - (t - origin_s)) * 1000.0, 0.0, seconds * 1000.0)


def spike_ms(p: Coefficients) -> float:
    """The compile spike a shape's first member takes: Tshape_compile_ms, or the profile's compile_ms."""
    return p.compile_ms if isinstance(p, DeviceProfile) else p.Tshape_compile_ms


def batch_buckets_of(p: Coefficients) -> tuple[int, ...] | None:
    """The compiled batch sizes the coefficients price with (None: the batch dimension is free)."""
    return p.batch_buckets if isinstance(p, DeviceProfile) else None


def compiled_batch(n, p: Coefficients) -> np.ndarray:
    """The batch dimension a batch of n members runs at: its graph's bucket, or n where the batch is free."""
    return graph_batch(n, batch_buckets_of(p))


def compile_keys(n_b, batch_shape, p: Coefficients) -> np.ndarray:
    """Per batch, what its compile is for -- the unit the compile charge and the compile spike are per: its
    declared shape, or with batch buckets its graph (B, s) as one integer (``key_shapes`` undoes it)."""
    shape = np.asarray(batch_shape, dtype=np.int64)
    if batch_buckets_of(p) is None:
        return shape
    return (shape << GRAPH_KEY_BITS) | compiled_batch(n_b, p)


def key_shapes(keys: np.ndarray, p: Coefficients) -> np.ndarray:
    """The declared shape of each compile key (``compile_keys``)."""
    keys = np.asarray(keys, dtype=np.int64)
    return keys >> GRAPH_KEY_BITS if batch_buckets_of(p) is not None else keys


def graphs_of(n_b, batch_shape, p: Coefficients) -> tuple[tuple[int, int], ...]:
    """The distinct graphs (B, s) a bucket's batches run, by shape then B: B the compiled batch with batch
    buckets; where the batch is free, each batch's own size (what a static-batch stack would compile)."""
    shape = np.asarray(batch_shape, dtype=np.int64)
    if not len(shape):
        return ()
    pairs = np.unique(np.stack([shape, compiled_batch(n_b, p)]), axis=1)
    return tuple((int(b), int(s)) for s, b in pairs.T.tolist())


def shape_charge(s, p: Coefficients) -> np.ndarray:
    """What compiling one distinct shape of length s costs a bucket (analytic cost, or device ms)."""
    if isinstance(p, DeviceProfile):
        return np.full(np.shape(s), p.compile_ms, dtype=np.float64)
    return compile_cost(s, p)


def fastest_latency(S, G, p: Coefficients, mode: Mode) -> np.ndarray:
    """The least latency a request of aligned prompt S and gen G can have.

    Analytic modes: alone in a batch at shape S (a larger batch, shape or gen only adds
    time).  Device mode: the same, or -- where the profile's decode_large regime has a
    cheaper step -- in the smallest batch that runs it (time grows with n within a regime).
    """
    if mode == "device":
        if p.batch_buckets is not None:  # the least of the graphs a batch may run in (decode_large may be cheaper)
            return np.min([batch_breakdown(np.full(np.shape(S), b, dtype=np.int64), S, G, p).total
                           for b in p.batch_buckets], axis=0)
        alone = batch_breakdown(np.ones(np.shape(S), dtype=np.int64), S, G, p).total
        if p.decode_large_from is None:
            return alone
        large = batch_breakdown(np.full(np.shape(S), p.decode_large_from, dtype=np.int64), S, G, p).total
        return np.minimum(alone, large)
    return prefill_latency(S, p) + decode_latency(S, G, p) + p.Tbatch_overhead_ms


def check_mode(p: Coefficients, mode: Mode) -> None:
    """Device mode prices with a DeviceProfile, the analytic modes with CostParams: never mixed."""
    if mode not in MODES:
        raise ValueError(f"unknown cost mode {mode!r}")
    if (mode == "device") != isinstance(p, DeviceProfile):
        raise ValueError(f"cost mode {mode!r} needs {'a DeviceProfile' if mode == 'device' else 'CostParams'}, "
                         f"got {type(p).__name__}")


@dataclass(frozen=True)
class Metrics:
    """One bucket's plan as the cost model judges it.

    In device mode every cost is in device milliseconds (prefill, decode, overhead
    and compile time of the batches), so ``cost`` equals the bucket's device time.
    """

    cost: float
    prefill_cost: float
    decode_cost: float
    overhead_cost: float
    compile_cost: float
    pad_tokens: int
    real_tokens: int
    pad_ratio: float
    p95_latency_ms: float
    sequential_ms: float
    n_requests: int
    n_batches: int
    shapes: tuple[int, ...]
    graphs: tuple[tuple[int, int], ...] = ()  # distinct (batch dimension, shape) pairs the plan runs (``graphs_of``)

    def value(self, name: str) -> float:
        """A limit-checked metric by its limit name (cost, pad_ratio, p95_latency_ms, sequential_ms)."""
        return float(getattr(self, name))


def batch_index(batch_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Batch code of each record (codes in order of first appearance) and the unique ids."""
    codes, uniques = pd.factorize(np.asarray(batch_ids, dtype=object), sort=False)
    return codes.astype(np.int64), np.asarray(uniques, dtype=object)


def segment_max(values: np.ndarray, codes: np.ndarray, nb: int) -> np.ndarray:
    """The largest value per code 0..nb-1 (a batch's longest gen, largest latency, ...).  One unbuffered
    ``ufunc.at`` pass: since numpy 2 it takes 0.02 s on 10^7 records, where sorting by code took 1.6 s."""
    out = np.full(nb, np.iinfo(np.int64).min if values.dtype.kind in "iu" else -np.inf, dtype=values.dtype)
    np.maximum.at(out, codes, values)
    return out


def spike_members(codes: np.ndarray, batch_ids: np.ndarray, batch_shape: np.ndarray) -> np.ndarray:
    """Record index that takes each shape's compile spike.

    For each distinct shape: the batch whose id sorts first AS A STRING among the
    batches using it, and that batch's first member in plan-file order.
    """
    first_member = np.unique(codes, return_index=True)[1]  # codes are 0..nb-1
    return first_member[spike_batches(batch_ids, batch_shape)]


def spike_batches(batch_ids: np.ndarray, batch_shape: np.ndarray) -> np.ndarray:
    """Index of the batch that takes each distinct shape's compile spike: the one whose id sorts first AS A
    STRING among the batches of that shape (its first member in plan-file order takes the spike)."""
    str_ids = np.asarray([str(b) for b in batch_ids], dtype=object)
    order = np.lexsort((str_ids.astype(str), batch_shape))
    shapes_sorted = batch_shape[order]
    return order[np.r_[True, shapes_sorted[1:] != shapes_sorted[:-1]]]


@dataclass(frozen=True, eq=False)
class _BatchView:
    """Per-record and per-batch arrays shared by every metric."""

    codes: np.ndarray
    batch_ids: np.ndarray
    S: np.ndarray  # per record: the length its prompt is processed (and padded) at
    s_max: np.ndarray  # per batch: the decode context start
    g_max: np.ndarray
    n_b: np.ndarray
    batch_shape: np.ndarray
    latency: np.ndarray  # per record, compile spike included


def batch_latencies(prompt_len, gen_len, codes: np.ndarray, shape_of: np.ndarray, p: Coefficients,
                    mode: Mode) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every member's latency before any compile spike, and the batch extents it follows from.

    ``codes`` numbers the batches 0..nb-1 per record, ``shape_of`` is each batch's
    declared seq_align.  Returns (latency per record, S per record, s_max and g_max
    per batch).  Reference mode prefills each member at its own aligned prompt and
    decodes at the members' (S_max, G_max); strict mode uses the declared shape for
    both; device mode gives every member its batch's device time T (the static batch
    returns together).  The one copy of this rule: expansion places spikes with it.
    """
    check_mode(p, mode)
    gen_len = np.asarray(gen_len, dtype=np.int64)
    shape_of = np.asarray(shape_of, dtype=np.int64)
    nb = len(shape_of)
    S = shape_of[codes] if mode != "reference" else align(np.asarray(prompt_len, dtype=np.int64))
    s_max = segment_max(S, codes, nb) if mode == "reference" else shape_of
    g_max = segment_max(gen_len, codes, nb)
    latency = latencies_given(S, codes, np.bincount(codes, minlength=nb), s_max, g_max, p, mode)
    return latency, S, s_max, g_max


def latencies_given(S: np.ndarray, codes: np.ndarray, n_b: np.ndarray, s_max: np.ndarray, g_max: np.ndarray,
                    p: Coefficients, mode: Mode) -> np.ndarray:
    """Each member's latency before any compile spike, given its processed prompt S, its batch code and the
    batches' extents (members, S_max, G_max): the rule of ``batch_latencies``, for callers (the partition-wise
    evaluator) that know the batch extents from elsewhere than the members at hand."""
    if mode == "device":
        return batch_breakdown(compiled_batch(n_b, p), s_max, g_max, p).total[codes]
    return prefill_latency(S, p) + decode_latency(s_max, g_max, p)[codes] + p.Tbatch_overhead_ms


def _batch_view(prompt_len, gen_len, batch_ids, seq_align, p: Coefficients, mode: Mode) -> _BatchView:
    """Group records into batches and compute every member's latency (spike included)."""
    seq_align = np.asarray(seq_align, dtype=np.int64)
    codes, uniques = batch_index(batch_ids)
    nb = len(uniques)
    batch_shape = seq_align[np.unique(codes, return_index=True)[1]]
    latency, S, s_max, g_max = batch_latencies(prompt_len, gen_len, codes, batch_shape, p, mode)
    n_b = np.bincount(codes, minlength=nb)
    latency[spike_members(codes, uniques, compile_keys(n_b, batch_shape, p))] += spike_ms(p)
    return _BatchView(codes, uniques, S, s_max, g_max, n_b, batch_shape, latency)


def batch_kv_tokens(batch_ids, gen_len, seq_align, p: Coefficients | None = None) -> tuple[np.ndarray, np.ndarray]:
    """KV tokens each batch holds at its last step (B * (s + G_max), B its batch dimension: its members, or
    its graph's bucket), and the batch ids."""
    codes, uniques = batch_index(batch_ids)
    nb = len(uniques)
    shape = np.asarray(seq_align, dtype=np.int64)[np.unique(codes, return_index=True)[1]]
    g_max = segment_max(np.asarray(gen_len, dtype=np.int64), codes, nb)
    n_b = np.bincount(codes, minlength=nb)
    return kv_tokens(n_b if p is None else compiled_batch(n_b, p), shape, g_max), uniques


def member_latencies(prompt_len, gen_len, batch_ids, seq_align, p: Coefficients = CostParams(),
                     mode: Mode = "reference", wait_ms: np.ndarray | None = None) -> np.ndarray:
    """Each record's latency (ms), compile spike included, records in plan-file order; with arrival windows
    ``wait_ms`` (per record) is each member's wait to its window's end, which its latency includes."""
    latency = _batch_view(prompt_len, gen_len, batch_ids, seq_align, p, mode).latency
    return latency if wait_ms is None else latency + np.asarray(wait_ms, dtype=np.float64)


def _costs(v: _BatchView, p: Coefficients, mode: Mode) -> tuple[float, float, float, float]:
    """(prefill, decode, overhead, compile) totals of a bucket's plan in the mode's unit."""
    prefill_total = None if mode == "device" else member_prefill_cost(v.S, p)
    return batch_costs(v.n_b, v.batch_shape, v.s_max, v.g_max, prefill_total, p, mode)


def member_prefill_cost(S: np.ndarray, p: CostParams, weight: np.ndarray | None = None) -> float:
    """Analytic modes: the prefill cost of members processed at S (sums over any split of the members add up);
    with ``weight``, S[i] stands for weight[i] members."""
    each = prefill_cost(S, p)
    return float(each.sum() if weight is None else (each * weight).sum())


def batch_costs(n_b: np.ndarray, batch_shape: np.ndarray, s_max: np.ndarray, g_max: np.ndarray,
                prefill_total: float | None, p: Coefficients, mode: Mode) -> tuple[float, float, float, float]:
    """(prefill, decode, overhead, compile) totals from the batches' extents; the analytic modes' prefill is
    charged per member, so it comes in as ``prefill_total`` (``member_prefill_cost``), None in device mode.
    The compile is charged once per distinct compile key (shape, or graph with batch buckets)."""
    units = np.unique(compile_keys(n_b, batch_shape, p))
    compile_total = float(shape_charge(key_shapes(units, p), p).sum())
    if mode == "device":
        parts = batch_breakdown(compiled_batch(n_b, p), batch_shape, g_max, p)
        return float(parts.prefill.sum()), float(parts.decode.sum()), float(parts.overhead.sum()), compile_total
    decode_total = float((n_b * decode_cost(s_max, g_max, p)).sum())
    return prefill_total, decode_total, float(p.Kbatch_overhead_cost * len(n_b)), compile_total


def p95_of_counts(values: np.ndarray, counts: np.ndarray) -> float:
    """The P95 latency (the rule of ``plan_metrics``: the ``p95_rank``-th smallest) of latencies given as exact
    value counts, e.g. merged from partitions; ``values`` need not be sorted or distinct."""
    order = np.argsort(values, kind="stable")
    cum = np.cumsum(np.asarray(counts, dtype=np.int64)[order])
    k = p95_rank(int(cum[-1]))
    return float(np.asarray(values, dtype=np.float64)[order][np.searchsorted(cum, k, side="right")])


def counted_metrics(latency: np.ndarray, counts: np.ndarray, worst: np.ndarray, n_b: np.ndarray,
                    batch_shape: np.ndarray, s_max: np.ndarray, g_max: np.ndarray, prefill_total: float | None,
                    pad: int, real: int, p: Coefficients, mode: Mode) -> Metrics:
    """Metrics from latencies given as counts (spikes included): ``counts[i]`` members have latency
    ``latency[i]``, and ``worst[b]`` is batch b's largest.  The rules of ``plan_metrics`` -- P95 rank,
    sequential time as the sum of the batches' largest latencies, costs from the batches' extents -- for
    callers that never hold one record per request (plans by cells, partitions merged)."""
    prefill, decode, overhead, compile_total = batch_costs(n_b, batch_shape, s_max, g_max, prefill_total, p, mode)
    return Metrics(cost=prefill + decode + overhead + compile_total, prefill_cost=prefill, decode_cost=decode,
                   overhead_cost=overhead, compile_cost=compile_total, pad_tokens=int(pad), real_tokens=int(real),
                   pad_ratio=pad / real, p95_latency_ms=p95_of_counts(latency, counts),
                   sequential_ms=float(worst.sum()), n_requests=int(np.asarray(counts).sum()),
                   n_batches=len(n_b), shapes=tuple(int(s) for s in np.unique(batch_shape)),
                   graphs=graphs_of(n_b, batch_shape, p))


def plan_metrics(prompt_len: np.ndarray, gen_len: np.ndarray, batch_ids: np.ndarray,
                 seq_align: np.ndarray, p: Coefficients = CostParams(), mode: Mode = "reference",
                 wait_ms: np.ndarray | None = None) -> Metrics:
    """Metrics of one bucket's plan, records given in plan-file order.

    ``wait_ms`` (arrival windows; per record, plan-file order) is each member's wait to
    its window's end: it is added to the member's latency for the P95, not to the
    sequential time or the cost (see the module docstring).
    """
    prompt_len = np.asarray(prompt_len, dtype=np.int64)
    gen_len = np.asarray(gen_len, dtype=np.int64)
    v = _batch_view(prompt_len, gen_len, batch_ids, seq_align, p, mode)
    prefill_total, decode_total, overhead_total, compile_total = _costs(v, p, mode)
    cost = prefill_total + decode_total + overhead_total + compile_total
    rows = compiled_batch(v.n_b, p) - v.n_b  # padding rows of each batch's graph (none where the batch is free)
    pad = int((v.S - prompt_len).sum() + (v.g_max[v.codes] - gen_len).sum() + (rows * (v.s_max + v.g_max)).sum())
    real = int(prompt_len.sum() + gen_len.sum())
    n = len(v.latency)
    k = p95_rank(n)
    waited = v.latency if wait_ms is None else v.latency + np.asarray(wait_ms, dtype=np.float64)
    p95 = float(np.partition(waited, k)[k])
    seq = float(segment_max(v.latency, v.codes, len(v.n_b)).sum())
    return Metrics(cost=cost, prefill_cost=prefill_total, decode_cost=decode_total,
                   overhead_cost=overhead_total, compile_cost=compile_total, pad_tokens=pad,
                   real_tokens=real, pad_ratio=pad / real, p95_latency_ms=p95, sequential_ms=seq,
                   n_requests=n, n_batches=len(v.n_b), shapes=tuple(int(s) for s in np.unique(v.batch_shape)),
                   graphs=graphs_of(v.n_b, v.batch_shape, p))
