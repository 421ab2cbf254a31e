"""Strict and device mode: choosing the K compiled shapes, with a certified bound, by dynamic programming.

In these modes every member pays prefill and decode at its batch's declared shape, so
the shape set decides most of the cost.  Relax everything but the shape cap: a request
r costs at least floor(y(r), G_r), y(r) = the smallest shape of the set >= S_r
(``boxes.request_floor``: its per-member cost, grown with both t and g, plus in device
mode its least share of a batch's fixed time).  For a sorted set this is a sum over its
intervals (y_{i-1}, y_i], so the best set of at most K shapes is a shortest path with K
edges over the candidates (``shape_dp``): exact, O(K T^2).  Two such bounds hold:

  * per bucket, over the shapes U_b it uses: each of them costs the bucket its compile
    and at least one batch overhead (analytic modes; device mode spread the overhead
    over the members), whether or not requests have it as their smallest.  Any plan
    costs the bucket at least this for its own U_b (|U_b| <= K), so at least its
    minimum over every set: the sum over buckets is a bound;
  * jointly, over Y = the union of the U_b (|Y| <= K): a bucket need not use a shape of
    Y that covers some of its requests (they may ride higher, sharing batches), so only
    its longest prompt's interval is charged: one compile (of the smallest shape of Y
    covering it, which it must compile or pay more) and one batch overhead.
    Charging a batch overhead on every interval holding requests of the bucket, as this
    module once did, is not valid with several buckets: a bucket with one request in
    each of two intervals can run both in one batch at the upper shape.

The bound is the larger of the two (for one bucket they coincide, with the first's
charges); the shapes searched are the DP's under the estimate "each bucket pays a compile
and an overhead for every shape at which it has requests", a guide, not a bound.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from model.base.runtime import Deadline
from model.formulation.boxes import BucketModel, request_floor


@dataclass(frozen=True)
class ShapeChoice:
    """The relaxation's optimum: its value (a lower bound) and the shapes achieving it."""

    bound: float
    shapes: tuple[int, ...]


def floor_table(bm: BucketModel, shapes: np.ndarray, deadline: Deadline = Deadline.never()) -> np.ndarray:
    """floors[lo+1, hi]: the summed floors of one bucket's requests with S in (shapes[lo], shapes[hi]] run at
    shapes[hi] (row 0 stands for "no shape below"; entries with lo >= hi are meaningless, see ``shape_dp``).

    Raises DeadlineExceeded if ``deadline`` passes first.
    """
    T = len(shapes)
    acc = np.zeros((T + 1, T))
    hist = bm.hist
    j_of_cell = np.searchsorted(shapes, hist.S)  # every cell's S (or smallest allowed shape above) is a candidate
    # cells by shape index, so the cells that fit under shapes[hi] are a prefix; floors depend on the
    # gen alone, so they are priced once per distinct gen (thousands) rather than per cell
    order = np.argsort(j_of_cell, kind="stable")
    j_sorted, count_sorted = j_of_cell[order], hist.count[order].astype(np.float64)
    gens, gen_of = np.unique(hist.G[order], return_inverse=True)
    ends = np.searchsorted(j_sorted, np.arange(T), side="right")
    for hi in range(T):
        deadline.tick("shape relaxation", "shape %d of %d", hi, T)
        n = ends[hi]
        unit = request_floor(bm, np.int64(shapes[hi]), gens)[gen_of[:n]]
        per_j = np.bincount(j_sorted[:n], weights=count_sorted[:n] * unit, minlength=T)[:hi + 1]
        acc[:hi + 1, hi] = np.cumsum(per_j[::-1])[::-1]  # S indices r..hi, r = lo + 1
    return acc


def _dp_tables(acc: np.ndarray, max_shapes: int, deadline: Deadline) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(f, back): f[k-1][hi] the least summed interval cost with exactly k shapes, the highest cands[hi], and
    back[k-1][hi] the index of the shape below it (a shortest path with k edges)."""
    T = acc.shape[1]
    valid = np.arange(T + 1)[:, None] <= np.arange(T)[None, :]
    cost = np.where(valid, acc, np.inf)
    f = [cost[0]]
    back = [np.full(T, -1)]
    for _ in range(1, max_shapes):
        deadline.tick("shape relaxation")
        cand = f[-1][:, None] + cost[1:, :]  # [lo, hi]
        back.append(np.argmin(cand, axis=0))
        f.append(cand[back[-1], np.arange(T)])
    return f, back


def _backtrack(back: list[np.ndarray], cands: np.ndarray, top: int, k: int) -> tuple[int, ...]:
    """The shapes of the best path with k + 1 shapes ending at cands[top]."""
    picks, hi = [top], top
    for kk in range(k, 0, -1):
        hi = int(back[kk][hi])
        picks.append(hi)
    return tuple(int(cands[i]) for i in sorted(picks))


def shape_dp(acc: np.ndarray, cands: np.ndarray, max_shapes: int, top: int | None = None,
             deadline: Deadline = Deadline.never()) -> tuple[float, tuple[int, ...]]:
    """min over shape sets Y (|Y| <= K, the largest Y = cands[top] covering every request) of the summed
    interval costs ``acc`` (acc[lo + 1, hi], row 0 for "no shape below"): (value, argmin Y).  Exact: a
    shortest path with at most K edges."""
    top = len(cands) - 1 if top is None else top
    f, back = _dp_tables(acc, max_shapes, deadline)
    k = int(np.argmin([fk[top] for fk in f]))
    return float(f[k][top]), _backtrack(back, cands, top, k)


def shape_sets(acc: np.ndarray, cands: np.ndarray, max_shapes: int, top: int | None = None,
               deadline: Deadline = Deadline.never()) -> tuple[tuple[int, ...], ...]:
    """``shape_dp``'s argmin under every cap k = 1..K (the best set of at most k shapes): the windowed planner
    starts its shape search from each, so a cap K never plans from worse shapes than the cap K - 1 would."""
    top = len(cands) - 1 if top is None else top
    f, back = _dp_tables(acc, max_shapes, deadline)
    out, best = [], None
    for k in range(len(f)):
        if best is None or f[k][top] < f[best][top]:
            best = k
        if np.isfinite(f[best][top]):
            out.append(_backtrack(back, cands, top, best))
    return tuple(dict.fromkeys(out))


def charged_tables(floors: np.ndarray, charge: np.ndarray, top: int) -> tuple[np.ndarray, np.ndarray]:
    """One bucket's interval tables with ``charge[hi]``, what using shape hi costs it at least (its compile,
    and a batch overhead where one holds): (own, joint).  Own charges every interval -- valid over the shapes
    the bucket itself uses, for its own bound ``own_bound``; joint charges only the intervals holding its
    longest prompt (candidate index ``top``) -- valid for any joint set (see module docstring)."""
    T = floors.shape[1]
    holds_top = (np.arange(T + 1)[:, None] <= top) & (top <= np.arange(T)[None, :])
    return floors + charge[None, :], floors + np.where(holds_top, charge[None, :], 0.0)


def own_bound(own: np.ndarray, cands: np.ndarray, top: int, max_shapes: int,
              deadline: Deadline = Deadline.never()) -> tuple[float, tuple[int, ...]]:
    """``shape_dp`` of one bucket's own table over the candidates up to its longest prompt's."""
    return shape_dp(own[:top + 2, :top + 1], cands[:top + 1], max_shapes, deadline=deadline)


def choose_shapes(bms: list[BucketModel], shapes: np.ndarray, max_shapes: int,
                  deadline: Deadline = Deadline.never()) -> ShapeChoice:
    """The certified bound (the larger of the per-bucket and the joint relaxation, see module docstring) and
    the shapes the guide DP picks.  Raises DeadlineExceeded if ``deadline`` passes first."""
    T = len(shapes)
    joint = np.zeros((T + 1, T))
    guide = np.zeros((T + 1, T))
    own, top = 0.0, 0
    for bm in bms:
        floors = floor_table(bm, shapes, deadline)
        j_of = np.searchsorted(shapes, bm.hist.S)
        b_top = int(j_of.max())
        used = bm.cost.shape_charge(shapes) + bm.cost.batch_floor  # what each shape it uses costs a bucket
        own_table, joint_table = charged_tables(floors, used, b_top)
        joint += joint_table
        own += own_bound(own_table, shapes, b_top, max_shapes, deadline)[0]
        has = np.bincount(j_of, minlength=T) > 0
        # any_req[r, hi]: the bucket has requests with shape index in [r, hi]
        any_req = (np.cumsum(np.r_[0, has])[None, 1:] - np.cumsum(np.r_[0, has])[:, None]) > 0
        guide += floors + np.where(any_req, used[None, :], 0.0)
        top = max(top, b_top)
    joint_bound = shape_dp(joint, shapes, max_shapes, top, deadline)[0] if len(bms) > 1 else -np.inf
    _, chosen = shape_dp(guide, shapes, max_shapes, top, deadline)
    return ShapeChoice(max(own, joint_bound), chosen)
