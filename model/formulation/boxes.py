"""Boxes: a batch's decode extent (t, g) and what each cell pays when it rides in one.

A box is WLOG tight -- t is the largest member's S (reference mode; in strict mode t
is the declared shape) and g the largest member's gen -- so the candidate boxes of a
bucket are the grid (prompt/shape values) x (distinct gen values).  Every
coefficient here is a call into ``model.cost``; none re-derives the arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from model.cost.analytic import (
    CostParams,
    compile_cost,
    decode_cost,
    member_latency,
    prefill_cost,
)
from model.cost.common import Mode, allowed_above
from model.histogram.cells import Histogram
from model.schema import Limits


@dataclass(frozen=True, eq=False)
class BucketModel:
    """One bucket's histogram plus the constants its constraints need.

    Attributes (all "<=" budgets for the variable part of each metric):
      const_cost: cost that no decision changes (reference: every member's prefill);
      pad_budget: pad tokens the decisions may add (limit minus the fixed prompt pad);
      p95_allowed: members allowed above the P95 latency limit;
      gen_min: per cell, the smallest real gen_len (pad is counted against it, so a
        coarsened histogram never understates padding).
    """

    hist: Histogram
    limits: Limits
    mode: Mode
    params: CostParams
    const_cost: float
    pad_budget: float | None
    p95_allowed: int | None
    real_tokens: int
    gen_min: np.ndarray
    p95_reserve: int = 0  # held back from the allowance for spikes (the bound relaxes it again)


def bucket_model(hist: Histogram, gen_min: np.ndarray, limits: Limits, params: CostParams, mode: Mode,
                 p95_reserve: int = 0) -> BucketModel:
    """Constants of one bucket: fixed cost, remaining pad budget, P95 allowance.

    ``p95_reserve`` members of the allowance are kept back for compile spikes that
    expansion cannot place harmlessly (each can push one member over the limit).
    """
    real = int(hist.prompt_sum.sum() + hist.gen_sum.sum())
    # alignment pad sum(S_c - prompt) is the same in every plan; strict mode adds t - S_c per arc
    fixed_pad = float((hist.count * hist.S).sum() - hist.prompt_sum.sum())
    const = float((hist.count * prefill_cost(hist.S, params)).sum()) if mode == "reference" else 0.0
    # pad is measured per request against gen_min; the real pad is that minus the slack below
    slack = float((hist.count * gen_min).sum() - hist.gen_sum.sum())  # <= 0 when coarsened
    pad_budget = None
    if limits.max_pad_ratio is not None:
        pad_budget = limits.max_pad_ratio * real - fixed_pad - slack
    p95 = allowed_above(hist.n_requests) - p95_reserve if limits.max_p95_latency_ms is not None else None
    return BucketModel(hist, limits, mode, params, const, pad_budget, p95, real, gen_min, p95_reserve)


def box_fixed(bm: BucketModel, t: np.ndarray, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per batch of box (t, g): its fixed cost (overhead) and its sequential-time latency.

    The batch's largest latency is the member prefilled at t (prefill grows with S).
    """
    lat = member_latency(t, t, g, bm.params)
    return np.full(len(t), bm.params.Kbatch_overhead_cost), lat


def box_unit_cost(bm: BucketModel, t: np.ndarray, g: np.ndarray) -> np.ndarray:
    """Cost per member of box (t, g) that depends on the box: decode, plus prefill in strict mode."""
    cost = decode_cost(t, g, bm.params)
    if bm.mode == "strict":
        cost = cost + prefill_cost(t, bm.params)
    return cost


def arc_pad(bm: BucketModel, cell: np.ndarray, t: np.ndarray, g: np.ndarray) -> np.ndarray:
    """Pad tokens per member of a cell in box (t, g): gen pad, plus prompt pad up to t in strict mode."""
    pad = g - bm.gen_min[cell]
    if bm.mode == "strict":
        pad = pad + (t - bm.hist.S[cell])
    return pad.astype(np.float64)


def arc_latency(bm: BucketModel, cell: np.ndarray, t: np.ndarray, g: np.ndarray) -> np.ndarray:
    """Latency (ms, spike excluded) of a member of a cell in box (t, g)."""
    s_member = t if bm.mode == "strict" else bm.hist.S[cell]
    return member_latency(s_member, t, g, bm.params)


def arc_violates(bm: BucketModel, cell: np.ndarray, t: np.ndarray, g: np.ndarray) -> np.ndarray:
    """1.0 where such a member would exceed the P95 latency limit (0 without a limit)."""
    limit = bm.limits.max_p95_latency_ms
    if limit is None:
        return np.zeros(len(cell))
    return (arc_latency(bm, cell, t, g) > limit).astype(np.float64)


def shape_compile(shapes: np.ndarray, params: CostParams) -> np.ndarray:
    """Compile cost of each candidate shape (charged per bucket that uses it)."""
    return compile_cost(shapes, params)


@dataclass(frozen=True, eq=False)
class Grid:
    """The full candidate box grid of a bucket: every (t, g) with t in ``ts`` and g in ``gs``."""

    ts: np.ndarray
    gs: np.ndarray

    def box(self, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(t, g) of flat box indices (t-major)."""
        return self.ts[index // len(self.gs)], self.gs[index % len(self.gs)]

    def index(self, t: np.ndarray, g: np.ndarray) -> np.ndarray:
        """Flat index of boxes given by values (which must lie on the grid)."""
        return np.searchsorted(self.ts, t) * len(self.gs) + np.searchsorted(self.gs, g)

    def __len__(self) -> int:
        return len(self.ts) * len(self.gs)


def candidate_grid(bm: BucketModel, shapes: np.ndarray | None) -> Grid:
    """Boxes that can be optimal: t from the bucket's S values (strict: candidate shapes), g from its G values."""
    hist = bm.hist
    if bm.mode == "strict":
        ts = shapes[shapes >= hist.S.min()]
    else:
        ts = np.unique(hist.S)
    return Grid(np.asarray(ts, dtype=np.int64), np.unique(hist.G).astype(np.int64))
