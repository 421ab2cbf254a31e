"""One window's batches under a fixed shape set: the set-partitioning LP by column generation, a certified bound.

With the shapes fixed, a window's requests are covered by batches, each declared at a shape
of the set covering its members; a batch's cost is the cost model's ``batch_total`` at its
size, shape and longest gen.  Adding a member never makes a batch cheaper and dropping one
keeps it within the KV capacity, so covering every request at least once costs what
partitioning does, and the covering LP (x >= 0) is a relaxation of every plan of the window
under those shapes.

Pricing is exact.  At a shape s and a longest gen g, the members that may ride are those
with entry shape <= s and gen <= g; within a size class the time is ``fixed + n * per``
(``CostModel.linear_parts``) on sizes ``regime_range`` allows, so the most negative batch
takes the n largest duals, n over the allowed range: one sort per (shape, gen) and a prefix
sum price every column there is.

The bound.  For duals pi >= 0 of the restricted LP, any plan's cost is
``sum(pi) + sum over its batches of (cost - pi(batch)) >= sum(pi) + m * min(0, least reduced
cost)`` (a plan has at most m batches for m requests): a Lagrangian bound.  And with theta the
largest ratio pi(batch) / cost over every batch (priced exactly the same way), pi / theta is
dual feasible, so ``sum(pi) / max(1, theta)`` bounds the LP (Farley's bound).  Both hold at
every round and equal the LP optimum once nothing prices out; the best over the rounds is
returned.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from model.base.runtime import Deadline, check_interrupt
from model.cost.model import CostModel
from solvers.backends import get_backend
from solvers.backends.milp import Block, MipArrays
from solvers.backends.result import SolveOptions, Status

MAX_ROUNDS = 60
COLUMNS_PER_ROUND = 400
STABILITY = 0.7  # the centre's weight in the pricing point
CLEAR = 1e-6  # a reduced cost below -CLEAR * the batch's fixed time is a column to add (HiGHS's duals are
# feasible to about 1e-7: columns a hair below zero would come back every round)


@dataclass(frozen=True)
class WindowLP:
    """A window's certified lower bound under the shapes (compiles aside), whether column generation converged
    (then it is the LP optimum), and the rounds it took."""

    bound: float
    converged: bool
    rounds: int


def covering_lp(cols: list[tuple[float, np.ndarray]], m: int) -> MipArrays:
    """min cost.x, every request covered at least once, x >= 0 (one row per request, one column per batch)."""
    c = np.array([cost for cost, _ in cols])
    rows = np.concatenate([members for _, members in cols]).astype(np.int64)
    colix = np.repeat(np.arange(len(cols)), [len(members) for _, members in cols])
    return MipArrays(c, np.zeros(len(c)), np.full(len(c), np.inf), np.zeros(len(c), dtype=bool), rows, colix,
                     np.ones(len(rows)), np.ones(m), np.full(m, np.inf), (Block("batch", 0, len(c)),),
                     (Block("cover", 0, m),))


def price(cost: CostModel, S: np.ndarray, G: np.ndarray, shapes: np.ndarray, pi: np.ndarray,
          max_batch: int | None) -> tuple[float, float, list[tuple[float, float, np.ndarray, int]]]:
    """The least reduced cost of any batch under duals ``pi`` (0 when none is below), the largest ratio of a
    batch's duals to its cost, and every (shape, longest gen, size class)'s most negative batch: (reduced
    cost, cost, members, shape), most negative first, only those clearly below zero."""
    out = []
    least, ratio = 0.0, 0.0
    gens = np.unique(G)
    for s in shapes.tolist():
        ok = S <= s
        if not ok.any():
            continue
        levels = gens[gens >= G[ok].min()]
        # duals of the members that may ride at (s, g): column per level, sorted high to low
        elig = ok[None, :] & (G[None, :] <= levels[:, None])
        vals = np.where(elig, pi[None, :], -np.inf)
        order = np.argsort(-vals, axis=1, kind="stable")
        top = np.take_along_axis(vals, order, axis=1)
        count = elig.sum(axis=1)
        prefix = np.cumsum(np.where(np.isfinite(top), top, 0.0), axis=1)
        n = np.arange(1, len(S) + 1)
        for cls in cost.size_classes():
            fixed, per = cost.linear_parts(np.full(len(levels), s), levels, np.full(len(levels), cls))
            lo, hi = cost.regime_range(np.full(len(levels), s), levels, np.full(len(levels), cls), max_batch)
            hi = np.minimum(hi, count)
            allowed = (n[None, :] >= lo[:, None]) & (n[None, :] <= hi[:, None])
            rc = np.where(allowed, fixed[:, None] + n[None, :] * per[:, None] - prefix, np.inf)
            k = np.argmin(rc, axis=1)
            best = rc[np.arange(len(levels)), k]
            least = min(least, float(best.min(initial=0.0)))
            ratio = max(ratio, float(np.max(np.where(allowed, prefix / (fixed[:, None] + n[None, :] * per[:, None]),
                                                      0.0), initial=0.0)))
            for li in np.flatnonzero(best < -CLEAR * np.maximum(1.0, fixed)).tolist():
                size = int(k[li]) + 1
                members = np.sort(order[li, :size])
                true = float(cost.batch_total(size, s, int(G[members].max())))
                out.append((float(best[li]), true, members, int(s)))
    out.sort(key=lambda t: t[0])
    return least, ratio, out


def window_lp(cost: CostModel, S: np.ndarray, G: np.ndarray, shapes: np.ndarray, max_batch: int | None,
              start: list[tuple[float, np.ndarray]] = (), deadline: Deadline = Deadline.never(),
              center: np.ndarray | None = None, backend: str = "highs") -> WindowLP:
    """The certified bound on one window's batches under ``shapes`` (see the module docstring).  ``S`` are the
    requests' entry shapes, ``G`` their gens; ``start`` are (cost, members) columns to begin with (a plan's
    batches); every request alone at its smallest covering shape is always added (a cover exists).

    Column generation is stabilised (Wentges): columns are priced at a point between the restricted LP's duals
    and ``center``, the best dual point seen (its Farley-scaled duals, feasible); ``center`` may be given (the
    windowed bound's prices, so the result is never below them).  Where the mixed point prices nothing out,
    the restricted duals are priced alone next."""
    m = len(S)
    if m == 0:
        return WindowLP(0.0, True, 0)
    shapes = np.sort(np.asarray(shapes, dtype=np.int64))
    alone = shapes[np.searchsorted(shapes, S)]
    cols = [(float(cost.batch_total(1, int(alone[r]), int(G[r]))), np.array([r])) for r in range(m)]
    cols += [(float(c), np.asarray(mem, dtype=np.int64)) for c, mem in start]
    solver = get_backend(backend)
    have = {(int(alone[r]), (r,)) for r in range(m)}
    best, rounds, converged = 0.0, 0, False
    if center is not None:
        center = np.maximum(np.asarray(center, dtype=np.float64), 0.0)
        _, ratio, _ = price(cost, S, G, shapes, center, max_batch)
        center = center / max(1.0, ratio)
        best = float(center.sum())
    alpha = STABILITY if center is not None else 0.0
    for rounds in range(1, MAX_ROUNDS + 1):
        check_interrupt()
        res = solver.solve(covering_lp(cols, m), SolveOptions(time_limit=max(0.05, min(10.0, deadline.left())),
                                                              relax=True))
        if res.row_duals is None or res.status is not Status.OPTIMAL:
            break  # duals of an unfinished LP still give a valid bound below, but no sign of convergence
        pi = np.maximum(np.asarray(res.row_duals, dtype=np.float64), 0.0)
        point = pi if center is None else alpha * center + (1 - alpha) * pi
        least, ratio, found = price(cost, S, G, shapes, point, max_batch)
        value = float(point.sum()) / max(1.0, ratio)
        if value > best:
            best, center = value, point / max(1.0, ratio)
        best = max(best, float(point.sum()) + m * min(0.0, least))
        if not found:
            if alpha == 0.0:
                converged = True
                break
            alpha = 0.0  # the mixed point prices nothing: the restricted duals next
            continue
        alpha = STABILITY if center is not None else 0.0
        if deadline.expired():
            break
        fresh = [(true, members) for _, true, members, s in found[:COLUMNS_PER_ROUND]
                 if (s, tuple(members.tolist())) not in have]
        if not fresh and alpha == 0.0:
            break  # nothing new prices out at the restricted duals: the LP's tolerance, not a missing column
        have |= {(s, tuple(members.tolist())) for _, _, members, s in found[:COLUMNS_PER_ROUND]}
        cols += fresh
    return WindowLP(best, converged, rounds)
