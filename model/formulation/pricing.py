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
(strict: boxes are grouped by shape, each shape opened per bucket at its compile cost,
and at most K shapes opened: the K most valuable, or with the cap dualised by kap).
For ANY multipliers of the right sign L <= the optimum of the real problem -- spikes
are left out of the relaxation, which only loosens it -- so the bound holds whatever
subset of boxes the MIP itself searched.  The same h_k prices columns: boxes with
h_k < 0 improve the restricted LP.

How the sums are computed (the sweep).  In the analytic modes e_ck splits into a box
part and a cell part: e_ck = A(t, g) + lam*viol_c(t, g) - P_c, with

  A(t, g) = (1+gam)*unit(t, g) + rho*(g [+ t in strict mode]) [+ lam*viol(t, g) in strict mode]
  P_c     = pi_c + rho*(gen_min_c [+ S_c in strict mode])

and A, viol nondecreasing in t and g (every cost and latency grows with the box).  So
the boxes where a cell pays (e_ck < 0) are a staircase: for each t from the cell's own
shape up to some t_end, the g from its own gen up to some g_end.  Both ends come from
binary searches, and each (cell, t) adds its count and its count * P_c to two
difference rows; running sums along g then give, for every box at once,

  sum_c n_c min(0, e_ck) = A(t, g) * N(t, g) - W(t, g) [+ lam * V(t, g)]

(N: members paying, W: their sum of P_c, V: those of them over the P95 limit).  The
work is (cells) x (shapes each reaches) x log(gens) instead of (shapes) x (gens) x
(cells).  Where A is not monotone (never, for the cost model as written; checked on
every call) and in device mode (size classes) the dense pass over (boxes x cells) runs
instead: it is also the reference the tests compare the sweep with.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from model.formulation.boxes import (
    NO_CAP,
    BucketModel,
    Grid,
    arc_pad,
    arc_violates,
    box_fixed,
    box_unit_cost,
    box_unit_seq,
    variant_range,
)
from solvers.backends.milp import MipArrays

CHUNK = 4_000_000  # matrix entries (or (cell, shape) pairs) per pricing chunk: bounds memory
# a running sum of m signed terms is off by at most m * 2**-53 of their magnitude; each box value is lowered
# by (its terms + 4) times this share of the magnitude it was summed from, so rounding can only weaken
# the bound, never raise it
ROUNDING = 2.3e-16


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


# ---------------------------------------------------------------- the dense pass (device mode; the reference)


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
               max_batch: int | None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """v = F + sum_c n_c min(0, e_c) for boxes (t, g in gs, v in vs), and F, e and the size cap for callers.

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


def dense_values(bm: BucketModel, grid: Grid, duals: Duals, max_batch: int | None, amortise: bool = True,
                 check: Callable[[], None] | None = None) -> np.ndarray:
    """Every box's value, the dense way: (boxes x cells) matrices, one shape at a time.

    Unclipped v_k (+inf where the box cannot be opened); with ``amortise``, where a size
    cap binds, the larger of v_k and the amortised bound (see ``grid_values``).
    """
    out = np.zeros(len(grid))
    col_g, col_v = grid.col_g, grid.col_v
    for i, t, cells, lo, hi in _t_chunks(bm, grid):
        if check is not None:
            check()
        value, F, e, cap = _box_value(bm, duals, t, col_g[lo:hi], col_v[lo:hi], cells, max_batch)
        capped = cap < NO_CAP
        if amortise and capped.any():
            n = bm.hist.count[cells][None, :]
            share = np.where(capped, F / np.maximum(cap, 1), 0.0)
            amortised = (n * np.minimum(0.0, e + share[:, None])).sum(axis=1)
            value = np.where(capped & np.isfinite(value), np.maximum(value, amortised), value)
        out[i * grid.n_cols + lo:i * grid.n_cols + hi] = value
    return out


# ---------------------------------------------------------------- the sweep (analytic modes)


@dataclass(frozen=True, eq=False)
class _Field:
    """One bucket's prices laid over its grid (analytic modes): box parts and cell parts of e_ck."""

    bm: BucketModel
    grid: Grid
    lam_cell: float  # lam where viol depends on the cell (reference mode), else 0 (folded into A)
    A: np.ndarray  # (n_t, n_g): the box part of e_ck
    F: np.ndarray  # (n_t, n_g): what one batch of the box adds
    cap: np.ndarray  # (n_t, n_g): most members per batch (NO_CAP: none)
    usable: np.ndarray  # (n_t, n_g): the box can be opened
    P: np.ndarray  # per cell: the cell part of e_ck
    t0: np.ndarray  # per cell: index of the smallest t that holds it
    g0: np.ndarray  # per cell: index of the smallest g that holds it

    def viol(self, cells: np.ndarray, ti: np.ndarray, gi: np.ndarray) -> np.ndarray:
        """lam_cell * viol_c(t, g) at index pairs (0 without a cell-dependent P95 term)."""
        if not self.lam_cell:
            return np.zeros(len(cells))
        return self.lam_cell * arc_violates(self.bm, cells, self.grid.ts[ti], self.grid.gs[gi])


@dataclass(frozen=True, eq=False)
class _BoxParts:
    """What every box of a grid costs apart from the multipliers (analytic modes): kept between pricing passes."""

    unit: np.ndarray  # (n_t, n_g) per member (useq is 0 in the analytic modes)
    fixed: np.ndarray  # per batch
    lat: np.ndarray  # the batch's largest member latency
    viol: np.ndarray  # strict mode: 1.0 where the members are over the P95 limit
    lo: np.ndarray
    hi: np.ndarray


@functools.lru_cache(maxsize=4)
def _box_parts(bm: BucketModel, grid: Grid) -> _BoxParts:
    """The grid's box parts, computed once per (bucket model, grid) -- both are compared by identity."""
    T, G = np.broadcast_arrays(grid.ts[:, None], grid.gs[None, :])
    fixed, lat = box_fixed(bm, T.ravel(), G.ravel())
    viol = (arc_violates(bm, np.zeros(T.shape, np.int64), T, G) if bm.cost.pads_to_shape
            else np.zeros((0, 0)))
    lo, hi = variant_range(bm, T, G, 0)
    return _BoxParts(box_unit_cost(bm, T, G), fixed.reshape(T.shape), lat.reshape(T.shape), viol, lo, hi)


def _monotone(a: np.ndarray) -> bool:
    """Nondecreasing along both axes (inf allowed)."""
    with np.errstate(invalid="ignore"):
        return bool((np.diff(a, axis=0) >= 0).all() and (np.diff(a, axis=1) >= 0).all())


def _field(bm: BucketModel, grid: Grid, duals: Duals, max_batch: int | None) -> _Field | None:
    """The box and cell parts of e_ck, or None where the sweep does not apply (device mode, or a
    box part that is not monotone)."""
    if bm.cost.shared_batch_time or grid.nv != 1 or len(grid) == 0:
        return None
    parts = _box_parts(bm, grid)
    T, G = np.broadcast_arrays(grid.ts[:, None], grid.gs[None, :])
    A = (1 + duals.gam) * parts.unit
    strict = bm.cost.pads_to_shape
    if duals.rho:
        A = A + duals.rho * (G + T if strict else G).astype(np.float64)
    if duals.lam and strict:  # the member latency is the box's: a box part
        A = A + duals.lam * parts.viol
    F = (1 + duals.gam) * parts.fixed
    if duals.mu:
        F = F + duals.mu * parts.lat
    hi = parts.hi if max_batch is None else np.minimum(parts.hi, max_batch)
    if not _monotone(A):
        return None
    hist = bm.hist
    P = duals.pi + duals.rho * (bm.gen_min + (hist.S if strict else 0))
    return _Field(bm, grid, duals.lam if not strict else 0.0, A, F, hi, parts.lo <= hi, P.astype(np.float64),
                  np.searchsorted(grid.ts, hist.S).astype(np.int64), np.searchsorted(grid.gs, hist.G).astype(np.int64))


def _first(lo: np.ndarray, hi: np.ndarray, pred: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> np.ndarray:
    """Per entry, the smallest k in [lo, hi) with pred(entries, k) true, else hi (pred monotone in k)."""
    lo, hi = lo.copy(), hi.copy()
    while True:
        idx = np.flatnonzero(lo < hi)
        if not len(idx):
            return lo
        mid = (lo[idx] + hi[idx]) // 2
        yes = pred(idx, mid)
        hi[idx[yes]] = mid[yes]
        lo[idx[~yes]] = mid[~yes] + 1


def _reach(f: _Field, A: np.ndarray, slack: float, strict_above: bool, max_rows: int | None) -> np.ndarray:
    """Per cell, the end (exclusive) of the shapes where it pays at its own gen: e_ck <= slack
    (``strict_above``; else e_ck < slack); at most ``max_rows`` shapes, its smallest (where it pays least)."""
    n_t, n_g = A.shape
    P, t0, g0 = f.P, f.t0, f.g0
    fits = (t0 < n_t) & (g0 < n_g)
    last = np.full(len(P), n_t) if max_rows is None else np.minimum(n_t, t0 + max_rows)
    cells = np.arange(len(P))
    return _first(np.where(fits, t0, last), last,
                  lambda i, ti: _stops(A[ti, g0[i]] + f.viol(cells[i], ti, g0[i]) - P[i], slack, strict_above))


def _stops(e: np.ndarray, slack: float, strict_above: bool) -> np.ndarray:
    return e > slack if strict_above else e >= slack


def _pairs(f: _Field, A: np.ndarray, t_end: np.ndarray, slack: float, strict_above: bool,
           check: Callable[[], None] | None):
    """Chunks of (cell, t index, g end): every (cell, shape) up to the cell's ``t_end``, with the end
    (exclusive) of the gens from its own where it still pays; ``check`` before each chunk."""
    n_g = A.shape[1]
    P, t0, g0 = f.P, f.t0, f.g0
    span = t_end - np.minimum(t0, t_end)
    total = np.cumsum(span)
    if not len(total) or total[-1] == 0:
        return
    bounds = np.searchsorted(total, np.arange(0, int(total[-1]), CHUNK // 8), side="right")
    for lo, hi in zip(bounds, np.r_[bounds[1:], len(span)], strict=True):
        if check is not None:
            check()
        sp = span[lo:hi]
        c = lo + np.repeat(np.arange(hi - lo), sp)
        ti = t0[c] + (np.arange(len(c)) - np.repeat(np.cumsum(sp) - sp, sp))
        g_end = _first(g0[c], np.full(len(c), n_g),
                       lambda i, gi: _stops(A[ti[i], gi] + f.viol(c[i], ti[i], gi) - P[c[i]], slack, strict_above))
        yield c, ti, g_end


def _sweep(f: _Field, A: np.ndarray, check: Callable[[], None] | None) -> np.ndarray:
    """sum_c n_c min(0, A(t, g) + lam viol_c - P_c) for every box, with its rounding allowance taken off."""
    n_t, n_g = A.shape
    width = n_g + 1
    size = n_t * width
    count = f.bm.hist.count.astype(np.float64)
    N, W, V = np.zeros(size), np.zeros(size), np.zeros(size)
    M, K = np.zeros(size), np.zeros(size)  # magnitude summed into W and the number of terms: rounding allowance
    pending: list[tuple[np.ndarray, ...]] = []

    def flush() -> None:
        if not pending:
            return
        c, start, stop, v0 = (np.concatenate(x) for x in zip(*pending, strict=True))
        pending.clear()
        n, w = count[c], count[c] * f.P[c]
        N[:] += np.bincount(start, n, size) - np.bincount(stop, n, size)
        W[:] += np.bincount(start, w, size) - np.bincount(stop, w, size)
        M[:] += np.bincount(start, np.abs(w), size) + np.bincount(stop, np.abs(w), size)
        K[:] += np.bincount(start, minlength=size) + np.bincount(stop, minlength=size)
        if f.lam_cell:
            V[:] += np.bincount(v0, n, size) - np.bincount(stop, n, size)

    held = 0
    for c, ti, g_end in _pairs(f, A, _reach(f, A, 0.0, False, None), 0.0, False, check):
        v0 = _first(f.g0[c], g_end, lambda i, gi: f.viol(c[i], ti[i], gi) > 0) if f.lam_cell else g_end
        pending.append((c, ti * width + f.g0[c], ti * width + g_end, ti * width + v0))
        held += len(c)
        if held >= CHUNK:
            flush()
            held = 0
    flush()

    def run(x: np.ndarray) -> np.ndarray:
        return np.cumsum(x.reshape(n_t, width), axis=1)[:, :n_g]

    N, W, M, K, V = run(N), run(W), run(M), run(K) + 4, run(V)
    total = np.where(N > 0, A * N, 0.0) - W + f.lam_cell * V
    allowance = K * (np.where(N > 0, np.abs(A) * N, 0.0) + M + f.lam_cell * V)
    return np.minimum(total - ROUNDING * allowance, 0.0)


def grid_values(bm: BucketModel, grid: Grid, duals: Duals, max_batch: int | None, amortise: bool = True,
                check: Callable[[], None] | None = None) -> np.ndarray:
    """Every box's unclipped value v_k (+inf where it cannot be opened), flat t-major like the grid.

    With a cap of hi_k members per batch (``amortise``), m batches hold at most m hi_k
    members, so each member also carries at least F_k / hi_k: where the cap binds, the
    value is the larger of v_k and sum_c n_c min(0, e_ck + F_k / hi_k).  ``check`` is
    called between chunks.
    """
    f = _field(bm, grid, duals, max_batch)
    if f is None:
        return dense_values(bm, grid, duals, max_batch, amortise, check)
    value = f.F + _sweep(f, f.A, check)
    capped = f.cap < NO_CAP
    if amortise and capped.any():
        A2 = f.A + np.where(capped, f.F / np.maximum(f.cap, 1), 0.0)
        # the amortised bound where the cap binds; a box part that is not monotone falls back to the plain one
        if _monotone(A2):
            value = np.where(capped, np.maximum(value, _sweep(f, A2, check)), value)
    return np.where(f.usable, value, np.inf).ravel()


def box_values(bm: BucketModel, grid: Grid, duals: Duals, boxes: np.ndarray,
               check: Callable[[], None] | None = None) -> np.ndarray:
    """Unclipped v_k = F_k + sum_c n_c min(0, e_ck) of given boxes (h_k = min(0, v_k)); ``check`` between chunks."""
    return grid_values(bm, grid, duals, None, False, check)[np.asarray(boxes, dtype=np.int64)]


def price_boxes(bm: BucketModel, grid: Grid, duals: Duals, max_batch: int | None,
                check: Callable[[], None] | None = None) -> np.ndarray:
    """h_k <= 0 for every box of the grid (flat, t-major): the value of opening it at these prices.

    With a cap of hi_k members per batch, m batches hold at most m hi_k members, so each
    member also carries at least F_k / hi_k: the value is at least
    sum_c n_c min(0, e_ck + F_k / hi_k), whichever of the two bounds is larger.
    ``check`` is called before every chunk (it may raise to stop a pass the deadline cuts).
    """
    return np.minimum(0.0, grid_values(bm, grid, duals, max_batch, True, check))


# ---------------------------------------------------------------- arcs worth holding


def _tight(bm: BucketModel, t: np.ndarray, g: np.ndarray) -> np.ndarray:
    """Per box (t, g), the cell whose (S, G) is exactly (t, g), or -1."""
    hist = bm.hist
    width = int(max(hist.G.max(), g.max(initial=0))) + 1
    keys = hist.S * width + hist.G  # sorted: cells are sorted by (S, G)
    want = t * width + g
    pos = np.minimum(np.searchsorted(keys, want), len(keys) - 1)
    return np.where(keys[pos] == want, pos, -1)


def box_arcs(bm: BucketModel, grid: Grid, duals: Duals, boxes: np.ndarray, slack: float,
             max_per_box: int | None = None, check: Callable[[], None] | None = None,
             near: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Arcs (cell, position in ``boxes``) worth holding: e_ck <= slack, plus each box's own tight cells.

    ``max_per_box`` keeps only the most valuable arcs of each box: with penalty-driven
    prices (limits still violated) nearly every arc looks worth it, and the model
    would balloon.  ``near`` (analytic modes) looks only at each cell's ``near`` smallest
    shapes and, at each, its ``near`` smallest gens among ``boxes`` (its cheapest boxes):
    with a wide ``slack`` (reduced-cost fixing under a loose bound) every cell reaches
    nearly every box, and listing those arcs before cutting them to ``max_per_box`` took
    minutes.  ``check`` is called between chunks (it may raise to stop).
    """
    boxes = np.asarray(boxes, dtype=np.int64)
    f = _field(bm, grid, duals, None)
    if f is None:
        return _dense_arcs(bm, grid, duals, boxes, slack, max_per_box, check)
    n_t, n_g = f.A.shape
    order = np.argsort(boxes, kind="stable")
    sorted_boxes = boxes[order]
    cells_out, pos_out, e_out = [], [], []
    for c, ti, g_end in _pairs(f, f.A, _reach(f, f.A, slack, True, near), slack, True, check):
        first = np.searchsorted(sorted_boxes, ti * n_g + f.g0[c])
        last = np.searchsorted(sorted_boxes, ti * n_g + g_end)
        if near is not None:
            last = np.minimum(last, first + near)
        k = last - first
        if not k.sum():
            continue
        arc_pair = np.repeat(np.arange(len(c)), k)
        at = first[arc_pair] + (np.arange(len(arc_pair)) - np.repeat(np.cumsum(k) - k, k))
        pos = order[at]
        cc = c[arc_pair]
        gi = sorted_boxes[at] % n_g
        e = f.A[ti[arc_pair], gi] + f.viol(cc, ti[arc_pair], gi) - f.P[cc]
        cells_out.append(cc)
        pos_out.append(pos)
        e_out.append(e)
        if max_per_box is not None:  # keep the chunk's best arcs per box: the overall best are among them
            keep = _best_per_box(pos_out[-1], e_out[-1], max_per_box)
            cells_out[-1], pos_out[-1], e_out[-1] = cc[keep], pos[keep], e[keep]
    cells = np.concatenate(cells_out) if cells_out else np.zeros(0, np.int64)
    pos = np.concatenate(pos_out) if pos_out else np.zeros(0, np.int64)
    if max_per_box is not None and len(pos):
        keep = _best_per_box(pos, np.concatenate(e_out), max_per_box)
        cells, pos = cells[keep], pos[keep]
    t_b, g_b = grid.box(boxes)
    own = _tight(bm, t_b, g_b)
    has = np.flatnonzero(own >= 0)
    return (np.concatenate([cells, own[has]]).astype(np.int64),
            np.concatenate([pos, has]).astype(np.int64))


def _best_per_box(pos: np.ndarray, e: np.ndarray, most: int) -> np.ndarray:
    """Arcs whose e is within the ``most`` smallest of their box (ties kept, as a partition would)."""
    order = np.lexsort((e, pos))
    p, ee = pos[order], e[order]
    start = np.r_[0, np.flatnonzero(p[1:] != p[:-1]) + 1]
    size = np.diff(np.r_[start, len(p)])
    cut_at = start + np.minimum(size, most) - 1
    cut = np.repeat(ee[cut_at], size)
    keep = np.zeros(len(pos), bool)
    keep[order] = ee <= cut
    return keep


def _dense_arcs(bm: BucketModel, grid: Grid, duals: Duals, boxes: np.ndarray, slack: float,
                max_per_box: int | None, check: Callable[[], None] | None) -> tuple[np.ndarray, np.ndarray]:
    """``box_arcs`` the dense way: one (boxes x cells) matrix per box t."""
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


# ---------------------------------------------------------------- the bound


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

    In strict mode the shape cap stays in the relaxation: shape s is worth
    o_s = sum_b min(0, (1+gam_b) compile_s + sum_{k at s} h_k), and at most K shapes open,
    so the shapes contribute the K most negative o_s.  That is the exact minimum of the
    relaxed problem over the shapes, so it is never below the dualised form
    -kap K + sum_s min(0, kap + o_s) for any kap >= 0 (both are computed; the larger is kept).
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
        open_value += np.minimum(0.0, (1 + d.gam) * bm.cost.shape_charge(shapes) + by_t)
    dualised = -kappa * max_shapes + float(np.minimum(0.0, kappa + open_value).sum())
    top = float(np.sort(np.minimum(0.0, open_value))[:max(0, max_shapes)].sum())
    return Bound(sum(consts) + max(dualised, top), None, prices)
