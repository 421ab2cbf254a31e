"""Device mode: one bucket's batches under a FIXED shape set, bounded by the set-partitioning LP with its P95 row.

What it answers.  The planner's certified bound holds for every shape set, so it cannot tell how
far a plan's batching is from the best its own shapes allow.  This LP can: for the requests of one
bucket and a shape set Y, any plan that declares only shapes of Y (and meets the bucket's P95 limit)
costs, compiles aside, at least ``ShapeLP.bound``.  It is no bound on plans with other shapes.

The LP.  Requests are cells (interval of Y their prompt falls in, gen) with counts n_c: two requests
of one cell can ride in exactly the same batches.  A box is (shape s of Y, longest gen g, size range
[a, b]) on which a batch's time is ``fixed + n * per`` (``CostModel.linear_parts`` within a size
class, the class's range cut by the KV capacity, the batch-size cap and the box's supply) and its P95
status is fixed: each size class is split at the largest n whose batch stays within the limit (where
the next size is over by a float's rounding or less, both ranges take it, so rounding can only relax).
The batches of one box form a cone: m batches holding w_c members of cell c are a sum of real batches iff

    a * m <= sum_c w_c <= b * m,   0 <= w_c <= n_c * m,   w_c = 0 unless c is eligible (S <= s, G <= g),

(the size constraint and the caps form an interval matrix, so the cone's extreme rays are real
batches): with cost ``fixed * m + per * sum w``, this is exactly the set-partitioning LP's
column space for that box, and the members of batches over the limit enter the P95 row
``sum over members <= allowed_above(n)``.  Every other limit is dropped and spikes are ignored: both
only relax.

Box generation.  The restricted LP holds the boxes added so far (the plan's own first, and every
cell alone at its smallest shape so a cover exists); a box's least reduced cost under duals (pi, mu)
is ``min over n in [a, b] of fixed + n * (per + mu * over) - (the n largest pi among its eligible
members)``, which one sort per shape and a prefix sum give for every box at once; the boxes most
below zero join with their whole cone.  A cone at a time needs few rounds (three on the embedded
default with the plan's batches as start), where single batches stall for hundreds.

The bound.  For any pi >= 0, mu >= 0 and any plan of m batches meeting the P95 limit, cost >=
sum_c n_c pi_c - mu * A + m * min(0, least reduced cost), and m <= the number of requests: a
Lagrangian bound at every round, the LP optimum once nothing prices out.  The best over the rounds
is returned, lowered by a relative 1e-9 for the float sums.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from model.base.runtime import Deadline, check_interrupt
from model.cost.common import allowed_above
from model.cost.model import CostModel
from solvers.backends import get_backend
from solvers.backends.milp import Block, MipArrays
from solvers.backends.result import SolveOptions, Status

MAX_ROUNDS = 200
BOXES_PER_ROUND = 60
PRICE_BLOCK = 2_000_000  # (gen levels x cells) entries priced at once: bounds memory on long traces
CLEAR = 1e-7  # a box joins when its reduced cost is below -CLEAR * its fixed time (the LP's duals are feasible
# to about 1e-7: boxes a hair below zero would come back every round)
ROUNDING = 1e-12  # a batch time this close to the limit may be on either side of it
SAFETY = 1e-9  # the bound is lowered by this share of its size: float sums cannot raise it


@dataclass(frozen=True)
class ShapeLP:
    """The certified bound on one bucket's batches (compiles aside) for plans declaring only the given shapes,
    whether the LP converged (then the bound is the LP optimum), its rounds and the boxes it ended with."""

    bound: float
    converged: bool
    rounds: int
    boxes: int


@dataclass(frozen=True, eq=False)
class Cells:
    """Requests grouped by (smallest covering shape's index, gen): what a fixed shape set tells apart."""

    j: np.ndarray
    G: np.ndarray
    n: np.ndarray


@dataclass(frozen=True, eq=False)
class Boxes:
    """Every box (see module docstring) as arrays: shape index, gen, linear parts, size range, over the limit."""

    i: np.ndarray
    g: np.ndarray
    fixed: np.ndarray
    per: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    over: np.ndarray


def cells_of(S: np.ndarray, G: np.ndarray, shapes: np.ndarray) -> Cells:
    """The cells of requests with entry shapes S and gens G under the sorted ``shapes`` (all must fit)."""
    j = np.searchsorted(shapes, S)
    if (j >= len(shapes)).any():
        raise ValueError("a request's prompt is above every shape of the set")
    key, n = np.unique(np.stack([j, G], axis=1), axis=0, return_counts=True)
    return Cells(key[:, 0], key[:, 1], n)


def over_split(fixed: np.ndarray, per: np.ndarray, limit: float) -> np.ndarray:
    """The largest n whose time fixed + n * per stays within ``limit`` (-1: none; a large number: all)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        n = np.floor((limit - fixed) / per)
    n = np.where(per > 0, n, np.where(fixed <= limit, np.iinfo(np.int32).max, -1))
    return np.clip(n, -1, np.iinfo(np.int32).max).astype(np.int64)


def all_boxes(cost: CostModel, cells: Cells, shapes: np.ndarray, limit: float | None, max_batch: int | None
              ) -> Boxes:
    """Every box: each shape, each gen of a cell that fits under it, each size class split at the limit."""
    parts = []
    for i, s in enumerate(shapes.tolist()):
        fits = cells.j <= i
        gens = np.unique(cells.G[fits])
        if not len(gens):
            continue
        supply = np.cumsum(np.bincount(np.searchsorted(gens, cells.G[fits]), weights=cells.n[fits],
                                       minlength=len(gens))).astype(np.int64)
        t = np.full(len(gens), s, dtype=np.int64)
        for cls in cost.size_classes():
            k = np.full(len(gens), cls)
            fixed, per = (np.asarray(v, dtype=np.float64) for v in cost.linear_parts(t, gens, k))
            lo, hi = (np.asarray(v, dtype=np.int64) for v in cost.regime_range(t, gens, k, max_batch))
            hi = np.minimum(hi, supply)
            if limit is None:
                ranges = [(lo, hi, False)]
            else:
                split = over_split(fixed, per, limit)
                # the size just past the split counts as within the limit too where float rounding could decide
                close = fixed + (split + 1) * per - limit <= ROUNDING * limit
                ranges = [(lo, np.minimum(hi, split + close), False), (np.maximum(lo, split + 1), hi, True)]
            for a, b, over in ranges:
                ok = a <= b
                parts.append((np.full(ok.sum(), i), gens[ok], fixed[ok], per[ok], a[ok], b[ok],
                              np.full(ok.sum(), over)))
    cols = [np.concatenate([p[k] for p in parts]) if parts else np.zeros(0) for k in range(7)]
    return Boxes(cols[0].astype(np.int64), cols[1].astype(np.int64), cols[2].astype(np.float64),
                 cols[3].astype(np.float64), cols[4].astype(np.int64), cols[5].astype(np.int64),
                 cols[6].astype(bool))


def eligible(cells: Cells, boxes: Boxes, k: int) -> np.ndarray:
    """The cells that may ride in box k."""
    return np.flatnonzero((cells.j <= boxes.i[k]) & (cells.G <= boxes.g[k]))


def least_reduced_costs(cells: Cells, boxes: Boxes, pi: np.ndarray, mu: float) -> np.ndarray:
    """Every box's most negative batch: min over n in its range of fixed + n * (per + mu * over) - the n
    largest duals among its eligible members (with their counts).  A box's members are those of its shape with
    gen <= its gen, so the cumulative counts and prices are built once per distinct gen (several boxes share
    one: size classes, over the limit or not) and each box finds its size by a search along its gen's row."""
    rc = np.full(len(boxes.i), np.inf)
    for i in np.unique(boxes.i).tolist():
        members = np.flatnonzero(cells.j <= i)
        order = members[np.argsort(-pi[members], kind="stable")]
        p, n, G = pi[order], cells.n[order], cells.G[order]
        at = np.flatnonzero(boxes.i == i)
        gens, row = np.unique(boxes.g[at], return_inverse=True)
        step = max(1, PRICE_BLOCK // max(1, len(order)))
        for lo in range(0, len(gens), step):
            ug = gens[lo:lo + step]
            sel = np.flatnonzero((row >= lo) & (row < lo + len(ug)))
            ks, r = at[sel], row[sel] - lo
            take = np.where(G[None, :] <= ug[:, None], n[None, :], 0)
            cum = np.cumsum(take, axis=1)
            csum = np.cumsum(take * p[None, :], axis=1)
            pe = boxes.per[ks] + mu * boxes.over[ks]
            above = np.searchsorted(-p, -pe, side="left")  # how many members are priced above pe
            worth = np.where(above > 0, cum[r, np.maximum(above - 1, 0)], 0)
            size = np.clip(worth, boxes.lo[ks], np.maximum(boxes.lo[ks], boxes.hi[ks]))
            # the first member whose cumulative count reaches the size: one search over the rows end to end
            span = int(cum[:, -1].max(initial=0)) + int(size.max(initial=0)) + 1
            flat = (cum + np.arange(len(ug))[:, None] * span).ravel()
            at_n = np.searchsorted(flat, size + r * span, side="left") - r * len(order)
            at_n = np.minimum(at_n, len(order) - 1)
            prefix = csum[r, at_n] - (cum[r, at_n] - size) * p[at_n]
            fine = size <= cum[r, -1]
            rc[ks] = np.where(fine, boxes.fixed[ks] + size * pe - prefix, np.inf)
    return rc


def box_of_batch(boxes: Boxes, i: int, g: int, n: int, over: bool) -> int | None:
    """The box that holds a batch of n members at shape index i with longest gen g (None if none does)."""
    k = np.flatnonzero((boxes.i == i) & (boxes.g == g) & (boxes.lo <= n) & (boxes.hi >= n) & (boxes.over == over))
    return int(k[0]) if len(k) else None


def restricted_lp(cells: Cells, boxes: Boxes, chosen: list[int], allowed: int | None, slack_cost: float
                  ) -> MipArrays:
    """The LP over the chosen boxes' cones: cover rows (>= n_c), the P95 row (<= allowed, with a dear slack so
    it always solves), and per box its two size rows and one cap row per eligible cell."""
    m = len(cells.n)
    c, rows, cols, vals = [], [], [], []
    row_lo = list(cells.n.astype(np.float64))
    row_hi = [np.inf] * m
    p95 = None
    if allowed is not None:
        p95 = m
        row_lo.append(-np.inf)
        row_hi.append(float(allowed))
        c.append(slack_cost)
        rows.append(p95)
        cols.append(0)
        vals.append(-1.0)
    for k in chosen:
        el = eligible(cells, boxes, k)
        mcol, r = len(c), len(row_lo)
        c.append(float(boxes.fixed[k]))
        w = np.arange(mcol + 1, mcol + 1 + len(el))
        c.extend([float(boxes.per[k])] * len(el))
        # size rows: sum w - hi m <= 0 and sum w - lo m >= 0; cap rows: w_c - n_c m <= 0
        row_lo += [-np.inf, 0.0] + [-np.inf] * len(el)
        row_hi += [0.0, np.inf] + [0.0] * len(el)
        caps = np.arange(r + 2, r + 2 + len(el))
        parts = [(el, w, np.ones(len(el))), (np.full(len(el), r), w, np.ones(len(el))),
                 (np.full(len(el), r + 1), w, np.ones(len(el))), (np.array([r, r + 1]), np.array([mcol, mcol]),
                                                                   -np.array([boxes.hi[k], boxes.lo[k]], float)),
                 (caps, w, np.ones(len(el))), (caps, np.full(len(el), mcol), -cells.n[el].astype(np.float64))]
        if boxes.over[k]:
            parts.append((np.full(len(el), p95), w, np.ones(len(el))))
        for a, b, v in parts:
            rows.append(a)
            cols.append(b)
            vals.append(v)
    flat = [np.atleast_1d(np.asarray(x)) for x in rows]
    n_cols = len(c)
    return MipArrays(np.asarray(c, dtype=np.float64), np.zeros(n_cols), np.full(n_cols, np.inf),
                     np.zeros(n_cols, dtype=bool), np.concatenate(flat).astype(np.int64),
                     np.concatenate([np.atleast_1d(np.asarray(x)) for x in cols]).astype(np.int64),
                     np.concatenate([np.atleast_1d(np.asarray(x, dtype=np.float64)) for x in vals]),
                     np.asarray(row_lo), np.asarray(row_hi), (Block("lp", 0, n_cols),),
                     (Block("cover", 0, m),) + ((Block("p95", m, m + 1),) if p95 is not None else ()))


def shape_lp(cost: CostModel, S: np.ndarray, G: np.ndarray, shapes, limit: float | None = None,
             max_batch: int | None = None, start: list[tuple[int, np.ndarray]] = (),
             deadline: Deadline = Deadline.never(), backend: str = "highs") -> ShapeLP:
    """The certified bound on the batches of any plan of these requests (entry shapes S, gens G) that declares
    only ``shapes`` and keeps the P95 latency within ``limit`` (see the module docstring); ``start`` are a
    plan's batches as (declared shape, member indices), whose boxes join first.  Cut by ``deadline``: the best
    Lagrangian bound so far (valid), ``converged`` False."""
    S, G = np.asarray(S, dtype=np.int64), np.asarray(G, dtype=np.int64)
    if len(S) == 0:
        return ShapeLP(0.0, True, 0, 0)
    shapes = np.unique(np.asarray(shapes, dtype=np.int64))
    cells = cells_of(S, G, shapes)
    allowed = allowed_above(len(S)) if limit is not None else None
    boxes = all_boxes(cost, cells, shapes, limit, max_batch)
    chosen: list[int] = []

    def join(i: int, g: int, n: int) -> None:
        """The box of a batch of n members at shapes[i] with longest gen g joins the LP (once)."""
        over = limit is not None and float(cost.batch_total(n, int(shapes[i]), g)) > limit
        k = box_of_batch(boxes, i, g, n, over)
        if k is not None and k not in chosen:
            chosen.append(k)

    for c in range(len(cells.n)):  # every cell alone at its smallest shape: a cover exists
        join(int(cells.j[c]), int(cells.G[c]), 1)
    for s, members in start:
        i = int(np.searchsorted(shapes, s))
        if i < len(shapes) and shapes[i] == s and len(members):
            join(i, int(G[members].max()), len(members))
    solver = get_backend(backend)
    slack_cost = 1e3 * float(cost.batch_total(1, int(shapes[-1]), int(G.max()))) * len(S)
    best, rounds, converged = -np.inf, 0, False
    for rounds in range(1, MAX_ROUNDS + 1):
        check_interrupt()
        if deadline.expired():
            break
        res = solver.solve(restricted_lp(cells, boxes, chosen, allowed, slack_cost),
                           SolveOptions(time_limit=max(0.05, deadline.left()), relax=True))
        if res.row_duals is None or res.status is not Status.OPTIMAL:
            break  # an unfinished LP: the bound so far stands
        duals = np.asarray(res.row_duals, dtype=np.float64)
        pi = np.maximum(duals[:len(cells.n)], 0.0)
        mu = max(0.0, -float(duals[len(cells.n)])) if allowed is not None else 0.0
        rc = least_reduced_costs(cells, boxes, pi, mu)
        least = float(min(0.0, rc.min(initial=0.0)))
        value = float(cells.n @ pi) - mu * (allowed or 0) + len(S) * least
        best = max(best, value - SAFETY * abs(value))
        fresh = np.flatnonzero(rc < -CLEAR * np.maximum(boxes.fixed, 1.0))
        fresh = fresh[~np.isin(fresh, chosen)]
        if not len(fresh):
            converged = True  # nothing outside the LP prices out: the LP optimum, to the LP's tolerance
            break
        chosen += fresh[np.argsort(rc[fresh], kind="stable")][:BOXES_PER_ROUND].tolist()
    return ShapeLP(best, converged, rounds, len(chosen))
