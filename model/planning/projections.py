"""The convex projections behind every set-partitioning dual of device mode's bounds.

At one shape a batch's time depends only on its size and its longest gen, so with prices nondecreasing in
gen the constraints that matter are differences of a convex cumulative price V over the members in gen
order; ``window_bound.lp_duals``, ``rider_chain.interval_prices`` and ``rider_bound.free_prices`` find the
greatest such V (``greatest_convex``) by alternating the convex minorant (``lower_hull``) with the difference
constraints, at most MAX_ITERS rounds (the iteration stops once stable).
"""

from __future__ import annotations

import numpy as np

MAX_ITERS = 3000


def lower_hull(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The greatest convex minorant of the points (x, y) (x strictly increasing), evaluated at x.

    A point whose left slope exceeds its right slope lies above the segment joining its
    neighbours, so it is not on the lower hull; dropping every such point at once and
    repeating until none is left keeps exactly the hull (vectorised passes).
    """
    idx = np.arange(len(x))
    while len(idx) > 2:
        dx, dy = np.diff(x[idx]), np.diff(y[idx])
        above = dy[:-1] * dx[1:] > dy[1:] * dx[:-1]  # slope left > slope right
        if not above.any():
            break
        idx = np.delete(idx, 1 + np.flatnonzero(above))
    return np.interp(x, x[idx], y[idx])


def greatest_convex(N: np.ndarray, V: np.ndarray, T: np.ndarray, src: np.ndarray) -> np.ndarray:
    """The greatest convex V at the cumulative counts N, at most the start ``V`` (which must lie above it), with
    V[i] - V(src[i, k]) <= T[i, k] for every level i and size k (V between counts by interpolation; inf: no
    constraint).  Both projections keep every feasible convex V below, so the iteration descends onto it; the
    last iterate may sit a relative 1e-12 above a constraint, which the callers' own checks take back.  Where
    no batch fits at the shape (T has no column) only convexity constrains V."""
    if T.shape[1] == 0:
        return lower_hull(N, V)
    for _ in range(MAX_ITERS):
        V = lower_hull(N, V)
        new = np.min(np.interp(src, N, V) + T, axis=1)
        if np.all(V[1:] <= new + 1e-12 * np.abs(new)):
            break
        V[1:] = np.minimum(V[1:], new)
    return lower_hull(N, V)
