"""The graph-choice MIP: open at most N graphs, and send every recorded demand where the stack's lookup would.

Both stacks look a step's graph up the same way once their graphs are written as
(batch, length) pairs in sorted order: the FIRST graph with batch >= n and length >= x
(gaudi's rule as it stands; nxdi's graphs all share one batch, so the first covering one
is the smallest covering bucket).  A plan that assigned a demand to a cheaper graph
further down the list would price a server that does not exist, so the model has
closest-assignment constraints: with c_1 < c_2 < ... < c_k the candidates covering a
demand, in lookup order, and w_i = "the demand runs on one of c_1..c_i",

    w_i >= y_{c_i}                 (an open candidate catches the demand if nothing before it did)
    w_i - w_{i-1} <= y_{c_i}       (the demand moves to c_i only if c_i is open)
    w_i >= w_{i-1},  w_k = 1       (it runs somewhere: no compile at run time)

and the cost of the demand is sum_i steps * t(c_i) * (w_i - w_{i-1}).  For integral y
the w are forced to 0/1 (0 before the first open covering candidate, 1 from it on), so
the w need not be integer variables, and the model has 3 rows per (demand, covering
candidate) pair, not one per pair of pairs.  Demands with the same set of covering
candidates are merged first (their steps add), which loses nothing.  The objective is
the busy time of the RECORDED steps (runtime compiles excluded: there are none), so
the MIP's bound and gap are for those steps and those candidates only; another graph
set changes the schedule, which only a replay can tell.  An optional slowdown limit
(latency: a padded step is slower for every request in it) forbids a demand the pairs
whose graph runs it more than that many times slower than a graph of its own size: the
pair's w_i - w_{i-1} is held at 0.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from model.domain.server import Graph
from solvers.backends import get_backend
from solvers.backends.milp import Block, MipArrays
from solvers.backends.result import SolveOptions, Status


@dataclass(frozen=True, eq=False)
class Family:
    """One kind of graph (prompt or decode): candidates in lookup order, their step times, the demands.

    ``cells`` rows are (n, x, steps) as ``model.serveplan.demands`` records them.
    """

    kind: str
    candidates: tuple[Graph, ...]
    step_ms: np.ndarray
    cells: np.ndarray
    exact_ms: np.ndarray | None = None  # per demand: its step time on a graph of its own dimensions
    slowdown: float | None = None  # a demand may run only on graphs at most this many times its exact time

    def __post_init__(self) -> None:
        if list(self.candidates) != sorted(set(self.candidates)):
            raise ValueError("candidates must be sorted and unique (the lookup order)")
        if len(self.step_ms) != len(self.candidates):
            raise ValueError("one step time per candidate")
        if self.slowdown is not None and (self.exact_ms is None or len(self.exact_ms) != len(self.cells)):
            raise ValueError("a slowdown limit needs every demand's exact step time")

    def allowed(self) -> np.ndarray:
        """(cells x candidates): the covering candidates a demand may run on under the slowdown limit.

        A demand no covering candidate meets the limit for may run on its fastest covering
        ones (the limit bounds padding; it cannot ask for a graph the grid lacks).
        """
        cover = self.cover()
        if self.slowdown is None or not cover.size:
            return cover
        ok = cover & (self.step_ms[None, :] <= self.slowdown * self.exact_ms[:, None] * (1 + 1e-12))
        none = ~ok.any(axis=1) & cover.any(axis=1)
        if none.any():
            times = np.where(cover[none], self.step_ms[None, :], np.inf)
            ok[none] = cover[none] & (times <= times.min(axis=1, keepdims=True))
        return ok

    def cover(self) -> np.ndarray:
        """Boolean (cells x candidates): candidate j can run demand i (batch >= n and length >= x)."""
        if not self.candidates:
            return np.zeros((len(self.cells), 0), dtype=bool)
        cand = np.asarray(self.candidates, dtype=np.int64)
        return (cand[None, :, 0] >= self.cells[:, None, 0]) & (cand[None, :, 1] >= self.cells[:, None, 1])


@dataclass(frozen=True)
class CoverReport:
    """The MIP's typed report: status, objective and bound (ms of the recorded steps), gap, time, backend."""

    status: Status
    objective: float | None
    bound: float | None
    time_s: float
    backend: str
    version: str
    columns: int
    rows: int
    merged_cells: int

    @property
    def gap(self) -> float | None:
        if self.objective is None or self.bound is None:
            return None
        return max(0.0, self.objective - self.bound) / self.objective if self.objective > 0 else 0.0


@dataclass(frozen=True)
class CoverResult:
    """The graphs the MIP opened per family (lookup order) and its report; ``graphs`` is None without a solution."""

    graphs: tuple[tuple[Graph, ...], ...] | None
    report: CoverReport


def uncovered(family: Family) -> np.ndarray:
    """Rows of the demands no candidate covers (the caller must refuse those: the stack would compile)."""
    return family.cells[~family.cover().any(axis=1)] if len(family.cells) else family.cells


def lookup_ms(family: Family, opened: tuple[Graph, ...], step_ms: Callable[[Graph], float] | None = None
              ) -> float | None:
    """The recorded steps' time on ``opened`` by the stack's lookup (first covering graph in sorted order).

    None when some demand has no covering graph, or (candidates only) lands on one its
    slowdown limit forbids.  The check on the MIP: it must agree.  ``step_ms`` prices
    graphs that are not candidates (by default only candidates are; the limit is then not checked).
    """
    index = {g: j for j, g in enumerate(family.candidates)}
    allowed = family.allowed() if step_ms is None else None
    times = step_ms or (lambda g: float(family.step_ms[index[g]]))
    order = sorted(opened)
    total = 0.0
    for i, (n, x, steps) in enumerate(family.cells.tolist()):
        hit = next((g for g in order if g[0] >= n and g[1] >= x), None)
        if hit is None or (allowed is not None and not allowed[i, index[hit]]):
            return None
        total += steps * times(hit)
    return total


def _merged(family: Family) -> tuple[list[np.ndarray], list[np.ndarray], np.ndarray]:
    """Per distinct (cover set, allowed set): the covering candidates (ascending), which of them the demand may
    run on, and the steps of the demands sharing both."""
    cover, allowed = family.cover(), family.allowed()
    if not len(cover):
        return [], [], np.zeros(0)
    keys, inverse = np.unique(np.packbits(np.concatenate([cover, allowed], axis=1), axis=1), axis=0,
                              return_inverse=True)
    steps = np.bincount(inverse.ravel(), weights=family.cells[:, 2].astype(float), minlength=len(keys))
    first = np.zeros(len(keys), dtype=np.int64)
    first[inverse.ravel()[::-1]] = np.arange(len(cover))[::-1]
    covers = [np.flatnonzero(cover[i]) for i in first]
    return covers, [allowed[i, c] for i, c in zip(first, covers, strict=True)], steps


def build(families: tuple[Family, ...], max_graphs: int) -> tuple[MipArrays, list[int], int]:
    """The MIP as arrays (columns: one binary per candidate, then one w per (cell, covering candidate) pair).

    Returns the model, the candidate offset of each family and the number of merged demands.
    """
    offsets, total = [], 0
    for f in families:
        offsets.append(total)
        total += len(f.candidates)
    pair_cand, pair_cell, pair_first, pair_last, pair_coef, pair_ok = [], [], [], [], [], []
    cells = 0
    for f, off in zip(families, offsets, strict=True):
        covers, oks, steps = _merged(f)
        for idx, ok, w in zip(covers, oks, steps, strict=True):
            pair_ok.append(ok)
            if idx.size == 0:
                raise ValueError(f"a {f.kind} demand has no covering candidate")
            t = f.step_ms[idx]
            nxt = np.append(t[1:], 0.0)
            pair_cand.append(idx + off)
            pair_coef.append(w * (t - nxt))
            first = np.zeros(idx.size, dtype=bool)
            first[0] = True
            last = np.zeros(idx.size, dtype=bool)
            last[-1] = True
            pair_first.append(first)
            pair_last.append(last)
            pair_cell.append(np.full(idx.size, cells))
            cells += 1
    cand = np.concatenate(pair_cand) if pair_cand else np.zeros(0, dtype=np.int64)
    coef = np.concatenate(pair_coef) if pair_coef else np.zeros(0)
    first = np.concatenate(pair_first) if pair_first else np.zeros(0, dtype=bool)
    last = np.concatenate(pair_last) if pair_last else np.zeros(0, dtype=bool)
    ok = np.concatenate(pair_ok) if pair_ok else np.zeros(0, dtype=bool)
    p = cand.size
    w = total + np.arange(p)  # the w column of each pair
    # row kinds, each one row per pair: (c) w_i - y >= 0; (b) w_i - w_{i-1} - y <= 0; (a) w_i - w_{i-1} >= 0
    r_c = np.arange(p)
    r_b = p + np.arange(p)
    prev = ~first
    a_pairs = np.flatnonzero(prev)
    r_a = 2 * p + np.arange(a_pairs.size)
    card = 2 * p + a_pairs.size
    rows = np.concatenate([r_c, r_c, r_b, r_b, r_b[prev], r_a, r_a, np.full(total, card)])
    cols = np.concatenate([w, cand, w, cand, w[prev] - 1, w[a_pairs], w[a_pairs] - 1, np.arange(total)])
    vals = np.concatenate([np.ones(p), -np.ones(p), np.ones(p), -np.ones(p), -np.ones(int(prev.sum())),
                           np.ones(a_pairs.size), -np.ones(a_pairs.size), np.ones(total)])
    n_rows = card + 1
    row_lo = np.concatenate([np.zeros(p), np.full(p, -np.inf), np.zeros(a_pairs.size), [-np.inf]])
    # a pair the slowdown limit forbids takes no demand: w_i = w_{i-1} (w_i = 0 for a first pair)
    row_hi = np.concatenate([np.full(p, np.inf), np.zeros(p), np.where(ok[a_pairs], np.inf, 0.0),
                             [float(max_graphs)]])
    c = np.concatenate([np.zeros(total), coef])
    scale = max(1.0, float(np.abs(coef).max(initial=0.0)))
    lb = np.zeros(total + p)
    lb[total + np.flatnonzero(last)] = 1.0  # w_k = 1: every demand runs on a warm graph
    ub = np.ones(total + p)
    ub[total + np.flatnonzero(first & ~ok)] = 0.0
    integer = np.concatenate([np.ones(total, dtype=bool), np.zeros(p, dtype=bool)])
    model = MipArrays(c / scale, lb, ub, integer, rows.astype(np.int64), cols.astype(np.int64), vals, row_lo, row_hi,
                      (Block("open", 0, total), Block("assign", total, total + p)),
                      (Block("catch", 0, p), Block("move", p, 2 * p), Block("order", 2 * p, card),
                       Block("graphs", card, n_rows)), scale=scale)
    return model, offsets, cells


def solve_cover(families: tuple[Family, ...], max_graphs: int, backend: str = "highs",
                time_limit: float = 60.0) -> CoverResult:
    """Open at most ``max_graphs`` candidates minimising the recorded steps' time under the lookup rule."""
    model, offsets, merged = build(families, max_graphs)
    engine = get_backend(backend)
    res = engine.solve(model, SolveOptions(time_limit=max(0.1, time_limit), mip_gap=1e-6))
    report = CoverReport(res.status, res.objective, res.bound, res.time_s, res.backend, res.version, model.n_cols,
                         model.n_rows, merged)
    if res.x is None:
        return CoverResult(None, report)
    y = res.x[:offsets[-1] + len(families[-1].candidates)] if families else np.zeros(0)
    graphs = tuple(tuple(g for j, g in enumerate(f.candidates) if y[off + j] > 0.5)
                   for f, off in zip(families, offsets, strict=True))
    return CoverResult(graphs, report)
