"""The optimisation model, built once as arrays (variables, one block of rows per constraint family).

Per bucket b, over a restricted set of candidate boxes k = (t_k, g_k) and arcs
a = (cell c, box k) with S_c <= t_k and G_c <= g_k:

  m_k in {0..M_k}   batches of box k (M_k = 1 without a batch-size cap)
  x_a in {0..n_c}   requests of cell c that ride in box k
  s_*  >= 0         slack of each limit row (priced high while generating columns,
                    fixed to 0 in the final MIP: limits are hard)

and, in strict mode, z_{b,s} (bucket b compiles shape s) and y_s (shape s is one of
the K global shapes).  With a P95 or sequential limit (analytic modes), binaries say
where each compile spike lands (``spike_rows``): on some harmless member, on any
member, or (reference mode) on a member of a given arc -- so the limits count spikes
exactly instead of reserving a whole one per shape.

  minimise  sum_b [ sum_k Kbatch*m_k + sum_a unit(k)*x_a + sum_s compile(s)*z_{b,s} ] + penalty*slacks

Each constraint family is one function below with its formula in its docstring; a
backend only translates these arrays.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from model.cost.model import ANALYTIC_SLACK_PENALTY, ReferenceCost
from model.formulation.boxes import (
    NO_CAP,
    BucketModel,
    Grid,
    arc_pad,
    arc_violates,
    box_fixed,
    box_unit_cost,
    box_unit_seq,
    spike_terms,
    variant_range,
)
from solvers.backends.milp import Block, MipArrays

# Each limit's slack is priced by the cost model (``CostModel.slack_penalty``, in its own unit) while columns
# are generated; the rows are scaled down to this largest coefficient.
ROW_MAX = 1e3


@dataclass(frozen=True, eq=False)
class Restriction:
    """The boxes and arcs of one bucket that the model currently holds."""

    boxes: np.ndarray  # flat grid indices, sorted, unique
    t: np.ndarray  # box extents, parallel to ``boxes``
    g: np.ndarray
    arc_cell: np.ndarray
    arc_box: np.ndarray  # local position in ``boxes``
    v: np.ndarray | None = None  # size-class variant of each box (None: all 0)

    @property
    def variant(self) -> np.ndarray:
        return self.v if self.v is not None else np.zeros(len(self.boxes), np.int64)


def restriction(grid: Grid, boxes: np.ndarray, arc_cell: np.ndarray, arc_box: np.ndarray) -> Restriction:
    """A restriction with its box extents and variants read off the grid."""
    t, g = grid.box(boxes)
    return Restriction(boxes, t, g, arc_cell, arc_box, grid.variant(boxes))


@dataclass
class ModelBuilder:
    """Accumulates column and row blocks: the one way a formulation (the box model here, the flow model in
    ``model.formulation.device_flow``) lays out its arrays."""

    c: list = field(default_factory=list)
    lb: list = field(default_factory=list)
    ub: list = field(default_factory=list)
    integer: list = field(default_factory=list)
    col_blocks: list = field(default_factory=list)
    rows: list = field(default_factory=list)
    cols: list = field(default_factory=list)
    vals: list = field(default_factory=list)
    row_lo: list = field(default_factory=list)
    row_hi: list = field(default_factory=list)
    row_blocks: list = field(default_factory=list)
    n_cols: int = 0
    n_rows: int = 0

    def add_cols(self, name: str, cost, lb, ub, integer: bool, bucket: int = -1) -> Block:
        cost = np.asarray(cost, dtype=np.float64)
        n = len(cost)
        self.c.append(cost)
        self.lb.append(np.broadcast_to(np.asarray(lb, dtype=np.float64), (n,)))
        self.ub.append(np.broadcast_to(np.asarray(ub, dtype=np.float64), (n,)))
        self.integer.append(np.full(n, integer))
        block = Block(name, self.n_cols, self.n_cols + n, bucket)
        self.col_blocks.append(block)
        self.n_cols += n
        return block

    def add_rows(self, name: str, r, c, v, lo, hi, bucket: int = -1, scale: float = 1.0) -> Block:
        lo = np.atleast_1d(np.asarray(lo, dtype=np.float64))
        hi = np.atleast_1d(np.asarray(hi, dtype=np.float64))
        self.rows.append(np.asarray(r, dtype=np.int64) + self.n_rows)
        self.cols.append(np.asarray(c, dtype=np.int64))
        self.vals.append(np.asarray(v, dtype=np.float64))
        self.row_lo.append(lo)
        self.row_hi.append(hi)
        block = Block(name, self.n_rows, self.n_rows + len(lo), bucket, scale)
        self.row_blocks.append(block)
        self.n_rows += len(lo)
        return block

    def arrays(self, scale: float, offset: float) -> MipArrays:
        cat = lambda xs, dt=np.float64: np.concatenate(xs).astype(dt) if xs else np.zeros(0, dt)  # noqa: E731
        return MipArrays(cat(self.c) / scale, cat(self.lb), cat(self.ub), cat(self.integer, bool),
                         cat(self.rows, np.int64), cat(self.cols, np.int64), cat(self.vals),
                         cat(self.row_lo), cat(self.row_hi), tuple(self.col_blocks), tuple(self.row_blocks),
                         offset / scale, scale)


# ---------------------------------------------------------------- constraint families


def coverage_rows(bld: ModelBuilder, b: int, bm: BucketModel, res: Restriction, x: Block) -> None:
    """Every request is planned exactly once:  sum_k x_{c,k} = n_c   for every cell c."""
    bld.add_rows("cover", res.arc_cell, x.start + np.arange(len(res.arc_cell)), np.ones(len(res.arc_cell)),
                 bm.hist.count, bm.hist.count, b)


def box_sizes(bm: BucketModel, res: Restriction, max_batch: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Members a batch of each box may hold, [lo, hi]: its size class, the batch-size cap, the KV cap."""
    lo, hi = variant_range(bm, res.t, res.g, res.variant)
    if max_batch is not None:
        hi = np.minimum(hi, max_batch)
    return lo, hi


def link_rows(bld: ModelBuilder, b: int, bm: BucketModel, res: Restriction, x: Block, m: Block,
              lo: np.ndarray, hi: np.ndarray) -> None:
    """A cell rides in a box only if the box has batches:  x_{c,k} <= min(n_c, hi_k) * m_k.

    Where a box's batches hold at most hi_k < n members, also  sum_c x_{c,k} <= hi_k * m_k;
    where they need at least lo_k > 1 (device size classes),  sum_c x_{c,k} >= lo_k * m_k.
    Together these say the box's members split into m_k batches of lo_k..hi_k each.
    """
    na = len(res.arc_cell)
    cap = np.minimum(bm.hist.count[res.arc_cell], hi[res.arc_box]).astype(np.float64)
    r = np.concatenate([np.arange(na), np.arange(na)])
    c = np.concatenate([x.start + np.arange(na), m.start + res.arc_box])
    v = np.concatenate([np.ones(na), -cap])
    bld.add_rows("link", r, c, v, np.full(na, -np.inf), np.zeros(na), b)
    held = np.bincount(res.arc_box, weights=bm.hist.count[res.arc_cell], minlength=len(res.boxes))
    capped = np.flatnonzero(hi < held)
    if len(capped):
        _size_rows(bld, "batch_cap", b, res, x, m, capped, hi, -np.inf, 0.0)
    floored = np.flatnonzero(lo > 1)
    if len(floored):
        _size_rows(bld, "batch_floor", b, res, x, m, floored, lo, 0.0, np.inf)


def _size_rows(bld: ModelBuilder, name: str, b: int, res: Restriction, x: Block, m: Block, boxes: np.ndarray,
               size: np.ndarray, lo: float, hi: float) -> None:
    """Rows  sum_c x_{c,k} - size_k * m_k  in [lo, hi]  for the given local boxes k."""
    row_of = np.full(len(res.boxes), -1)
    row_of[boxes] = np.arange(len(boxes))
    arcs = np.flatnonzero(row_of[res.arc_box] >= 0)
    r = np.concatenate([row_of[res.arc_box[arcs]], np.arange(len(boxes))])
    c = np.concatenate([x.start + arcs, m.start + boxes])
    v = np.concatenate([np.ones(len(arcs)), -size[boxes].astype(np.float64)])
    bld.add_rows(name, r, c, v, np.full(len(boxes), lo), np.full(len(boxes), hi), b)


def limit_row(bld: ModelBuilder, name: str, b: int, cols: np.ndarray, vals: np.ndarray, rhs: float,
               relax: bool, penalty: dict[str, float] = ANALYTIC_SLACK_PENALTY) -> None:
    """One "<=" limit row, scaled so its largest coefficient is at most ROW_MAX, with a priced
    slack column while generating columns.

    Unscaled, the cost row (coefficients ~1e10, right-hand side ~1e11) stalled HiGHS's
    presolve for minutes past its time limit.
    """
    f = min(1.0, ROW_MAX / max(float(np.abs(vals).max(initial=0.0)), 1e-300))
    vals = vals * f
    if relax:
        s = bld.add_cols(f"slack_{name}", [penalty[name] / f], 0.0, np.inf, False, b)
        cols = np.append(cols, s.start)
        vals = np.append(vals, -1.0)
    bld.add_rows(name, np.zeros(len(cols), dtype=np.int64), cols, vals, -np.inf, rhs * f, b, scale=f)


def penalties(bm: BucketModel) -> dict[str, float]:
    """Slack prices of the limit rows in the bucket's cost unit."""
    return bm.cost.slack_penalty


def cost_limit_row(bld, b, bm, res, x, m, z, unit, shapes, relax) -> None:
    """Cost limit:  sum_k F_k m_k + sum_a unit_a x_a [+ sum_s compile_s z_{b,s}] <= max_cost - const.

    F_k is the batch overhead (analytic modes) or T's per-batch part (device mode)."""
    if bm.limits.max_cost is None:
        return
    fixed, _ = box_fixed(bm, res.t, res.g, res.variant)
    cols = [m.start + np.arange(len(res.boxes)), x.start + np.arange(len(res.arc_cell))]
    vals = [fixed, unit]
    if z is not None:
        cols.append(np.arange(z.start, z.stop))
        vals.append(bm.cost.shape_charge(shapes))
    limit_row(bld, "cost", b, np.concatenate(cols), np.concatenate(vals), bm.limits.max_cost - bm.const_cost, relax,
               penalties(bm))


def pad_limit_row(bld, b, bm, res, x, relax) -> None:
    """Padding limit:  sum_a pad_a x_a <= max_pad_ratio*real - fixed prompt pad (pad_a per member)."""
    if bm.pad_budget is None:
        return
    t, g = res.t, res.g
    pad = arc_pad(bm, res.arc_cell, t[res.arc_box], g[res.arc_box])
    limit_row(bld, "pad", b, x.start + np.arange(len(res.arc_cell)), pad, bm.pad_budget, relax, penalties(bm))


def seq_limit_row(bld, b, bm, res, x, m, z, fixed_shapes: int, relax, spikes: Terms | None = None) -> None:
    """Sequential time:  sum_k lat_k m_k + sum_a useq_a x_a + spikes <= max_sequential_ms.

    Analytic modes: lat_k is the batch's largest member latency and useq = 0; device
    mode: a batch's time T = F + n u counts whole (lat = F, useq = u).  The compile
    spikes: strict mode adds one whole spike per shape the bucket compiles (z; every
    member of a batch has the same latency, so a spike raises its batch's largest by
    exactly that); reference mode adds what its spike's recipient adds (``spikes``,
    from ``spike_rows``); without those terms, one whole spike per fixed shape.
    """
    if bm.limits.max_sequential_ms is None:
        return
    _, lat = box_fixed(bm, res.t, res.g, res.variant)
    spike = bm.cost.spike_ms
    useq = box_unit_seq(bm, res.t, res.g, res.variant)[res.arc_box]
    cols, vals = [m.start + np.arange(len(res.boxes))], [lat]
    if useq.any():
        cols.append(x.start + np.arange(len(res.arc_cell)))
        vals.append(useq)
    rhs = bm.limits.max_sequential_ms - (0.0 if spikes is not None else spike * fixed_shapes)
    if spikes is not None:
        cols.append(spikes.cols)
        vals.append(spikes.vals)
    if z is not None:
        cols.append(np.arange(z.start, z.stop))
        vals.append(np.full(z.stop - z.start, spike))
    limit_row(bld, "seq", b, np.concatenate(cols), np.concatenate(vals), rhs, relax, penalties(bm))


def p95_limit_row(bld, b, bm, res, x, relax, spikes: Terms | None = None) -> None:
    """P95 latency:  sum over arcs whose member latency > L of x_a + spikes that cross L <= n - ceil(0.95 n).

    ``spikes`` (from ``spike_rows``) counts each compile spike that lands on a member it
    pushes over the limit.
    """
    if bm.p95_allowed is None:
        return
    t, g = res.t, res.g
    viol = arc_violates(bm, res.arc_cell, t[res.arc_box], g[res.arc_box], res.variant[res.arc_box])
    keep = viol > 0
    cols, vals = x.start + np.flatnonzero(keep), viol[keep]
    if spikes is not None:
        cols, vals = np.concatenate([cols, spikes.cols]), np.concatenate([vals, spikes.vals])
    limit_row(bld, "p95", b, cols, vals, float(bm.p95_allowed), relax, penalties(bm))


@dataclass(frozen=True, eq=False)
class Terms:
    """Columns and coefficients one family adds to a limit row."""

    cols: np.ndarray
    vals: np.ndarray


@dataclass(frozen=True, eq=False)
class SpikeColumns:
    """Which arcs the per-arc recipient columns ``spike_u`` of a bucket stand for (reference mode)."""

    arcs: np.ndarray  # arc position of each spike_u column
    harmless: np.ndarray  # per arc of the restriction (see ``boxes.spike_terms``)
    growth: np.ndarray


def spike_arcs(bm: BucketModel, res: Restriction, per_arc: bool) -> SpikeColumns:
    """The spike terms of every arc, and the arcs that get a recipient column of their own: those whose member
    is prefilled below its box's t, so a spike raises its batch's largest latency by less than a whole spike
    (only those can do better than "some harmless member" or "any member"); only in reference mode, with a
    sequential limit and ``per_arc``."""
    harmless, growth = spike_terms(bm, res.arc_cell, res.t[res.arc_box], res.g[res.arc_box])
    arcs = np.zeros(0, np.int64)
    if per_arc and bm.limits.max_sequential_ms is not None and not bm.cost.pads_to_shape:
        arcs = np.flatnonzero(bm.hist.S[res.arc_cell] < res.t[res.arc_box])  # prefilled below t: growth < spike
    return SpikeColumns(arcs, harmless, growth)


def spike_rows(bld, b, bm, res, x, z, shapes, per_arc: bool) -> tuple[Terms | None, Terms | None]:
    """Where each compile spike lands, exactly (analytic modes): the (P95, sequential) terms it adds.

    Each shape a bucket compiles puts its spike on one member of its batches, and the
    expansion may pick any (``model.expand.spikes``).  Options, exactly one per shape
    compiled (reference mode: the bucket's one shape, "= 1"; strict: "= z_{b,s}"):

      spike_w  some harmless member takes it (w <= sum of x over harmless arcs): no P95
               count; a whole spike of sequential time;
      spike_v  any member takes it: one P95 count; a whole spike;
      spike_u  (reference mode, per arc, with ``per_arc``) a member of that arc takes it
               (u_a <= x_a): a P95 count if it crosses the limit, and its ``growth`` of
               sequential time -- less than a spike for a member prefilled below t.

    Without a P95 limit every member is harmless (no v, no w row).  Strict mode adds
    only w and v per shape (its sequential time already counts one spike per z).  The
    bound leaves all of this out, which only relaxes it.  Returns (None, None) where
    spikes cannot matter (no P95 or sequential limit, device mode).
    """
    lim = bm.limits
    if bm.cost.shared_batch_time or (lim.max_p95_latency_ms is None and lim.max_sequential_ms is None):
        return None, None
    if shapes is not None and lim.max_p95_latency_ms is None:
        return None, None  # strict: the sequential row counts one spike per shape (z) exactly
    sc = spike_arcs(bm, res, per_arc)
    spike = bm.cost.spike_ms
    n_opt = 1 if shapes is None else len(shapes)
    t_pos = None if shapes is None else np.searchsorted(shapes, res.t[res.arc_box])
    w = bld.add_cols("spike_w", np.zeros(n_opt), 0.0, 1.0, True, b)
    one_cols, one_rows = [w.start + np.arange(n_opt)], [np.arange(n_opt)]
    p95 = ([], [])
    seq = ([w.start + np.arange(n_opt)], [np.full(n_opt, spike)])
    if lim.max_p95_latency_ms is not None:
        v = bld.add_cols("spike_v", np.zeros(n_opt), 0.0, 1.0, True, b)
        one_cols.append(v.start + np.arange(n_opt))
        one_rows.append(np.arange(n_opt))
        p95[0].append(v.start + np.arange(n_opt))
        p95[1].append(np.ones(n_opt))
        seq[0].append(v.start + np.arange(n_opt))
        seq[1].append(np.full(n_opt, spike))
        safe = np.flatnonzero(sc.harmless)
        row_of_safe = np.zeros(len(safe), np.int64) if shapes is None else t_pos[safe]
        bld.add_rows("spike_safe", np.concatenate([np.arange(n_opt), row_of_safe]),
                     np.concatenate([w.start + np.arange(n_opt), x.start + safe]),
                     np.concatenate([np.ones(n_opt), -np.ones(len(safe))]), np.full(n_opt, -np.inf),
                     np.zeros(n_opt), b)
    if len(sc.arcs):
        nu = len(sc.arcs)
        u = bld.add_cols("spike_u", np.zeros(nu), 0.0, 1.0, True, b)
        one_cols.append(u.start + np.arange(nu))
        one_rows.append(np.zeros(nu, np.int64))
        cross = ~sc.harmless[sc.arcs]
        p95[0].append(u.start + np.flatnonzero(cross))
        p95[1].append(np.ones(int(cross.sum())))
        seq[0].append(u.start + np.arange(nu))
        seq[1].append(sc.growth[sc.arcs])
        bld.add_rows("spike_arc", np.concatenate([np.arange(nu), np.arange(nu)]),
                     np.concatenate([u.start + np.arange(nu), x.start + sc.arcs]),
                     np.concatenate([np.ones(nu), -np.ones(nu)]), np.full(nu, -np.inf), np.zeros(nu), b)
    rows, cols = np.concatenate(one_rows), np.concatenate(one_cols)
    vals = np.ones(len(cols))
    if shapes is None:
        bld.add_rows("spike_one", rows, cols, vals, 1.0, 1.0, b)
    else:
        bld.add_rows("spike_one", np.concatenate([rows, np.arange(n_opt)]),
                     np.concatenate([cols, z.start + np.arange(n_opt)]), np.concatenate([vals, -np.ones(n_opt)]),
                     np.zeros(n_opt), np.zeros(n_opt), b)
    p95_terms = Terms(np.concatenate(p95[0]), np.concatenate(p95[1])) if p95[0] else None
    seq_terms = Terms(np.concatenate(seq[0]), np.concatenate(seq[1])) if shapes is None else None
    return p95_terms, seq_terms


def shape_link_rows(bld, b, res, m, z, t_of_box_shape: np.ndarray, m_ub: np.ndarray) -> None:
    """Strict mode: a box runs only at a compiled shape:  m_k <= M_k * z_{b, t_k}."""
    nk = len(res.boxes)
    r = np.concatenate([np.arange(nk), np.arange(nk)])
    c = np.concatenate([m.start + np.arange(nk), z.start + t_of_box_shape])
    v = np.concatenate([np.ones(nk), -m_ub])
    bld.add_rows("shape_link", r, c, v, np.full(nk, -np.inf), np.zeros(nk), b)


def shape_cap_rows(bld, zs: list[Block], y: Block, k: int) -> None:
    """Shapes: z_{b,s} <= y_s for every bucket, and  sum_s y_s <= K  (the joint cap)."""
    ns = y.stop - y.start
    for b, z in enumerate(zs):
        r = np.concatenate([np.arange(ns), np.arange(ns)])
        c = np.concatenate([z.start + np.arange(ns), y.start + np.arange(ns)])
        bld.add_rows("shape_global", r, c, np.concatenate([np.ones(ns), -np.ones(ns)]),
                     np.full(ns, -np.inf), np.zeros(ns), b)
    bld.add_rows("shape_cap", np.zeros(ns, dtype=np.int64), y.start + np.arange(ns), np.ones(ns), -np.inf, k)


# ---------------------------------------------------------------- assembly


def m_upper(bm: BucketModel, res: Restriction, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Most batches a box can need: enough for every member it can hold at hi each (1 when uncapped),
    and no more than its members fill at lo each (0: the box cannot be used)."""
    held = np.bincount(res.arc_box, weights=bm.hist.count[res.arc_cell], minlength=len(res.boxes))
    need = np.where(hi < NO_CAP, np.ceil(held / np.maximum(hi, 1)), 1.0)
    most = np.maximum(1.0, need)
    most = np.minimum(most, np.floor(held / np.maximum(lo, 1)))
    return np.where(lo > hi, 0.0, most)


def build_model(bms: list[BucketModel], restrictions: list[Restriction],
                shapes: np.ndarray | None, max_shapes: int, fixed_shapes: list[int], max_batch: int | None,
                relax_limits: bool, spike_per_arc: bool = True) -> MipArrays:
    """Assemble the whole model: columns per bucket, then each constraint family.

    ``shapes`` is None in reference mode (shape choice is settled outside: it only
    moves compile cost), else the candidate shape values of strict and device mode.
    ``spike_per_arc``: reference mode gives every arc a spike-recipient column (exact);
    without, a spike counts whole against sequential time (sound, a smaller model).
    """
    bld = ModelBuilder()
    zs: list[Block] = []
    const = 0.0
    per_bucket = []
    for b, (bm, res) in enumerate(zip(bms, restrictions, strict=True)):
        t, g, v = res.t, res.g, res.variant
        fixed, _ = box_fixed(bm, t, g, v)
        lo, hi = box_sizes(bm, res, max_batch)
        m_ub = m_upper(bm, res, lo, hi)
        m = bld.add_cols("m", fixed, 0.0, m_ub, True, b)
        unit = box_unit_cost(bm, t, g, v)[res.arc_box]
        x = bld.add_cols("x", unit, 0.0, bm.hist.count[res.arc_cell].astype(np.float64), True, b)
        z = None
        if shapes is not None:
            z = bld.add_cols("z", bm.cost.shape_charge(shapes), 0.0, 1.0, True, b)
            zs.append(z)
        per_bucket.append((bm, res, m, x, z, unit, m_ub, lo, hi))
        const += bm.const_cost
    y = bld.add_cols("y", np.zeros(len(shapes)), 0.0, 1.0, True) if shapes is not None else None
    for b, (bm, res, m, x, z, unit, m_ub, lo, hi) in enumerate(per_bucket):
        coverage_rows(bld, b, bm, res, x)
        link_rows(bld, b, bm, res, x, m, lo, hi)
        cost_limit_row(bld, b, bm, res, x, m, z, unit, shapes, relax_limits)
        pad_limit_row(bld, b, bm, res, x, relax_limits)
        p95_spikes, seq_spikes = spike_rows(bld, b, bm, res, x, z, shapes, spike_per_arc)
        seq_limit_row(bld, b, bm, res, x, m, z, 0 if shapes is not None else fixed_shapes[b], relax_limits,
                      seq_spikes)
        p95_limit_row(bld, b, bm, res, x, relax_limits, p95_spikes)
        if shapes is not None:
            shape_link_rows(bld, b, res, m, z, np.searchsorted(shapes, res.t), m_ub)
    if shapes is not None:
        shape_cap_rows(bld, zs, y, max_shapes)
    return bld.arrays(scale=bms[0].cost.objective_scale if bms else ReferenceCost.objective_scale, offset=const)

