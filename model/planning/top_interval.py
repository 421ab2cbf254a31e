"""Device mode without windows: what a bucket's top interval adds to the LP-price bound of its own shapes.

The LP-price bound (``limit_bound``) prices every request by phi, a suffix minimum of per-shape prices psi
that are dual-feasible at each shape for the whole pool that may ride there.  At the bucket's largest shape
c, whose pool is every request, those duals are what each member would cost if all of them shared c; but in
a plan whose next shape down is a, the members with S in (a, c] (M) must ride at c, with only such lower
requests (L) as the plan moves up.  For fixed prices p (each request's phi at its own shape of the set), the
plan costs

    sum_r p_r + sum_shapes excess(X_s),   excess(X) = OPT_s(X) - p(X) >= 0  (p is dual-feasible at s),

and at c, X = M + D for some D within L.  For any y dual-feasible at c (sum_B y <= T'(B) for every batch B
at c, T' the penalised time of ``limit_bound``), OPT_c(X) >= y(X), so

    excess(X_c) >= sum_M (y - p) + sum_D (y - p) >= sum_M (y - p) - sum_L (q - y)^+ =: gain(a, y),

with q_r >= p_r any cap on a lower request's own price: q = min(phi[., a], psi[., c]) (phi grows with the
shape, and the suffix minimum includes c).  So the bucket's own bound may add max over y of gain(a, y) to
its top interval's entry (the entry for (a, c]): at y = psi[., c] the gain is >= 0.  The y tried are the
convex combinations of psi[., c] with y1 = (M's own LP duals at c on M, the leave floors on L): y1 is
dual-feasible because a batch B at c costs at least its M part's time plus, for each lower member, the
least its leaving lowers a batch's time (``leave_floor``), so sum_B y1 <= T'(B & M) + sum (floors) <= T'(B).

Valid only in a bucket's own bound (``shapes.own_bound``), where the bucket's largest shape is the
candidate covering its longest prompt, so M cannot ride higher; in the joint bound over a union of
shapes the top members may ride above, and no gain is added there.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from model.base.runtime import Deadline
from model.cost.device import DeviceProfile, batch_time, per_member_ms
from model.packers.grouping import batch_capacity
from model.planning.shapes import own_bound
from model.planning.window_bound import lp_duals, penalised, suffix_min

ALPHAS = np.linspace(0.0, 1.0, 11)  # weights of y1 against psi[., c] tried per interval


def leave_floor(prof: DeviceProfile, c: int, g: np.ndarray, max_batch: int | None,
                penalty: tuple[float, float] | None) -> np.ndarray:
    """Per member of gen g (one bucket's gens): the least a batch of them at shape c falls in penalised time
    when that member leaves it (a profile's coefficients are non-negative, so a batch's
    time never falls as its longest gen grows).

    The batch has n <= capacity(c, g) members and a longest gen G >= g (a member's, so one of g's values);
    leaving, it keeps n - 1 and a longest gen G' <= G, so the fall is at least T'(n, G) - T'(n - 1, G).  That is
    T(1, G) >= T(1, g) when the batch empties; the per-member time at G >= that at g within one decode regime
    (the penalty then only adds); and at the regime switch n = decode_large_from, where T may rise as a member
    leaves, the exact T'(n, G) - T'(n - 1, G) minimised over every G >= g whose batch of n fits."""
    g = np.asarray(g, dtype=np.int64)
    gens = np.unique(g)
    cap = batch_capacity(c, g, max_batch, prof.kv_capacity_tokens)
    out = batch_time(1, c, g, prof).astype(np.float64)
    n0 = prof.decode_large_from if prof.decode_large is not None else None
    small_top = cap if n0 is None else np.minimum(cap, n0 - 1)
    out = np.where(small_top >= 2, np.minimum(out, per_member_ms(c, g, False, prof)), out)
    if n0 is None:
        return out
    out = np.where(cap >= max(n0 + 1, 2), np.minimum(out, per_member_ms(c, g, True, prof)), out)
    if n0 >= 2:
        fits = batch_capacity(c, gens, max_batch, prof.kv_capacity_tokens) >= n0
        step = (penalised(batch_time(n0, c, gens, prof), n0, penalty)
                - penalised(batch_time(n0 - 1, c, gens, prof), n0 - 1, penalty))
        least_above = np.minimum.accumulate(np.where(fits, step, np.inf)[::-1])[::-1]  # over every G >= gens[i]
        at = least_above[np.searchsorted(gens, g)]
        out = np.where(cap >= n0, np.minimum(out, at), out)
    return out


@dataclass(frozen=True)
class TopInterval:
    """What the gains of one bucket's top intervals need: its requests' candidate indices ``j_of`` (sorted by
    gen), gens, the top candidate, psi at it (y2), the leave floors there and phi (see module docstring)."""

    prof: DeviceProfile
    max_batch: int | None
    j_of: np.ndarray
    g: np.ndarray
    top: int
    c: int
    y2: np.ndarray
    floors: np.ndarray
    phi: np.ndarray
    penalty: tuple[float, float] | None


def top_interval(prof: DeviceProfile, max_batch: int | None, S: np.ndarray, g: np.ndarray, cands: np.ndarray,
                 psi: np.ndarray, penalty: tuple[float, float] | None) -> TopInterval | None:
    """The context of ``gain`` for one bucket as one window (S, g its requests' entry shapes and gens sorted by
    gen, psi its per-shape prices at ``penalty``); None where a request cannot run at the top candidate (no
    gain is certified)."""
    j_of = np.searchsorted(cands, S)
    top = int(j_of.max())
    y2 = psi[:, top]
    if not np.all(np.isfinite(y2)):
        return None
    c = int(cands[top])
    return TopInterval(prof, max_batch, j_of, np.asarray(g, dtype=np.int64), top, c, y2,
                       leave_floor(prof, c, g, max_batch, penalty), suffix_min(psi), penalty)


def gain(ctx: TopInterval, lo: int) -> float:
    """max over the y tried of gain(a, y) for a = cands[lo] (lo = -1: no shape below), >= 0."""
    M = ctx.j_of > lo
    p_M = ctx.phi[M, ctx.top]
    q = np.minimum(ctx.phi[~M, lo], ctx.y2[~M]) if lo >= 0 else np.zeros(0)
    y1 = ctx.floors.copy()
    y1[M] = lp_duals(ctx.g[M], ctx.c, ctx.prof, ctx.max_batch, ctx.penalty)
    best = 0.0  # alpha = 0 (y = psi[., c]) gains sum_M (psi - phi) >= 0, which the loop includes
    for alpha in ALPHAS:
        y = alpha * y1 + (1.0 - alpha) * ctx.y2
        best = max(best, float((y[M] - p_M).sum() - np.maximum(q - y[~M], 0.0).sum()))
    return best


def gained_own_bound(own: np.ndarray, cands: np.ndarray, max_shapes: int, ctx: TopInterval, deadline: Deadline
                     ) -> tuple[float, int]:
    """``shapes.own_bound`` of a bucket's own table with the top interval's gains, computed lazily: the DP's best
    set names its top interval (its second shape from the top, or none); its gain is added and the DP run
    again until the best set's gain is already in.  Then the value equals the DP over every gain (gains only
    raise entries, so every other set is at least its lazy value), with a gain per DP rather than per
    candidate.  Stops at ``deadline`` with the gains found so far (each entry only ever raised: still valid).
    Returns (value, how many gains were computed)."""
    table = own.copy()
    done: set[int] = set()
    while True:
        value, shapes = own_bound(table, cands, ctx.top, max_shapes)
        lo = int(np.searchsorted(cands, shapes[-2])) if len(shapes) > 1 else -1
        if lo in done or deadline.expired():
            return value, len(done)
        table[lo + 1, ctx.top] += gain(ctx, lo)
        done.add(lo)
