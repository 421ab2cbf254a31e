"""Pricing and the certified lower bound: Lagrangian relaxation over EVERY candidate box.

Dualise coverage (pi_c, free), the limit rows (mu: sequential time, rho: pad, lam:
P95, gam: cost; all >= 0) and, in strict and device mode, the shape cap (kap >= 0).
What is left splits into one tiny problem per box k = (t, g, v):

  e_ck = (1+gam)*unit(k) + mu*useq(k) + rho*pad_ck + lam*viol_ck - pi_c   (one member of c in k)
  F_k  = (1+gam)*fixed(k) + mu*lat(k)                                       (one batch of k)
  h_k  = min(0, F_k + sum_{c in k} n_c * min(0, e_ck))                      (open k or not)

(fixed = the batch overhead, or T's per-batch part in device mode; useq = 0, or T's
per-member part; a batch-size cap hi_k adds the bound sum_c n_c min(0, e_ck + F_k/hi_k);
the lower end of a device size class is relaxed away)

and  L = sum_b [(1+gam)*const + sum_c pi_c n_c - mu*T - rho*P - lam*A - gam*C] + sum_k h_k
(strict: boxes are grouped by shape, each shape opened per bucket at its compile cost
and counted against K).  For ANY multipliers of the right sign L <= the optimum of
the real problem -- spikes are left out of the relaxation, which only loosens it --
so the bound holds whatever subset of boxes the MIP itself searched.  The same h_k
prices columns: boxes with h_k < 0 improve the restricted LP.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from model.formulation.arrays import MipArrays
from model.formulation.boxes import (
    NO_CAP,
    BucketModel,
    Grid,
    arc_pad,
    arc_violates,
    box_fixed,
    box_unit_cost,
    box_unit_seq,
    shape_compile,
    variant_range,
)

CHUNK = 4_000_000  # matrix entries per pricing chunk (memory: a few arrays of this many floats)


@dataclass(frozen=True, eq=False)
class Duals:
    """Lagrange multipliers of one bucket (raw cost units)."""

    pi: np.ndarray
    mu: float = 0.0
    rho: float = 0.0
    lam: float = 0.0
    gam: float = 0.0


def duals_from_lp(model: MipArrays, row_duals: np.ndarray, b: int, n_cells: int) -> Duals:
    """Read one bucket's multipliers from an LP solution (HiGHS sign convention: <= rows give <= 0)."""
    def one(name: str) -> float:
        blk = model.block("row", name, b)
        return max(0.0, -float(row_duals[blk.start]) * blk.scale) if blk is not None else 0.0

    cover = model.block("row", "cover", b)
    pi = np.asarray(row_duals[cover.start:cover.start + n_cells], dtype=np.float64)
    return Duals(pi, mu=one("seq"), rho=one("pad"), lam=one("p95"), gam=one("cost"))


def shape_cap_dual(model: MipArrays, row_duals: np.ndarray) -> float:
    blk = model.block("row", "shape_cap")
    return max(0.0, -float(row_duals[blk.start])) if blk is not None else 0.0


def _cell_values(bm: BucketModel, duals: Duals, t: int, gs: np.ndarray, vs: np.ndarray, cells: np.ndarray
                 ) -> np.ndarray:
    """e_ck for boxes (t, g in gs, v in vs) x cells, +inf where the cell does not fit (G_c > g).

    e = (1+gam) unit + mu useq + rho pad + lam viol - pi: what one member of the cell
    adds to the Lagrangian in the box (useq: its share of sequential time, device mode).
    """
    g = gs[:, None]
    c = cells[None, :]
    per = (1 + duals.gam) * box_unit_cost(bm, np.int64(t), gs, vs)
    if duals.mu:
        per = per + duals.mu * box_unit_seq(bm, np.int64(t), gs, vs)
    e = per[:, None] - duals.pi[c]
    if duals.rho:
        e = e + duals.rho * arc_pad(bm, c, np.int64(t), g)
    if duals.lam:
        e = e + duals.lam * arc_violates(bm, np.broadcast_to(c, e.shape), np.int64(t), np.broadcast_to(g, e.shape),
                                         np.broadcast_to(vs[:, None], e.shape))
    return np.where(bm.hist.G[c] <= g, e, np.inf)


def _t_chunks(bm: BucketModel, grid: Grid):
    """(t index, t, cells that fit under t, column sub-range) in chunks that bound memory."""
    for i, t in enumerate(grid.ts):
        cells = np.flatnonzero(bm.hist.S <= t)
        if len(cells) == 0:
            continue
        step = max(1, CHUNK // len(cells))
        for lo in range(0, grid.n_cols, step):
            yield i, int(t), cells, lo, min(grid.n_cols, lo + step)


def _box_value(bm: BucketModel, duals: Duals, t: int, gs: np.ndarray, vs: np.ndarray, cells: np.ndarray,
               max_batch: int | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """v = F + sum_c n_c min(0, e_c) for boxes (t, g in gs, v in vs), and F and e for callers that need them.

    F = (1+gam) fixed + mu lat is what opening one batch of the box adds.  A box whose
    size class is empty (lo > hi) cannot be opened: its value is +inf.
    """
    e = _cell_values(bm, duals, t, gs, vs, cells)
    tt = np.full(len(gs), t)
    fixed, lat = box_fixed(bm, tt, gs, vs)
    F = (1 + duals.gam) * fixed + duals.mu * lat
    value = F + (bm.hist.count[cells][None, :] * np.minimum(0.0, e)).sum(axis=1)
    lo, hi = variant_range(bm, tt, gs, vs)
    if max_batch is not None:
        hi = np.minimum(hi, max_batch)
    return np.where(lo > hi, np.inf, value), F, e, hi


def box_values(bm: BucketModel, grid: Grid, duals: Duals, boxes: np.ndarray,
               check: Callable[[], None] | None = None) -> np.ndarray:
    """Unclipped v_k = F_k + sum_c n_c min(0, e_ck) of given boxes (h_k = min(0, v_k)); ``check`` per box t."""
    t_all, g_all = grid.box(boxes)
    v_all = grid.variant(boxes)
    out = np.zeros(len(boxes))
    for t in np.unique(t_all):
        if check is not None:
            check()
        sel = np.flatnonzero(t_all == t)
        out[sel] = _box_value(bm, duals, int(t), g_all[sel], v_all[sel], np.flatnonzero(bm.hist.S <= t), None)[0]
    return out


def price_boxes(bm: BucketModel, grid: Grid, duals: Duals, max_batch: int | None,
                check: Callable[[], None] | None = None) -> np.ndarray:
    """h_k <= 0 for every box of the grid (flat, t-major): the value of opening it at these prices.

    With a cap of hi_k members per batch, m batches hold at most m hi_k members, so each
    member also carries at least F_k / hi_k: the value is at least
    sum_c n_c min(0, e_ck + F_k / hi_k), whichever of the two bounds is larger.
    ``check`` is called before every chunk (it may raise to stop a pass the deadline cuts).
    """
    h = np.zeros(len(grid))
    col_g, col_v = grid.col_g, grid.col_v
    for i, t, cells, lo, hi in _t_chunks(bm, grid):
        if check is not None:
            check()
        value, F, e, cap = _box_value(bm, duals, t, col_g[lo:hi], col_v[lo:hi], cells, max_batch)
        capped = cap < NO_CAP
        if capped.any():
            n = bm.hist.count[cells][None, :]
            share = np.where(capped, F / np.maximum(cap, 1), 0.0)
            amortised = (n * np.minimum(0.0, e + share[:, None])).sum(axis=1)
            value = np.where(capped & np.isfinite(value), np.maximum(value, amortised), value)
        h[i * grid.n_cols + lo:i * grid.n_cols + hi] = np.minimum(0.0, value)
    return h


def box_arcs(bm: BucketModel, grid: Grid, duals: Duals, boxes: np.ndarray, slack: float,
             max_per_box: int | None = None, check: Callable[[], None] | None = None
             ) -> tuple[np.ndarray, np.ndarray]:
    """Arcs (cell, position in ``boxes``) worth holding: e_ck <= slack, plus each box's own tight cells.

    ``max_per_box`` keeps only the most valuable arcs of each box: with penalty-driven
    prices (limits still violated) nearly every arc looks worth it, and the model
    would balloon.  ``check`` is called for every box t (it may raise to stop).
    """
    t_all, g_all = grid.box(boxes)
    v_all = grid.variant(boxes)
    cells_out, pos_out = [], []
    for t in np.unique(t_all):
        if check is not None:
            check()
        sel = np.flatnonzero(t_all == t)
        cells = np.flatnonzero(bm.hist.S <= t)
        e = _cell_values(bm, duals, int(t), g_all[sel], v_all[sel], cells)
        tight = (bm.hist.S[cells][None, :] == t) & (bm.hist.G[cells][None, :] == g_all[sel][:, None])
        keep = e <= slack
        if max_per_box is not None and e.shape[1] > max_per_box:
            cut = np.partition(e, max_per_box - 1, axis=1)[:, max_per_box - 1:max_per_box]
            keep &= e <= cut
        r, c = np.nonzero(keep | tight)
        cells_out.append(cells[c])
        pos_out.append(sel[r])
    if not cells_out:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(cells_out).astype(np.int64), np.concatenate(pos_out).astype(np.int64)


def bucket_constant(bm: BucketModel, duals: Duals, compile_fixed: float) -> float:
    """The multiplier-only part of one bucket's Lagrangian (spike reserve left out: a relaxation)."""
    lim = bm.limits
    value = (1 + duals.gam) * (bm.const_cost + compile_fixed) + float((duals.pi * bm.hist.count).sum())
    if lim.max_sequential_ms is not None:
        value -= duals.mu * lim.max_sequential_ms
    if bm.pad_budget is not None:
        value -= duals.rho * bm.pad_budget
    if bm.p95_allowed is not None:  # the allowance before any spike reserve: a relaxation
        value -= duals.lam * (bm.p95_allowed + bm.p95_reserve)
    if lim.max_cost is not None:
        value -= duals.gam * lim.max_cost
    return value


@dataclass(frozen=True, eq=False)
class Bound:
    """A certified lower bound and the box prices it was computed from."""

    total: float
    per_bucket: tuple[float, ...] | None  # None when buckets are coupled (strict mode shapes)
    prices: tuple[np.ndarray, ...]


def lagrangian_bound(bms: list[BucketModel], grids: list[Grid], duals: list[Duals], max_batch: int | None,
                     shapes: np.ndarray | None = None, kappa: float = 0.0, max_shapes: int = 0,
                     compile_fixed: list[float] | None = None, check: Callable[[], None] | None = None) -> Bound:
    """L(multipliers): a valid lower bound on the optimal total cost (see module docstring).

    ``check`` is called between pricing chunks; if it raises, no bound is returned (a
    Lagrangian evaluated over part of the boxes is not a bound).
    """
    prices = tuple(price_boxes(bm, grid, d, max_batch, check)
                   for bm, grid, d in zip(bms, grids, duals, strict=True))
    fixed = compile_fixed or [0.0] * len(bms)
    consts = [bucket_constant(bm, d, f) for bm, d, f in zip(bms, duals, fixed, strict=True)]
    if shapes is None:
        per = tuple(c + float(h.sum()) for c, h in zip(consts, prices, strict=True))
        return Bound(sum(per), per, prices)
    open_value = np.zeros(len(shapes))
    for bm, grid, d, h in zip(bms, grids, duals, prices, strict=True):
        by_t = np.zeros(len(shapes))
        pos = np.searchsorted(shapes, grid.ts)
        np.add.at(by_t, pos, h.reshape(len(grid.ts), grid.n_cols).sum(axis=1))
        open_value += np.minimum(0.0, (1 + d.gam) * shape_compile(shapes, bm.params) + by_t)
    total = sum(consts) - kappa * max_shapes + float(np.minimum(0.0, kappa + open_value).sum())
    return Bound(total, None, prices)
