"""Reference and strict mode (``shared/cost_model.md``): the seed's coefficients and per-member formulas.

The only copy of this arithmetic: the optimiser (box costs) and the evaluator (plan
metrics) both call these functions.  Float64 over int64 inputs is exact for every term.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from pathlib import Path

import numpy as np

from model.cost.common import HIDDEN, lin, sq
from model.errors import InputError
from model.load.toml_lines import key_line, read_toml


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
    def from_toml(cls, path: str | Path) -> CostParams:
        """Override coefficients from a TOML file (top level or a ``[cost_model]`` table).

        Unknown keys and non-numeric, negative or non-finite values are errors naming
        file, line and key, so a typo never silently falls back to the default.
        """
        path = Path(path)
        text, data = read_toml(path)
        table = "cost_model" if isinstance(data.get("cost_model"), dict) else None
        return cls.from_mapping(data["cost_model"] if table else data, str(path),
                                lambda key: key_line(text, key, table) or key_line(text, table or key))

    @classmethod
    def from_mapping(cls, data: dict, source: str, line_of: Callable[[str], int | None] | None = None,
                     prefix: str = "") -> CostParams:
        """Build parameters from a mapping, validating every key and value.

        ``line_of`` finds the line of a key in the source file; ``prefix`` is put before
        the key in messages (``cost_model.`` for a scenario's inline table).
        """
        known = {f.name: f.type for f in fields(cls)}
        values = {}
        for key, value in data.items():
            where = (source, line_of(key) if line_of else None, prefix + key)
            if key not in known:
                raise InputError(*where, "unknown cost-model coefficient")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
                raise InputError(*where, f"expected a finite non-negative number, got {value!r}")
            if key == "hidden" and (value < 1 or value != int(value)):
                raise InputError(*where, f"expected a positive integer, got {value!r}")
            values[key] = int(value) if key == "hidden" else float(value)
        return replace(cls(), **values)


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
