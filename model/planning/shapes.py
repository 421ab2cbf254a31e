"""Strict and device mode: choosing the K compiled shapes, with a certified bound, by dynamic programming.

In these modes every member pays prefill and decode at its batch's declared shape, so
the shape set Y decides most of the cost.  Relax everything but the shape cap:

  * a request r costs at least floor(y(r), G_r), y(r) = the smallest shape in Y >= S_r
    (``boxes.request_floor``: its per-member cost, grown with both t and g, plus in
    device mode its least share of a batch's fixed time);
  * each shape that serves requests of a bucket costs at least one batch overhead
    (analytic modes; device mode already spread it over the members);
  * each bucket compiles at least the shape that covers its longest prompt.

For a sorted Y this cost is a sum over the intervals (y_{i-1}, y_i] of the sorted
candidate shapes, so the best Y with |Y| <= K is a shortest path with K edges over
the candidates: exact, O(K T^2).  Its value is a valid lower bound on any plan (the
limits are dropped, which only loosens it); its Y is where the MIP then searches.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from model.formulation.boxes import BucketModel, batch_floor, request_floor, shape_compile
from model.runtime import Deadline


@dataclass(frozen=True)
class ShapeChoice:
    """The relaxation's optimum: its value (a lower bound) and the shapes achieving it."""

    bound: float
    shapes: tuple[int, ...]


def interval_costs(bms: list[BucketModel], shapes: np.ndarray, deadline: Deadline = Deadline.never()) -> np.ndarray:
    """cost[lo+1, hi]: relaxed cost of serving every request with S in (shapes[lo], shapes[hi]] at shapes[hi].

    Row 0 stands for "no shape below" (lo = -1); entries with lo >= hi are +inf.
    Raises DeadlineExceeded if ``deadline`` passes first.
    """
    T = len(shapes)
    acc = np.zeros((T + 1, T))
    for bm in bms:
        hist = bm.hist
        j_of_cell = np.searchsorted(shapes, hist.S)  # every cell's S (or smallest allowed shape above) is a candidate
        compile_ = shape_compile(shapes, bm.params)
        s_max_j = int(np.searchsorted(shapes, hist.S.max()))
        has_j = np.bincount(j_of_cell, minlength=T) > 0
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
            suffix = np.cumsum(per_j[::-1])[::-1]  # suffix[r] = cost of S indices r..hi
            any_req = np.cumsum(has_j[:hi + 1][::-1])[::-1] > 0
            r = np.arange(hi + 1)  # r = lo + 1
            acc[r, hi] += (suffix + batch_floor(bm) * any_req
                           + compile_[hi] * ((r <= s_max_j) & (s_max_j <= hi)))
    valid = np.arange(T + 1)[:, None] <= np.arange(T)[None, :]
    return np.where(valid, acc, np.inf)


def choose_shapes(bms: list[BucketModel], shapes: np.ndarray, max_shapes: int,
                  deadline: Deadline = Deadline.never()) -> ShapeChoice:
    """Best shape set of size <= K under the relaxation (shortest path with at most K edges).

    Raises DeadlineExceeded if ``deadline`` passes first.
    """
    cost = interval_costs(bms, shapes, deadline)
    top = int(np.searchsorted(shapes, max(int(bm.hist.S.max()) for bm in bms)))
    f = [cost[0]]  # f[k-1][hi]: best with k shapes, the highest being shapes[hi], all S <= shapes[hi] served
    back = [np.full(len(shapes), -1)]
    for _ in range(2, max_shapes + 1):
        deadline.tick("shape relaxation")
        cand = f[-1][:, None] + cost[1:, :]  # [lo, hi]
        back.append(np.argmin(cand, axis=0))
        f.append(cand[back[-1], np.arange(len(shapes))])
    k = int(np.argmin([fk[top] for fk in f]))
    picks, hi = [top], top
    for kk in range(k, 0, -1):
        hi = int(back[kk][hi])
        picks.append(hi)
    return ShapeChoice(float(f[k][top]), tuple(int(shapes[i]) for i in sorted(picks)))
