"""The greatest convex cumulative price behind every set-partitioning dual of device mode's bounds.

At one shape a batch's time depends only on its size and its longest gen, so with prices nondecreasing in
gen the constraints that matter are on the members' cumulative price V in gen order (convex: each level's
price is at least the one below):

    V[l] - V(N[l] - n) <= T[l, n - 1]   for every level l and size n,   and   V <= V0,

the n dearest members with gen <= g_l being the last n up to level l.  ``window_bound.lp_duals``,
``rider_chain.interval_prices`` and ``rider_bound.free_prices`` take the greatest such V
(``greatest_convex``), by two methods that reach the same V (to 1e-11 on every call captured from the main
job and the Azure code trace's search): alternating the convex minorant with the difference constraints,
which settles within 17 rounds on the embedded default's buckets but takes about 157 on the Azure code
trace's intervals (80 % of its search over shape sets), and one pass up the levels, which costs about as
much as 20 rounds whatever the instance.  So the rounds go first and the pass takes over where they have
not settled within ``ROUNDS``.
"""

from __future__ import annotations

import numpy as np

ROUNDS = 20  # alternating rounds tried before the one pass (which costs about as much as 20 of them)


def lower_hull(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The greatest convex minorant of the points (x, y) (x strictly increasing), evaluated at x.

    A point whose left slope exceeds its right slope lies above the segment joining its neighbours, so it
    is not on the lower hull; dropping every such point at once and repeating until none is left keeps
    exactly the hull (vectorised passes).
    """
    idx = np.arange(len(x))
    while len(idx) > 2:
        dx, dy = np.diff(x[idx]), np.diff(y[idx])
        above = dy[:-1] * dx[1:] > dy[1:] * dx[:-1]  # slope left > slope right
        if not above.any():
            break
        idx = idx[np.r_[True, ~above, True]]
    return np.interp(x, x[idx], y[idx])


def alternated(N: np.ndarray, V0: np.ndarray, T: np.ndarray, rounds: int | None = None) -> np.ndarray | None:
    """``greatest_convex`` by alternating the convex minorant with the difference constraints for at most
    ``rounds`` (default ``ROUNDS``) rounds, None where they have not settled.  Both projections keep every
    feasible convex V below, so the iteration descends onto the greatest; once stable it may sit a relative
    1e-12 above a constraint, which the callers' own checks take back."""
    src = np.maximum(N[1:, None] - np.arange(1, T.shape[1] + 1)[None, :], 0.0)
    V = V0.copy()
    for _ in range(ROUNDS if rounds is None else rounds):
        V = lower_hull(N, V)
        if T.shape[1] == 0:
            return V
        new = np.min(np.interp(src, N, V) + T, axis=1)
        if np.all(V[1:] <= new + 1e-12 * np.abs(new)):
            return lower_hull(N, V)
        V[1:] = np.minimum(V[1:], new)
    return None


def greatest_convex(N: np.ndarray, V0: np.ndarray, T: np.ndarray) -> np.ndarray:
    """The greatest convex V at the cumulative counts N (N[0] = 0, strictly increasing) with V[0] = V0[0],
    V <= V0, and V[l] - V(N[l] - n) <= T[l - 1, n - 1] for every level l >= 1 and n = 1 .. T.shape[1] (V
    between counts by interpolation, clamped at V(0) where n > N[l]; inf: no constraint): the alternating
    rounds where they settle soon, else the one pass (module docstring)."""
    N = np.asarray(N, dtype=np.float64)
    V0 = np.asarray(V0, dtype=np.float64)
    T = np.asarray(T, dtype=np.float64)
    settled = alternated(N, V0, T)
    return settled if settled is not None else one_pass(N, V0, T)


def one_pass(N: np.ndarray, V0: np.ndarray, T: np.ndarray) -> np.ndarray:
    """``greatest_convex`` in one sweep up the levels.

    Why one pass is enough.  V is linear between counts with one price per level, nondecreasing.  Going up
    the levels, each takes the greatest price its own constraints allow with everything below fixed; a
    level whose price would fall below the block under it joins that block at one common price (the
    greatest the joined levels' constraints allow, never above the block's own), and so on down (pooling
    adjacent violators).  Lowering a block only loosens the constraints of the levels inside and above it,
    so what is fixed stays feasible; every price is as high as the levels below and the constraints let it
    be, which is why the result is the greatest (``tests/test_projections.py`` checks it against the
    alternating projections and an LP).  The callers certify whatever prices come out, so a rounding slip
    here could weaken a bound, never make it invalid."""
    L = len(N) - 1
    n = np.arange(1, T.shape[1] + 1, dtype=np.float64)
    V = np.empty(L + 1)
    V[0] = V0[0]
    starts: list[int] = []  # the blocks of levels sharing a price: each one's first level, bottom up
    prices: list[float] = []

    def cap(a: int, lo: int, hi: int) -> float:
        """The greatest common price of levels a .. hi (V fixed up to level a - 1) the constraints ending at
        levels lo .. hi allow."""
        Na, Vb = N[a - 1], V[a - 1]
        width = N[lo:hi + 1] - Na  # members of the block up to each level
        inside = np.minimum(n[None, :], width[:, None])  # of a window's n members, those in the block
        below = Vb - np.interp(Na - (n[None, :] - inside), N[:a], V[:a])  # what the rest already costs
        q = float(((V0[lo:hi + 1] - Vb) / width).min())
        if len(n):
            q = min(q, float(((T[lo - 1:hi] - below) / inside).min()))
        return q

    for level in range(1, L + 1):
        a = level
        joined = cap(starts[-1], level, level) if prices else np.inf
        if prices and joined < prices[-1]:
            # the level alone would be priced below the block under it (its own cap is below the block's price
            # exactly when its cap joined to that block is): they share one price, and so on down
            q, a = joined, starts.pop()
            prices.pop()
            while prices and q < prices[-1]:
                upper = a
                a = starts.pop()
                q = min(prices.pop(), cap(a, upper, level))
        else:
            q = cap(level, level, level)
        starts.append(a)
        prices.append(q)
        V[a:level + 1] = V[a - 1] + (N[a:level + 1] - N[a - 1]) * q
    return V
