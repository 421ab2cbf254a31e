"""Boxes: a batch's decode extent (t, g) and size class, and what each cell pays when it rides in one.

A box is WLOG tight -- t is the largest member's S (reference mode; in strict and
device mode t is the declared shape) and g the largest member's gen -- so the
candidate boxes of a bucket are the grid (prompt/shape values) x (distinct gen values).

In device mode a batch's time depends on its size n: ``T = F + n*u`` within one
decode regime (``decode`` below ``decode_large_from``, ``decode_large`` from it), the
KV cache caps n, and with a P95 limit every member of a batch is over the limit
exactly when n exceeds some n*.  So each (t, g) comes in a few *variants* v, one per
size class [lo, hi] on which F, u and "over the P95 limit" are constant: the model
stays linear and exact.  The size classes are the cost model's (``CostModel.size_classes``):
the decode regimes, or with compiled batch sizes one per batch bucket -- sizes
(B_{i-1}, B_i] at the constant time T(B_i) (F = T(B_i), u = 0), each compiling its own
graph (``graph``: the compile class of each variant).  Reference and strict mode have one
variant (lo = 1, hi = the batch-size cap).  Every coefficient here is a call into
``model.cost``; none re-derives the arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from model.cost.common import allowed_above
from model.cost.model import NO_CAP, CostModel
from model.domain.schema import Limits
from model.histogram.cells import Histogram


@dataclass(frozen=True, eq=False)
class BucketModel:
    """One bucket's histogram plus the constants its constraints need.

    Attributes (all "<=" budgets for the variable part of each metric):
      const_cost: cost that no decision changes (reference: every member's prefill);
      pad_budget: pad tokens the decisions may add (limit minus the fixed prompt pad);
      p95_allowed: members allowed above the P95 latency limit;
      gen_min: per cell, the smallest real gen_len (pad is counted against it, so a
        coarsened histogram never understates padding);
      max_batch: the batch-size cap (None: none), on top of the device's KV capacity;
      size_class, slow, safe: per variant, its size class (the decode regime, or the
        batch bucket's index), whether its members are over the P95 limit, and whether
        they stay under it even with a compile spike added (device mode; one plain
        variant otherwise);
      graph: per variant, the compile unit it runs within its shape (0 where the compile
        is per shape; its bucket's graph with compiled batch sizes).
    """

    hist: Histogram
    limits: Limits
    cost: CostModel
    const_cost: float
    pad_budget: float | None
    p95_allowed: int | None
    real_tokens: int
    gen_min: np.ndarray
    p95_reserve: int = 0  # held back from the allowance for spikes (the bound relaxes it again)
    max_batch: int | None = None
    size_class: np.ndarray = field(default_factory=lambda: np.zeros(1, bool))
    slow: np.ndarray = field(default_factory=lambda: np.zeros(1, bool))
    safe: np.ndarray = field(default_factory=lambda: np.zeros(1, bool))
    graph: np.ndarray = field(default_factory=lambda: np.zeros(1, np.int64))

    @property
    def n_variants(self) -> int:
        return len(self.size_class)


def variant_kinds(cost: CostModel, limits: Limits) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(size class, slow, safe) per variant: the cost model's size classes, each split by the P95 limit if one
    is set into sizes whose members stay under it with a compile spike (safe), without one, or not (slow).
    One plain variant where a batch's time does not depend on its size."""
    if not cost.shared_batch_time:
        return np.zeros(1, bool), np.zeros(1, bool), np.zeros(1, bool)
    classes = cost.size_classes()
    speeds = ["safe", "fast", "slow"] if limits.max_p95_latency_ms is not None else ["fast"]
    pairs = [(r, s) for r in classes for s in speeds]
    return (np.array([r for r, _ in pairs]), np.array([s == "slow" for _, s in pairs]),
            np.array([s == "safe" for _, s in pairs]))


def bucket_model(hist: Histogram, gen_min: np.ndarray, limits: Limits, cost: CostModel,
                 p95_reserve: int = 0, max_batch: int | None = None) -> BucketModel:
    """Constants of one bucket: fixed cost, remaining pad budget, P95 allowance, box variants.

    ``p95_reserve`` members of the allowance are kept back for compile spikes that
    expansion cannot place harmlessly (each can push one member over the limit).
    """
    real = int(hist.prompt_sum.sum() + hist.gen_sum.sum())
    # alignment pad sum(S_c - prompt) is the same in every plan; strict/device mode add t - S_c per arc
    fixed_pad = float((hist.count * hist.S).sum() - hist.prompt_sum.sum())
    const = cost.constant_cost(hist.S, hist.count)
    # pad is measured per request against gen_min; the real pad is that minus the slack below
    slack = float((hist.count * gen_min).sum() - hist.gen_sum.sum())  # <= 0 when coarsened
    pad_budget = None
    if limits.max_pad_ratio is not None:
        pad_budget = limits.max_pad_ratio * real - fixed_pad - slack
    p95 = allowed_above(hist.n_requests) - p95_reserve if limits.max_p95_latency_ms is not None else None
    size_class, slow, safe = variant_kinds(cost, limits)
    return BucketModel(hist, limits, cost, const, pad_budget, p95, real, gen_min, p95_reserve, max_batch,
                       size_class, slow, safe, np.asarray(cost.compile_class(size_class), dtype=np.int64))


# ---------------------------------------------------------------- size classes (device mode)


def fast_members(bm: BucketModel, t: np.ndarray, g: np.ndarray, large: np.ndarray, limit: float) -> np.ndarray:
    """Device mode: the largest n whose batch time T(n) stays within ``limit`` (0 if none does).

    T is affine and increasing in n within a regime; the estimate from the linear parts
    is checked against ``batch_time`` itself (the evaluator's arithmetic) and moved by
    one where float rounding put it on the wrong side.
    """
    fixed, per = bm.cost.linear_parts(t, g, large)
    with np.errstate(divide="ignore", invalid="ignore"):
        est = np.where(per > 0, np.floor((limit - fixed) / np.where(per > 0, per, 1.0)),
                       np.where(fixed <= limit, NO_CAP, -1.0))
    n = np.clip(est, 0, NO_CAP).astype(np.int64)
    probe = np.clip(n, 1, 1 << 40)
    over = (n >= 1) & (n < NO_CAP) & (_time(bm, probe, t, g, large) > limit)
    n = np.where(over, n - 1, n)
    probe = np.clip(n + 1, 1, 1 << 40)
    under = (n + 1 < NO_CAP) & (_time(bm, probe, t, g, large) <= limit)
    return np.where(under, n + 1, n)


def _time(bm: BucketModel, n: np.ndarray, t: np.ndarray, g: np.ndarray, large: np.ndarray) -> np.ndarray:
    """Batch time at n in a fixed regime (the regime's coefficients even where n lies outside it)."""
    fixed, per = bm.cost.linear_parts(t, g, large)
    exact = bm.cost.batch_total(n, t, g)
    return np.where(bm.cost.size_class(n) == large, exact, fixed + n * per)


def variant_range(bm: BucketModel, t, g, v) -> tuple[np.ndarray, np.ndarray]:
    """Batch sizes [lo, hi] of box (t, g) in variant v; lo > hi means the variant cannot be used."""
    t, g, v = (np.asarray(a, dtype=np.int64) for a in np.broadcast_arrays(t, g, v))
    large = bm.size_class[v]
    lo, hi = bm.cost.regime_range(t, g, large, bm.max_batch)
    limit = bm.limits.max_p95_latency_ms
    if bm.cost.shared_batch_time and limit is not None:
        n_fast = fast_members(bm, t, g, large, limit)
        n_safe = np.minimum(fast_members(bm, t, g, large, limit - bm.cost.spike_ms), n_fast)
        slow, safe = bm.slow[v], bm.safe[v]
        hi = np.where(slow, hi, np.minimum(hi, np.where(safe, n_safe, n_fast)))
        lo = np.where(slow, np.maximum(lo, n_fast + 1), np.where(safe, lo, np.maximum(lo, n_safe + 1)))
    return lo, hi


def variant_of_size(bm: BucketModel, t, g, n) -> np.ndarray:
    """The variant a batch of n members in box (t, g) belongs to (-1 where none holds it: over capacity)."""
    t, g, n = (np.asarray(a, dtype=np.int64) for a in np.broadcast_arrays(t, g, n))
    out = np.full(t.shape, -1, dtype=np.int64)
    for v in range(bm.n_variants):
        lo, hi = variant_range(bm, t, g, np.full(t.shape, v))
        out = np.where((out < 0) & (lo <= n) & (n <= hi), v, out)
    return out


# ---------------------------------------------------------------- coefficients per box and arc


def box_fixed(bm: BucketModel, t: np.ndarray, g: np.ndarray, v: np.ndarray | int = 0
              ) -> tuple[np.ndarray, np.ndarray]:
    """Per batch of box (t, g, v): its fixed cost and its fixed part of sequential time.

    Analytic modes: the batch overhead, and the batch's largest member latency (the
    member prefilled at t: prefill grows with S).  Device mode: T's per-batch part F,
    which is both (a batch's time is its cost and its sequential-time contribution).
    """
    t = np.asarray(t)
    return bm.cost.box_fixed(t, g, bm.size_class[np.broadcast_to(v, t.shape)])


def box_unit_cost(bm: BucketModel, t: np.ndarray, g: np.ndarray, v: np.ndarray | int = 0) -> np.ndarray:
    """Cost per member of box (t, g, v): decode (plus prefill in strict mode); device mode T's per-member part."""
    t = np.asarray(t)
    return bm.cost.box_unit_cost(t, g, bm.size_class[np.broadcast_to(v, np.broadcast_shapes(t.shape, np.shape(g)))])


def box_unit_seq(bm: BucketModel, t: np.ndarray, g: np.ndarray, v: np.ndarray | int = 0) -> np.ndarray:
    """Sequential time per member of box (t, g, v): 0 in the analytic modes (a batch counts its largest
    member once), T's per-member part in device mode (a batch counts its whole time)."""
    t = np.asarray(t)
    return bm.cost.box_unit_seq(t, g, bm.size_class[np.broadcast_to(v, np.broadcast_shapes(t.shape, np.shape(g)))])


def box_pad(bm: BucketModel, t: np.ndarray, g: np.ndarray, v: np.ndarray | int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Device mode: (per batch, per member) of the tokens a batch of box (t, g, v) holds, padding included --
    t + g per member, or with compiled batch sizes B (t + g) per batch (the graph's rows, filled or not)."""
    t = np.asarray(t)
    return bm.cost.box_pad(t, g, bm.size_class[np.broadcast_to(v, np.broadcast_shapes(t.shape, np.shape(g)))])


def arc_pad(bm: BucketModel, cell: np.ndarray, t: np.ndarray, g: np.ndarray) -> np.ndarray:
    """Pad tokens per member of a cell in box (t, g): gen pad, plus prompt pad up to t unless in reference mode."""
    pad = g - bm.gen_min[cell]
    if bm.cost.pads_to_shape:
        pad = pad + bm.cost.prompt_pad(bm.hist.S[cell], t)
    return pad.astype(np.float64)


def arc_latency(bm: BucketModel, cell: np.ndarray, t: np.ndarray, g: np.ndarray) -> np.ndarray:
    """Latency (ms, spike excluded) of a member of a cell in box (t, g) -- analytic modes only
    (in device mode it depends on the batch size: see ``variant_range``)."""
    return bm.cost.member_latency(bm.cost.arc_member_length(bm.hist.S[cell], t), t, g)


def arc_violates(bm: BucketModel, cell: np.ndarray, t: np.ndarray, g: np.ndarray,
                 v: np.ndarray | int = 0) -> np.ndarray:
    """1.0 where such a member would exceed the P95 latency limit (0 without a limit)."""
    limit = bm.limits.max_p95_latency_ms
    shape = np.broadcast_shapes(np.shape(cell), np.shape(t), np.shape(g), np.shape(v))
    if limit is None:
        return np.zeros(shape)
    if bm.cost.shared_batch_time:
        return np.broadcast_to(bm.slow[np.broadcast_to(v, shape)], shape).astype(np.float64)
    return (arc_latency(bm, cell, t, g) > limit).astype(np.float64)


def spike_terms(bm: BucketModel, cell: np.ndarray, t: np.ndarray, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """What a compile spike does when it lands on a member of a cell in box (t, g) -- analytic modes only.

    Returns (harmless, growth) per arc: ``harmless`` where the spike does not push the
    member over the P95 limit (it stays under it with the spike, or is over it anyway;
    every arc without a limit), ``growth`` how much it raises the batch's largest
    latency: ``max(0, lat + spike - lat(t, t, g))`` -- the whole spike in strict mode,
    where every member of a batch has the same latency, less in reference mode for a
    member prefilled below t.
    """
    spike = bm.cost.spike_ms
    lat = arc_latency(bm, cell, t, g)
    growth = np.maximum(0.0, lat + spike - bm.cost.member_latency(t, t, g))
    limit = bm.limits.max_p95_latency_ms
    harmless = np.ones(np.shape(lat), bool) if limit is None else (lat + spike <= limit) | (lat > limit)
    return harmless, growth


def request_floor(bm: BucketModel, t, G: np.ndarray) -> np.ndarray:
    """A lower bound on what one request of gen G costs when it runs at shape t, whatever its batch
    (``CostModel.request_floor``, under this bucket's batch-size cap)."""
    return bm.cost.request_floor(t, G, bm.max_batch)


@dataclass(frozen=True, eq=False)
class Grid:
    """The full candidate box grid of a bucket: every (t, g, v) with t in ``ts``, g in ``gs``, v < ``nv``.

    Flat indices are t-major, then g, then the variant: the "column" axis of one t is
    the (g, v) pairs, ``col_g`` and ``col_v``.
    """

    ts: np.ndarray
    gs: np.ndarray
    nv: int = 1

    @property
    def n_cols(self) -> int:
        return len(self.gs) * self.nv

    @property
    def col_g(self) -> np.ndarray:
        return np.repeat(self.gs, self.nv)

    @property
    def col_v(self) -> np.ndarray:
        return np.tile(np.arange(self.nv, dtype=np.int64), len(self.gs))

    def box(self, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(t, g) of flat box indices."""
        index = np.asarray(index, dtype=np.int64)
        return self.ts[index // self.n_cols], self.gs[(index % self.n_cols) // self.nv]

    def variant(self, index: np.ndarray) -> np.ndarray:
        """The size-class variant of flat box indices."""
        return np.asarray(index, dtype=np.int64) % self.nv

    def index(self, t: np.ndarray, g: np.ndarray, v: np.ndarray | int = 0) -> np.ndarray:
        """Flat index of boxes given by values (which must lie on the grid)."""
        return (np.searchsorted(self.ts, t) * len(self.gs) + np.searchsorted(self.gs, g)) * self.nv + v

    def __len__(self) -> int:
        return len(self.ts) * self.n_cols


def candidate_grid(bm: BucketModel, shapes: np.ndarray | None) -> Grid:
    """Boxes that can be optimal: t from the bucket's S values (strict/device: candidate shapes),
    g from its G values, every size-class variant."""
    hist = bm.hist
    if bm.cost.pads_to_shape:
        ts = shapes[shapes >= hist.S.min()]

    else:
        ts = np.unique(hist.S)
    return Grid(np.asarray(ts, dtype=np.int64), np.unique(hist.G).astype(np.int64), bm.n_variants)
