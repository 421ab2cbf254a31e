"""A plan judged by the cost model: batches grouped, latencies (compile spike included), and metrics.

The evaluation rules of ``shared/cost_model.md`` -- spike placement, P95 rank,
sequential time, pad counting -- live here once, for every cost mode.
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


@dataclass(frozen=True)
class Metrics:
    """One bucket's plan as the reference model judges it."""

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

    def value(self, name: str) -> float:
        """A limit-checked metric by its limit name (cost, pad_ratio, p95_latency_ms, sequential_ms)."""
        return float(getattr(self, name))


def batch_index(batch_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Batch code of each record (codes in order of first appearance) and the unique ids."""
    codes, uniques = pd.factorize(np.asarray(batch_ids, dtype=object), sort=False)
    return codes.astype(np.int64), np.asarray(uniques, dtype=object)


def _segment_max(values: np.ndarray, codes: np.ndarray, nb: int) -> np.ndarray:
    out = np.full(nb, np.iinfo(np.int64).min if values.dtype.kind in "iu" else -np.inf, dtype=values.dtype)
    np.maximum.at(out, codes, values) if len(values) < 4096 else _sorted_max(out, values, codes)
    return out


def _sorted_max(out: np.ndarray, values: np.ndarray, codes: np.ndarray) -> None:
    order = np.argsort(codes, kind="stable")
    sc = codes[order]
    starts = np.flatnonzero(np.r_[True, sc[1:] != sc[:-1]])
    out[sc[starts]] = np.maximum.reduceat(values[order], starts)


def spike_members(codes: np.ndarray, batch_ids: np.ndarray, batch_shape: np.ndarray) -> np.ndarray:
    """Record index that takes each shape's compile spike.

    For each distinct shape: the batch whose id sorts first AS A STRING among the
    batches using it, and that batch's first member in plan-file order.
    """
    first_member = np.unique(codes, return_index=True)[1]  # codes are 0..nb-1
    str_ids = np.asarray([str(b) for b in batch_ids], dtype=object)
    order = np.lexsort((str_ids.astype(str), batch_shape))
    shapes_sorted = batch_shape[order]
    heads = order[np.r_[True, shapes_sorted[1:] != shapes_sorted[:-1]]]
    return first_member[heads]


@dataclass(frozen=True, eq=False)
class _BatchView:
    """Per-record and per-batch arrays shared by every metric."""

    codes: np.ndarray
    batch_ids: np.ndarray
    S: np.ndarray
    s_max: np.ndarray
    g_max: np.ndarray
    n_b: np.ndarray
    batch_shape: np.ndarray
    latency: np.ndarray


def _batch_view(prompt_len, gen_len, batch_ids, seq_align, p: CostParams, mode: Mode) -> _BatchView:
    """Group records into batches and compute every member's latency (spike included).

    Reference mode prefills each member at its own aligned prompt and decodes at the
    members' (S_max, G_max); strict mode uses the declared seq_align for both.
    """
    if mode not in MODES:
        raise ValueError(f"unknown cost mode {mode!r}")
    gen_len = np.asarray(gen_len, dtype=np.int64)
    seq_align = np.asarray(seq_align, dtype=np.int64)
    codes, uniques = batch_index(batch_ids)
    nb = len(uniques)
    S = seq_align if mode == "strict" else align(np.asarray(prompt_len, dtype=np.int64))
    s_max = _segment_max(S, codes, nb)
    g_max = _segment_max(gen_len, codes, nb)
    batch_shape = seq_align[np.unique(codes, return_index=True)[1]]
    latency = prefill_latency(S, p) + decode_latency(s_max, g_max, p)[codes] + p.Tbatch_overhead_ms
    latency[spike_members(codes, uniques, batch_shape)] += p.Tshape_compile_ms
    return _BatchView(codes, uniques, S, s_max, g_max, np.bincount(codes, minlength=nb), batch_shape, latency)


def member_latencies(prompt_len, gen_len, batch_ids, seq_align, p: CostParams = CostParams(),
                     mode: Mode = "reference") -> np.ndarray:
    """Each record's latency (ms), compile spike included, records in plan-file order."""
    return _batch_view(prompt_len, gen_len, batch_ids, seq_align, p, mode).latency


def plan_metrics(prompt_len: np.ndarray, gen_len: np.ndarray, batch_ids: np.ndarray,
                 seq_align: np.ndarray, p: CostParams = CostParams(), mode: Mode = "reference") -> Metrics:
    """Metrics of one bucket's plan, records given in plan-file order."""
    prompt_len = np.asarray(prompt_len, dtype=np.int64)
    gen_len = np.asarray(gen_len, dtype=np.int64)
    v = _batch_view(prompt_len, gen_len, batch_ids, seq_align, p, mode)
    shapes = np.unique(v.batch_shape)
    compile_total = float(compile_cost(shapes, p).sum())
    prefill_total = float(prefill_cost(v.S, p).sum())
    decode_total = float((v.n_b * decode_cost(v.s_max, v.g_max, p)).sum())
    overhead_total = float(p.Kbatch_overhead_cost * len(v.n_b))
    cost = prefill_total + decode_total + overhead_total + compile_total
    pad = int((v.S - prompt_len).sum() + (v.g_max[v.codes] - gen_len).sum())
    real = int(prompt_len.sum() + gen_len.sum())
    n = len(v.latency)
    k = p95_rank(n)
    p95 = float(np.partition(v.latency, k)[k])
    seq = float(_segment_max(v.latency, v.codes, len(v.n_b)).sum())
    return Metrics(cost=cost, prefill_cost=prefill_total, decode_cost=decode_total,
                   overhead_cost=overhead_total, compile_cost=compile_total, pad_tokens=pad,
                   real_tokens=real, pad_ratio=pad / real, p95_latency_ms=p95, sequential_ms=seq,
                   n_requests=n, n_batches=len(v.n_b), shapes=tuple(int(s) for s in shapes))
