"""Restrictions (which boxes and arcs a model holds) and the MIP solves over them.

A solution is carried between restrictions as an ``Assignment`` -- batches per box and
requests per (cell, box) keyed by grid index -- so an incumbent or a packer's plan
can warm-start any bigger model without caring where its columns sit.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from model.base.runtime import Deadline, interrupted
from model.domain.schema import Batching, Problem
from model.formulation.arrays import Restriction, build_model, restriction, spike_arcs
from model.formulation.boxes import BucketModel, Grid, arc_violates, variant_of_size, variant_range
from model.formulation.pricing import Duals, box_arcs, box_values
from model.planning.options import PlannerOptions
from solvers.backends import Backend
from solvers.backends.milp import MipArrays
from solvers.backends.result import BackendResult, Feature, SolveOptions, Status

log = logging.getLogger("shapeplan")


@dataclass(frozen=True, eq=False)
class Space:
    """What every model of one run shares: buckets, grids, candidate shapes and settings."""

    problem: Problem
    bms: list[BucketModel]
    grids: list[Grid]
    shapes: np.ndarray | None  # strict mode: candidate shapes; reference: None
    fixed_shapes: list[int]  # shapes each bucket compiles outside the model (reference: 1)
    options: PlannerOptions = PlannerOptions()

    def model(self, res: list[Restriction], relax_limits: bool) -> MipArrays:
        p = self.problem
        return build_model(self.bms, res, self.shapes, p.max_shapes, self.fixed_shapes, p.max_batch_size,
                           relax_limits, spike_per_arc=self.spike_per_arc(res))

    def spike_per_arc(self, res: list[Restriction]) -> bool:
        """Whether a model over ``res`` gives every arc a spike-recipient column (reference mode: exact
        spikes; above ``options.spike_arcs`` arcs each spike counts whole against sequential time)."""
        return sum(len(r.arc_cell) for r in res) <= self.options.spike_arcs


@dataclass(frozen=True, eq=False)
class Assignment:
    """One bucket's solution by meaning: batches per box, requests per (box, cell)."""

    box: np.ndarray  # grid index per used box
    batches: np.ndarray
    arc_box: np.ndarray  # grid index per used arc
    arc_cell: np.ndarray
    count: np.ndarray


def seed_restriction(bm: BucketModel, grid: Grid, extra_cell: np.ndarray, extra_box: np.ndarray) -> Restriction:
    """Each cell's own tight box (so coverage is always possible) plus extra (cell, grid box) arcs."""
    hist = bm.hist
    t_own = hist.S if not bm.cost.pads_to_shape else grid.ts[np.searchsorted(grid.ts, hist.S)]
    own = grid.index(t_own, hist.G, np.maximum(variant_of_size(bm, t_own, hist.G, 1), 0))
    return _from_arcs(grid, len(hist), np.concatenate([np.arange(len(hist)), extra_cell]),
                      np.concatenate([own, extra_box]))


def cover_arcs(bm: BucketModel, grid: Grid, shapes: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(cell, grid box) arcs that make a first model feasible without a warm start: every cell at its own gen
    at the smallest of ``shapes`` covering it (default: the grid's largest shape).

    Each cell's own tight box may use more shapes than the cap K allows (strict mode searches every candidate
    shape when there are few), so the first LP could be infeasible; arcs over at most K shapes (the shape
    relaxation's) make its relaxation feasible.  Limits are not considered: a P95 or sequential limit may
    still leave the first MIP without a plan (the greedy start is what meets those).  Cells that do not fit
    alone (KV capacity), or that no shape covers, get none.
    """
    hist = bm.hist
    ts = grid.ts if shapes is None else np.intersect1d(np.asarray(shapes, dtype=np.int64), grid.ts)
    ts = ts if len(ts) and ts[-1] >= hist.S.max() else np.r_[ts, grid.ts[-1]]
    cell = np.arange(len(hist))
    t = ts[np.minimum(np.searchsorted(ts, hist.S), len(ts) - 1)]
    v = np.where(t >= hist.S[cell], variant_of_size(bm, t, hist.G[cell], 1), -1)
    fits = v >= 0
    return cell[fits], grid.index(t[fits], hist.G[cell[fits]], v[fits])


def full_restriction(bm: BucketModel, grid: Grid) -> Restriction:
    """Every box of the grid with every cell that fits it: the whole model (for small buckets)."""
    hist = bm.hist
    every = np.arange(len(grid))
    t, g = grid.box(every)
    lo, hi = variant_range(bm, t, g, grid.variant(every))
    fits = (hist.S[None, :] <= t[:, None]) & (hist.G[None, :] <= g[:, None]) & (lo <= hi)[:, None]
    box, cell = np.nonzero(fits)
    return _from_arcs(grid, len(hist), cell, box)


def full_size(bm: BucketModel, grid: Grid, cap: int) -> int:
    """How many arcs the whole model of a bucket has (counted exactly up to a few times ``cap``)."""
    t, g = grid.box(np.arange(len(grid)))
    return int(((bm.hist.S[None, :] <= t[:, None]) & (bm.hist.G[None, :] <= g[:, None])).sum()) \
        if len(grid) * len(bm.hist) <= 4 * cap else 4 * cap


def _from_arcs(grid: Grid, n_cells: int, cell: np.ndarray, box: np.ndarray) -> Restriction:
    """The restriction holding exactly these (cell, grid box) arcs and their boxes."""
    cell = np.asarray(cell, dtype=np.int64)
    box = np.asarray(box, dtype=np.int64)
    boxes = np.unique(box)
    key = np.unique(np.searchsorted(boxes, box) * n_cells + cell)
    return restriction(grid, boxes, key % n_cells, key // n_cells)


def arcs_of(r: Restriction) -> tuple[np.ndarray, np.ndarray]:
    """(cell, grid box) of every arc of a restriction."""
    return r.arc_cell, r.boxes[r.arc_box]


def grow(bm: BucketModel, grid: Grid, res: Restriction, duals: Duals, new_boxes: np.ndarray,
         arcs_per_box: int) -> Restriction:
    """Add boxes; give every box the arcs that pay at the current prices, keeping the old ones."""
    boxes = np.unique(np.concatenate([res.boxes, new_boxes]))
    cells, pos = box_arcs(bm, grid, duals, boxes, 0.0, arcs_per_box)
    old_cell, old_box = arcs_of(res)
    return _from_arcs(grid, len(bm.hist), np.concatenate([cells, old_cell]), np.concatenate([boxes[pos], old_box]))


def merge(bm: BucketModel, grid: Grid, a: Restriction, b: Restriction) -> Restriction:
    """Union of two restrictions of the same bucket."""
    ca, ba = arcs_of(a)
    cb, bb = arcs_of(b)
    return _from_arcs(grid, len(bm.hist), np.concatenate([ca, cb]), np.concatenate([ba, bb]))


def support(bm: BucketModel, grid: Grid, r: Restriction, model: MipArrays, x: np.ndarray, b: int) -> Restriction:
    """The arcs an LP solution uses, plus each cell's own box: a small MIP that solves in seconds."""
    xblk = model.block("col", "x", b)
    used = x[xblk.slice()] > 1e-6
    cell, box = arcs_of(r)
    return seed_restriction(bm, grid, cell[used], box[used])


def prune(bm: BucketModel, grid: Grid, r: Restriction, d: Duals, gap: float, max_per_box: int | None = None,
          check: Callable[[], None] | None = None) -> Restriction:
    """Reduced-cost fixing: keep only boxes and arcs a plan cheaper than the incumbent could use.

    A plan using box k costs at least LB + max(0, v_k), v_k its unclipped Lagrangian
    value, and each arc with e_ck > 0 adds e_ck more; so v_k > gap or e_ck > gap rules
    the box or arc out.  With a weak bound (a wide gap) nearly every arc survives, so
    ``max_per_box`` keeps each box's most valuable ones, among each cell's nearest boxes
    (the model stays a restriction).
    ``check`` is called between chunks (it may raise to stop).
    """
    keep_box = box_values(bm, grid, d, r.boxes, check) <= gap
    near = None if max_per_box is None else max(4, max_per_box // 4)
    cells, pos = box_arcs(bm, grid, d, r.boxes, slack=gap, max_per_box=max_per_box, check=check, near=near)
    keep = keep_box[pos]
    old = keep_box[r.arc_box]
    cell, box = arcs_of(r)
    return seed_restriction(bm, grid, np.concatenate([cells[keep], cell[old]]),
                            np.concatenate([r.boxes[pos[keep]], box[old]]))


def assignment_of(model: MipArrays, res: list[Restriction], x: np.ndarray) -> list[Assignment]:
    """Read a solution vector back into per-bucket assignments (by grid index, not column)."""
    out = []
    for b, r in enumerate(res):
        m = np.rint(x[model.block("col", "m", b).slice()]).astype(np.int64)
        xa = np.rint(x[model.block("col", "x", b).slice()]).astype(np.int64)
        used, arcs = m > 0, xa > 0
        cell, box = arcs_of(r)
        out.append(Assignment(r.boxes[used], m[used], box[arcs], cell[arcs], xa[arcs]))
    return out


def assignment_from_batching(bm: BucketModel, grid: Grid, bt: Batching) -> Assignment | None:
    """A packer's batching as an assignment on the grid (None if a box falls off the grid)."""
    nb = len(bt.shape_of)
    S = bm.hist.S[bm.hist.cell_of] if not bm.cost.pads_to_shape else bt.shape_of[bt.batch_of]
    t = np.zeros(nb, np.int64)
    g = np.zeros(nb, np.int64)
    np.maximum.at(t, bt.batch_of, S)
    np.maximum.at(g, bt.batch_of, bm.hist.G[bm.hist.cell_of])
    if not (np.isin(t, grid.ts).all() and np.isin(g, grid.gs).all()):
        return None
    v = variant_of_size(bm, t, g, np.bincount(bt.batch_of, minlength=nb))
    if (v < 0).any():
        return None
    box = grid.index(t, g, v)
    key = box[bt.batch_of] * len(bm.hist) + bm.hist.cell_of
    arcs, count = np.unique(key, return_counts=True)
    boxes, batches = np.unique(box, return_counts=True)
    return Assignment(boxes, batches, arcs // len(bm.hist), arcs % len(bm.hist), count)


def vector_of(space: Space, model: MipArrays, res: list[Restriction], sol: list[Assignment]) -> np.ndarray | None:
    """A column vector for ``model`` holding the assignments, or None if a box or arc is missing."""
    x = np.zeros(model.n_cols)
    for b, (r, a) in enumerate(zip(res, sol, strict=True)):
        pos = _positions(r.boxes, a.box)
        cell, box = arcs_of(r)
        n = len(space.bms[b].hist)
        apos = _positions(box * n + cell, a.arc_box * n + a.arc_cell)
        if pos is None or apos is None:
            return None
        mblk = model.block("col", "m", b)
        # packer batches sharing a box become one batch of it (merging them is free)
        x[mblk.start + pos] = np.minimum(a.batches, model.ub[mblk.start + pos])
        x[model.block("col", "x", b).start + apos] = a.count
        if space.shapes is not None:
            used = np.unique(np.searchsorted(space.shapes, space.grids[b].box(a.box)[0]))
            x[model.block("col", "z", b).start + used] = 1.0
            y = model.block("col", "y")
            x[y.start + used] = 1.0
        counts = np.zeros(len(r.arc_cell))
        counts[apos] = a.count
        _spike_start(space, model, b, r, counts, x)
    return x


def _spike_start(space: Space, model: MipArrays, b: int, r: Restriction, counts: np.ndarray, x: np.ndarray) -> None:
    """Set a warm start's spike columns (``arrays.spike_rows``) for arc counts ``counts``: per shape, the
    harmless option where one is used, else any member; in reference mode the recipient arc that adds the
    least sequential time, crossing the P95 limit only while its allowance has room."""
    w = model.block("col", "spike_w", b)
    if w is None:
        return
    bm = space.bms[b]
    v, u = model.block("col", "spike_v", b), model.block("col", "spike_u", b)
    sc = spike_arcs(bm, r, u is not None)
    used = counts > 0
    if space.shapes is not None:
        t_pos = np.searchsorted(space.shapes, r.t[r.arc_box])
        for s in np.unique(t_pos[used]):
            safe = bool((sc.harmless & used & (t_pos == s)).any())
            x[(w if safe or v is None else v).start + s] = 1.0
        return
    spike = bm.cost.spike_ms
    over = float(arc_violates(bm, r.arc_cell, r.t[r.arc_box], r.g[r.arc_box]) @ counts)
    room = bm.p95_allowed is None or over + 1 <= bm.p95_allowed
    options = []  # (crosses, growth, column)
    if v is None or (sc.harmless & used).any():
        options.append((False, spike, w.start))
    if v is not None:
        options.append((True, spike, v.start))
    for i, arc in enumerate(sc.arcs.tolist()):
        if used[arc]:
            options.append((not sc.harmless[arc], float(sc.growth[arc]), u.start + i))
    allowed = [o for o in options if room or not o[0]] or options
    x[min(allowed, key=lambda o: (o[1], o[0]))[2]] = 1.0


def _positions(keys: np.ndarray, wanted: np.ndarray) -> np.ndarray | None:
    """Index of each wanted key in keys, or None if one is absent."""
    order = np.argsort(keys, kind="stable")
    idx = np.minimum(np.searchsorted(keys[order], wanted), max(len(keys) - 1, 0))
    if len(wanted) and (len(keys) == 0 or (keys[order][idx] != wanted).any()):
        return None
    return order[idx]


@dataclass(frozen=True, eq=False)
class Solved:
    """A MIP solved over a restriction, with its solution read back by meaning (None without a solution)."""

    res: list[Restriction]
    result: BackendResult
    assignment: list[Assignment] | None

    @property
    def objective(self) -> float:
        return float(self.result.objective)


def solve_restricted(space: Space, solver: Backend, res: list[Restriction], start: list[Assignment] | None,
                     until: Deadline) -> Solved:
    """Solve the MIP over a restriction with the limits hard, warm-started from ``start`` if it fits.

    The backend gets the time left before ``until`` (at least ``min_call_s``); a warm
    start only if it has Feature.WARM_START.  A run stopped by a signal raises
    ``Interrupted``.
    """
    model = space.model(res, relax_limits=False)
    warm = None
    if start is not None and Feature.WARM_START in solver.features:
        warm = vector_of(space, model, res, start)
    with_bound = Feature.LOWER_BOUND in solver.features

    def progress(inc: float, bnd: float | None) -> None:
        if with_bound and bnd is not None and np.isfinite(bnd):
            log.info("  MIP incumbent %.6e (its bound %.6e)", inc, bnd)
        else:
            log.info("  MIP incumbent %.6e", inc)

    budget = max(space.options.min_call_s, until.left())
    n_boxes, n_arcs = sum(len(r.boxes) for r in res), sum(len(r.arc_cell) for r in res)
    log.info("MIP (%s) over %d boxes / %d arcs, up to %.1f s%s", solver.name, n_boxes, n_arcs, budget,
             ", warm-started" if warm is not None else "")
    out = solver.solve(model, SolveOptions(time_limit=budget, warm_start=warm,
                                           on_progress=progress if Feature.PROGRESS in solver.features else None))
    if out.status is Status.INTERRUPTED:
        raise interrupted()
    bound = f", bound {out.bound:.6e}" if with_bound and out.bound is not None else ""
    log.info("MIP over %d boxes / %d arcs: %s, objective %s%s (%s %.1f s)", n_boxes, n_arcs, out.status.value,
             out.objective, bound, out.backend, out.time_s)
    return Solved(res, out, assignment_of(model, res, out.x) if out.has_solution else None)
