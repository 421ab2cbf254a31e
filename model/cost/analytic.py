"""Reference and strict mode (``shared/cost_model.md``): the seed's coefficients and per-member formulas.

The only copy of this arithmetic: the optimiser (box costs) and the evaluator (plan
metrics) both call these functions.  Float64 over int64 inputs is exact for every term.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from model.cost.common import HIDDEN, lin, sq


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
