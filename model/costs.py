"""The reference cost model of ``shared/cost_model.md`` -- the only copy of its arithmetic.

Both the optimiser (closed-form box costs) and the evaluator (per-plan metrics) call
these functions, so a plan is always judged by exactly the numbers it was optimised
against.  Everything is vectorised over numpy arrays; integer inputs are int64 and
the arithmetic is float64, which is exact for every per-request term (all terms are
integers or short decimals far below 2**53).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Literal

import numpy as np

from model.errors import InputError

Mode = Literal["reference", "strict"]
MODES: tuple[str, ...] = ("reference", "strict")

GRANULARITY = 64
HIDDEN = 4096
HEADS = 32


@dataclass(frozen=True)
class CostParams:
    """Coefficients of the cost model; defaults are the reference constants."""

    Kp_attn: float = 2.0
    Kp_mlp: float = 1.0
    Tp_attn: float = 0.002
    Tp_mlp: float = 0.0015
    Kd_attn: float = 1.0
    Kd_mlp: float = 0.5
    Td_attn: float = 0.0012
    Td_mlp: float = 0.0006
    Kshape_attn: float = 500.0
    Kshape_mlp: float = 2.0
    Tshape_compile_ms: float = 1500.0
    Kbatch_overhead_cost: float = 1e7
    Tbatch_overhead_ms: float = 8.0
    hidden: int = HIDDEN

    @classmethod
    def from_toml(cls, path: str | Path) -> "CostParams":
        """Override coefficients from a TOML file (top level or a ``[cost_model]`` table).

        Unknown keys and non-numeric or negative values are errors, so a typo never
        silently falls back to the default.
        """
        path = Path(path)
        try:
            data = tomllib.loads(path.read_text())
        except OSError as exc:
            raise InputError(str(path), None, None, f"cannot read: {exc.strerror or exc}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise InputError(str(path), None, None, f"malformed TOML: {exc}") from exc
        return cls.from_mapping(data.get("cost_model", data), str(path))

    @classmethod
    def from_mapping(cls, data: dict, source: str) -> "CostParams":
        """Build parameters from a mapping, validating every key and value."""
        known = {f.name: f.type for f in fields(cls)}
        values = {}
        for key, value in data.items():
            if key not in known:
                raise InputError(source, None, key, "unknown cost-model coefficient")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise InputError(source, None, key, f"expected a non-negative number, got {value!r}")
            values[key] = int(value) if key == "hidden" else float(value)
        return replace(cls(), **values)


def align(x):
    """Round a length up to the 64-token granularity of compiled shapes (ints stay ints)."""
    if isinstance(x, (int, np.integer)):
        return -(-int(x) // GRANULARITY) * GRANULARITY
    return -(-np.asarray(x, dtype=np.int64) // GRANULARITY) * GRANULARITY


def sq(a, n):
    """Sum of squares of the run a, a+1, ..., a+n-1 (attention work of n decode steps)."""
    a = np.asarray(a, dtype=np.int64)
    n = np.asarray(n, dtype=np.int64)
    return n * a * a + a * n * (n - 1) + (n * (n - 1) * (2 * n - 1)) // 6


def lin(a, n):
    """Sum of the run a, ..., a+n-1 (MLP work of n decode steps)."""
    a = np.asarray(a, dtype=np.int64)
    n = np.asarray(n, dtype=np.int64)
    return n * a + (n * (n - 1)) // 2


def prefill_cost(S, p: CostParams = CostParams()):
    """Prefill cost of one member whose prompt is processed at length S."""
    S = np.asarray(S, dtype=np.float64)
    return p.Kp_attn * S * S + p.Kp_mlp * S * p.hidden


def prefill_latency(S, p: CostParams = CostParams()):
    """Prefill latency (ms) of one member processed at length S."""
    S = np.asarray(S, dtype=np.float64)
    return p.Tp_attn * S * S + p.Tp_mlp * S * p.hidden


def decode_cost(S, G, p: CostParams = CostParams()):
    """Decode cost of ONE member of a batch whose box is (S, G); a batch pays n times this."""
    return p.Kd_attn * sq(S, G).astype(np.float64) + p.Kd_mlp * p.hidden * lin(S, G).astype(np.float64)


def decode_latency(S, G, p: CostParams = CostParams()):
    """Decode latency (ms) of every member of a batch whose box is (S, G)."""
    return p.Td_attn * sq(S, G).astype(np.float64) + p.Td_mlp * p.hidden * lin(S, G).astype(np.float64)


def compile_cost(s, p: CostParams = CostParams()):
    """Cost of compiling one distinct shape of sequence length s."""
    s = np.asarray(s, dtype=np.float64)
    return p.Kshape_attn * s * s + p.Kshape_mlp * s * p.hidden


def member_latency(S_member, S_box, G_box, p: CostParams = CostParams()):
    """Latency (ms) of a member prefilled at S_member in a batch decoding box (S_box, G_box).

    The batch's largest member latency -- its contribution to sequential time -- is
    this at S_member = S_box, because prefill latency grows with S.
    """
    return prefill_latency(S_member, p) + decode_latency(S_box, G_box, p) + p.Tbatch_overhead_ms


def p95_rank(n: int) -> int:
    """0-based nearest-rank index of the P95 element among n sorted latencies.

    ``ceil(0.95 n) - 1`` computed in integers (identical to the float form for every n
    checked up to 200k, and immune to rounding).
    """
    return max(0, min(n - 1, (95 * n + 99) // 100 - 1))


def allowed_above(n: int) -> int:
    """How many of n latencies may exceed the P95 limit while the P95 still meets it."""
    return n - 1 - p95_rank(n)


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
    import pandas as pd

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
