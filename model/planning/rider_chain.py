"""Device mode: near-optimal duals of the fixed-shape-set LP in a fraction of a second ("the rider chain").

What it answers.  The same question as ``model.planning.shape_lp``: for the requests of one bucket and a
shape set Y, a certified bound on the batches of every plan that declares only shapes of Y and meets the
bucket's P95 limit.  Column generation reaches the LP optimum but its restricted LPs hold a cone per box
(55,766 rows on the embedded default's chat bucket: 62 s); these prices take 0.1 s there and certify
261,830 against the LP's 262,089 (0.1 % below).

The prices.  Requests are the LP's cells (interval of Y, gen).  A batch at shape y_i holds members of
interval i and "riders" from the intervals below (requests of interval i can run nowhere lower).  So the
intervals are priced bottom up: interval 0 at y_0 alone, then interval i at y_i with the riders' prices
already fixed.  For a batch of ``a`` members of interval i and ``r`` riders of a box (shape y_i, longest
gen g, size range [lo, hi], time ``fixed + n * pe`` with pe the per-member time plus the P95 multiplier mu
where the box is over the limit), the members' prices must satisfy

    sum of the a members' prices  <=  T'(a, g) = min over r of  fixed + (a + r) * pe - C_g(r),

C_g(r) the r largest rider prices with gen <= g (concave in r, so the minimum is at r* = the riders priced
above pe, clipped to the box's size range).  Members' prices are taken nondecreasing in gen, so the a
largest with gen <= g are the last a in gen order and ``projections.greatest_convex`` (the greatest
convex cumulative price under every such difference constraint) finds them with T' in place of T.  A
price feasible at y_i stays feasible at every larger shape (a batch's time grows with its shape), which is
why the riders' prices can be fixed: every interval's prices are feasible wherever its requests can run.

The bound.  Whatever the prices, ``shape_lp.least_reduced_costs`` prices every batch of every box exactly
and the Lagrangian bound ``sum n_c pi_c - mu * A + m * min(0, least reduced cost)`` (m <= the requests)
holds; the chain only proposes pi, so a flaw in it could only weaken the bound, never make it invalid.
The bound is concave in mu; a geometric sweep and bisections around the best step find the multiplier.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from model.base.runtime import Deadline, check_interrupt
from model.cost.common import allowed_above
from model.cost.model import CostModel
from model.planning.projections import greatest_convex
from model.planning.shape_lp import SAFETY, Boxes, Cells, all_boxes, cells_of, least_reduced_costs

MU_STEPS = (4.0, 2.0, 8.0, 1.0, 16.0, 0.5, 0.25)  # multiples of a request's mean price tried for mu, the
# likeliest first (the best was 5.6 and 2.8 on the embedded default's buckets) for a deadline that cuts the sweep
MU_BISECTIONS = 3  # geometric bisections on each side of the best step
BLOCK = 2_000_000  # (boxes x sizes) entries of the riders' arrays built at once


@dataclass(frozen=True)
class ChainBound:
    """The certified bound on one bucket's batches (compiles aside) under a fixed shape set, the P95 multiplier
    that gave it (0 without a limit) and how many multipliers were priced before the deadline."""

    bound: float
    mu: float
    evaluations: int


def rider_units(p: np.ndarray, n: np.ndarray, G: np.ndarray, gens: np.ndarray, most: int
                ) -> tuple[np.ndarray, np.ndarray]:
    """(units, count): per box gen, the ``most`` largest rider prices with gen <= it, one per request (0 past
    the last rider), and how many riders there are.  ``p`` sorted descending."""
    units = np.zeros((len(gens), most))
    if not len(p) or most < 1:
        return units, np.zeros(len(gens), dtype=np.int64)
    take = np.where(G[None, :] <= gens[:, None], n[None, :], 0)
    cum = np.cumsum(take, axis=1)  # riders' requests up to each, in price order
    # unit r of box k is the first rider whose cumulative count exceeds r: one searchsorted over the rows laid
    # end to end (each row shifted above the one before)
    span = int(cum[:, -1].max()) + most + 1
    shift = np.arange(len(gens))[:, None] * span
    idx = np.searchsorted((cum + shift).ravel(), (np.arange(most)[None, :] + shift).ravel(), side="right")
    idx = idx.reshape(len(gens), most) - np.arange(len(gens))[:, None] * len(p)
    ok = np.arange(most)[None, :] < cum[:, -1:]
    units[ok] = p[np.minimum(idx, len(p) - 1)][ok]
    return units, cum[:, -1]


def member_limits(boxes: Boxes, at: np.ndarray, levels: np.ndarray, own_total: int, rider_p: np.ndarray,
                  rider_n: np.ndarray, rider_G: np.ndarray, mu: float, scale: bool = True) -> tuple[np.ndarray, float]:
    """(T'[level, a], theta): T' (a = 0..amax; inf where no box constrains) is the least, over the boxes at this
    shape whose gen falls in the level's range, of what a members of the level and below may be priced together;
    theta >= 1 is how far the riders alone overrun a batch here (a batch's time is not monotone in its size:
    with enough requests at this shape a batch reaches the cheaper decode regime, which none below could), by
    which their prices must be divided first (T' is for the divided prices)."""
    width = int(boxes.hi[at].max(initial=0))
    amax = int(min(own_total, width))
    Tp = np.full((len(levels), amax + 1), np.inf)
    if width < 1:
        return Tp, 1.0
    step = max(1, BLOCK // max(1, width + len(rider_p)))
    lev = np.searchsorted(levels, boxes.g[at], side="right") - 1
    r = np.arange(width + 1)
    blocks, theta = [], 1.0
    for lo in range(0, len(at), step):
        ks = at[lo:lo + step]
        gens, row = np.unique(boxes.g[ks], return_inverse=True)  # size classes and over/within share a gen's riders
        units, count = rider_units(rider_p, rider_n, rider_G, gens, width)
        units, count = units[row], count[row]
        C = np.concatenate([np.zeros((len(ks), 1)), np.cumsum(units, axis=1)], axis=1)  # C[k, r], r = 0..width
        pe = boxes.per[ks] + mu * boxes.over[ks]
        if len(rider_p):  # riders alone (the members of this interval in their batch priced 0 at least)
            T = boxes.fixed[ks][:, None] + np.maximum(r[None, :], boxes.lo[ks][:, None]) * pe[:, None]
            ok = (r[None, :] >= 1) & (r[None, :] <= np.minimum(count, boxes.hi[ks])[:, None])
            theta = max(theta, float(np.max(np.where(ok, C / T, 0.0), initial=0.0)))
        blocks.append((ks, lev[lo:lo + step], units, count, C, pe))
    if not scale:
        theta = 1.0
    if amax < 1:
        return Tp, theta
    a = np.arange(amax + 1)
    for ks, lv, units, count, C, pe in blocks:
        keep = lv >= 0
        if not keep.any():
            continue
        ks, lv, units, count, C, pe = ks[keep], lv[keep], units[keep] / theta, count[keep], C[keep] / theta, pe[keep]
        r_star = (units > pe[:, None]).sum(axis=1)  # the riders worth more than their per-member time
        r_lo = np.maximum(0, boxes.lo[ks][:, None] - a[None, :])
        r_hi = np.minimum(boxes.hi[ks][:, None] - a[None, :], np.minimum(count, width)[:, None])
        ok = (r_lo <= r_hi) & (a[None, :] >= 1)
        rr = np.clip(r_star[:, None], r_lo, np.maximum(r_lo, r_hi))
        val = np.where(ok, boxes.fixed[ks][:, None] + (a[None, :] + rr) * pe[:, None]
                       - np.take_along_axis(C, rr, axis=1), np.inf)
        order = np.argsort(lv, kind="stable")  # each level's least over its boxes: one reduceat per block
        lv, val = lv[order], val[order]
        first = np.flatnonzero(np.r_[True, lv[1:] != lv[:-1]])
        Tp[lv[first]] = np.minimum(Tp[lv[first]], np.minimum.reduceat(val, first, axis=0))
    return Tp, theta


def interval_prices(levels_n: np.ndarray, Tp: np.ndarray) -> np.ndarray:
    """Per level, the members' price (nondecreasing): the greatest convex cumulative price V over the members in
    gen order with V[N_l] - V[N_l - a] <= Tp[l, a] (``projections.greatest_convex``)."""
    c = levels_n.astype(np.float64)
    N = np.r_[0.0, np.cumsum(c)]
    n = np.arange(1, Tp.shape[1])
    T = Tp[:, 1:]
    T = np.where(n[None, :] <= N[1:, None], T, np.inf)
    single = Tp[:, 1] if Tp.shape[1] > 1 else np.zeros(len(c))
    V = np.r_[0.0, np.cumsum(c * np.where(np.isfinite(single), np.maximum(single, 0.0), 0.0))]
    V = greatest_convex(N, V, T)
    return np.maximum(np.diff(V) / c, 0.0)


def chain_duals(cells: Cells, boxes: Boxes, mu: float, deadline: Deadline = Deadline.never()) -> np.ndarray:
    """pi per cell, interval by interval (see module docstring); cells of intervals the deadline left priced 0."""
    pi = np.zeros(len(cells.n))
    for i in np.unique(cells.j).tolist():
        check_interrupt()
        if deadline.expired():
            break
        own = np.flatnonzero(cells.j == i)
        order = np.argsort(cells.G[own], kind="stable")
        own = own[order]
        riders = np.flatnonzero(cells.j < i)
        riders = riders[np.argsort(-pi[riders], kind="stable")]
        at = np.flatnonzero(boxes.i == i)
        Tp, theta = member_limits(boxes, at, cells.G[own], int(cells.n[own].sum()), pi[riders],
                                  cells.n[riders], cells.G[riders], mu)
        pi[riders] /= theta  # every interval below: still feasible wherever it ran (lower prices only)
        pi[own] = interval_prices(cells.n[own], Tp)
    return pi


def lagrangian(cells: Cells, boxes: Boxes, pi: np.ndarray, mu: float, requests: int) -> float:
    """What every plan's batches of these boxes cost at least, penalised at mu, from prices pi: their sum plus
    ``requests`` (at least the batches) times the least reduced cost where that is negative."""
    rc = least_reduced_costs(cells, boxes, pi, mu)
    return float(cells.n @ pi) + requests * float(min(0.0, rc.min(initial=0.0)))


def certified(cells: Cells, boxes: Boxes, pi: np.ndarray, mu: float, allowed: int | None, requests: int) -> float:
    """The Lagrangian bound of prices (pi, mu) (see module docstring), lowered by SAFETY for the float sums."""
    value = lagrangian(cells, boxes, pi, mu, requests) - mu * (allowed or 0)
    return value - SAFETY * abs(value)


def chain_bound(cost: CostModel, S: np.ndarray, G: np.ndarray, shapes, limit: float | None = None,
                max_batch: int | None = None, deadline: Deadline = Deadline.never(),
                steps: tuple[float, ...] = MU_STEPS, bisections: int = MU_BISECTIONS) -> ChainBound:
    """The certified bound on the batches of any plan of these requests (entry shapes S, gens G) that declares
    only ``shapes`` and keeps the P95 latency within ``limit``: the rider chain's prices at the best multiplier
    found before ``deadline`` (-inf if none was priced): ``steps`` times a request's mean price, then
    ``bisections`` rounds around the best."""
    S, G = np.asarray(S, dtype=np.int64), np.asarray(G, dtype=np.int64)
    if len(S) == 0:
        return ChainBound(0.0, 0.0, 0)
    shapes = np.unique(np.asarray(shapes, dtype=np.int64))
    cells = cells_of(S, G, shapes)
    boxes = all_boxes(cost, cells, shapes, limit, max_batch)
    allowed = allowed_above(len(S)) if limit is not None else None
    tried: dict[float, float] = {}

    def value(mu: float) -> float:
        if mu not in tried:
            pi = chain_duals(cells, boxes, mu, deadline)
            tried[mu] = -np.inf if deadline.expired() else certified(cells, boxes, pi, mu, allowed, len(S))
        return tried[mu]

    base = value(0.0)
    if limit is not None and np.isfinite(base):
        scale = max(base, 1e-9) / len(S)
        for step in steps:
            if deadline.expired():
                break
            value(step * scale)
        for _ in range(bisections):
            mus = sorted(tried)
            k = max(range(len(mus)), key=lambda q: tried[mus[q]])
            sides = [(mus[q], mus[q + 1]) for q in (k - 1, k) if 0 <= q < len(mus) - 1]
            for lo, hi in sides:
                if deadline.expired():
                    break
                value(float(np.sqrt(lo * hi)) if lo > 0 else 0.5 * hi)
    mu = max(tried, key=lambda q: tried[q])
    return ChainBound(tried[mu], mu, len(tried))
