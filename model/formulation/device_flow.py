"""The flow formulation (strict and device mode): requests flow up a grid of levels into batches.

In strict and device mode what a member costs depends only on its batch's box (shape
t, longest gen g, size class v), never on the member itself: a request (S, G) may
ride in any box with t >= S and g >= G, and pays the box's per-member price.  So
instead of a variable per (request cell, box) pair, requests enter a grid of levels
at their own (shape level i, gen level j) and are passed up -- one shape level at a
time (their prompt is padded further) or one gen level at a time (they decode
longer) -- until a box serves them.  Per bucket b:

  w[i,j,v] in Z>=0   members served in box (t_i, g_j, v)
  m[i,j,v] in Z>=0   batches of that box
  a[i,j] >= 0        members passed from (i, j) to (i+1, j)
  d[i,j] >= 0        members passed from (i, j) to (i, j+1)
  z[b,u] in {0,1}    bucket b compiles unit u = (shape t_i, compile class c): the shape itself, or with
                     compiled batch sizes the graph (B_c, t_i);   y[i] in {0,1}: t_i is one of the K shapes;
  q[u] in {0,1}      (with a graph cap) graph u is one of the capped graphs

  flow    n[i,j] + a[i-1,j] + d[i,j-1] - a[i,j] - d[i,j] - sum_v w[i,j,v] = 0
  size    lo_k m_k <= w_k <= hi_k m_k            (size class, batch-size cap, KV capacity)
  shape   m[i,j,v] <= M_b z[b,u(i,v)];  z[b,u] <= y[i];  sum_i y[i] <= K;  z[b,u] <= q[u];  sum q <= cap
  cost    sum F_k m_k + u_k w_k + compile(t_i) z[b,u]                 (<= max_cost - const)
  pad     sum (t_i + g_j) w[i,j,v]  <=  (1 + max_pad_ratio) * real tokens   (graphs: B_c (t_i + g_j) m_k)
  seq     sum lat_k m_k + useq_k w_k + spike z[b,u]                   (<= max_sequential_ms)
  p95     sum over boxes whose members exceed the limit of w_k        (<= allowed)
          + in device mode one per compile unit whose spike finds no spike-safe batch (nor one whose
            members are over the limit anyway)

The flows make the model exact about *who can ride where* (a box's members can be
matched to requests it dominates exactly when the flow exists); pad, P95, cost and
sequential time only need the served counts.  With requests entering at the level
just above them (``ceil``) the model is exact or conservative -- every solution is a
plan; entering at the level just below (``floor``) relaxes every cost, cap and limit,
so its optimum is a lower bound on any plan.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from model.cost.model import StrictCost
from model.formulation.arrays import (
    NO_CAP,
    Block,
    MipArrays,
    ModelBuilder,
    limit_row,
)
from model.formulation.boxes import (
    BucketModel,
    arc_violates,
    box_fixed,
    box_pad,
    box_unit_cost,
    box_unit_seq,
    variant_range,
)


@dataclass(frozen=True, eq=False)
class Levels:
    """The level grid of one bucket: shape levels (shared by all buckets), gen levels, entry counts."""

    ts: np.ndarray  # shape levels (sorted, common to every bucket)
    gs: np.ndarray  # gen levels of this bucket (sorted)
    supply: np.ndarray  # (len(ts), len(gs)) requests entering at each level


def entry_levels(values: np.ndarray, levels: np.ndarray, rounding: str) -> np.ndarray:
    """Index of the level each value enters at: the smallest level >= it (``ceil``, a plan) or the
    largest level <= it (``floor``, a relaxation; values below every level enter the lowest)."""
    if rounding == "ceil":
        return np.searchsorted(levels, values, side="left")
    return np.maximum(np.searchsorted(levels, values, side="right") - 1, 0)


def bucket_levels(S: np.ndarray, G: np.ndarray, count: np.ndarray, ts: np.ndarray, gs: np.ndarray,
                  rounding: str) -> Levels:
    """Entry counts of a bucket's cells (aligned prompt S, gen G, count) on the level grid."""
    i = entry_levels(S, ts, rounding)
    j = entry_levels(G, gs, rounding)
    supply = np.zeros((len(ts), len(gs)))
    np.add.at(supply, (i, j), count)
    return Levels(ts, gs, supply)


@dataclass(frozen=True, eq=False)
class FlowBlocks:
    """Where one bucket's columns sit: boxes (level i, level j, variant v) of its w and m columns, its
    flows (a[i, j] at i * ng + j, d[i, j] at i * (ng - 1) + j) and its compile switches z, one per compile
    unit u = i * n_compile + c (shape level i, compile class c: 0 where the compile is per shape, the
    bucket's graph with compiled batch sizes); ``box_u`` is each box's unit."""

    box_i: np.ndarray
    box_j: np.ndarray
    box_v: np.ndarray
    w: Block
    m: Block
    z: Block
    a: Block
    d: Block
    box_u: np.ndarray
    n_compile: int = 1


def _boxes(bm: BucketModel, lv: Levels, reach: np.ndarray, max_batch: int | None):
    """Every usable box (i, j, v) on reachable levels, with its size range."""
    ii, jj = np.nonzero(reach)
    i = np.repeat(ii, bm.n_variants)
    j = np.repeat(jj, bm.n_variants)
    v = np.tile(np.arange(bm.n_variants), len(ii))
    lo, hi = variant_range(bm, lv.ts[i], lv.gs[j], v)
    if max_batch is not None:
        hi = np.minimum(hi, max_batch)
    ok = lo <= hi
    return i[ok], j[ok], v[ok], lo[ok], hi[ok]


def reachable(supply: np.ndarray) -> np.ndarray:
    """Levels some request can reach by moving up in shape and gen (a running max in both directions)."""
    has = supply > 0
    return np.maximum.accumulate(np.maximum.accumulate(has, axis=0), axis=1)


def build_flow_model(bms: list[BucketModel], levels: list[Levels], max_shapes: int, max_batch: int | None,
                     relax_limits: bool = False, spikes: bool = True, max_graphs: int | None = None
                     ) -> tuple[MipArrays, list[FlowBlocks]]:
    """The whole flow model (see module docstring) as arrays, plus where each bucket's boxes sit.

    ``spikes`` reserves one compile spike per compile unit against sequential time (exact
    in device mode, where a spike lengthens its whole batch; conservative otherwise: a
    bound model leaves it out unless the mode makes it exact).  ``max_graphs`` caps the
    distinct compile units (graphs) across all buckets.
    """
    bld = ModelBuilder()
    ts = levels[0].ts
    nt = len(ts)
    nc = bms[0].cost.n_compile_classes if bms else 1
    nu = nt * nc
    blocks: list[FlowBlocks] = []
    zs: list[Block] = []
    const = 0.0
    for b, (bm, lv) in enumerate(zip(bms, levels, strict=True)):
        reach = reachable(lv.supply)
        i, j, v, lo, hi = _boxes(bm, lv, reach, max_batch)
        u = i * nc + bm.graph[v]
        t, g = lv.ts[i], lv.gs[j]
        fixed, lat = box_fixed(bm, t, g, v)
        unit = box_unit_cost(bm, t, g, v)
        total = float(lv.supply.sum())
        m_ub = np.minimum(np.where(hi < NO_CAP, np.ceil(total / np.maximum(hi, 1)), 1.0),
                          np.floor(total / np.maximum(lo, 1)))
        m = bld.add_cols("m", fixed, 0.0, m_ub, True, b)
        w = bld.add_cols("w", unit, 0.0, total, True, b)
        ng = len(lv.gs)
        a = bld.add_cols("a", np.zeros((nt - 1) * ng), 0.0, total, False, b)
        d = bld.add_cols("d", np.zeros(nt * (ng - 1)), 0.0, total, False, b)
        z = bld.add_cols("z", np.repeat(bm.cost.shape_charge(ts), nc), 0.0, 1.0, True, b)
        zs.append(z)
        const += bm.const_cost
        blocks.append(FlowBlocks(i, j, v, w, m, z, a, d, u, nc))
        _flow_rows(bld, b, lv, reach, i, j, w, a, d)
        _size_rows(bld, b, w, m, lo, hi, total)
        _shape_rows(bld, b, u, m, z, m_ub)
        pen = bm.cost.slack_penalty
        _limits(bld, b, bm, t, g, v, u, fixed, lat, unit, w, m, z, np.repeat(ts, nc), relax_limits, pen, spikes)
    y = bld.add_cols("y", np.zeros(nt), 0.0, 1.0, True)
    for b, z in enumerate(zs):
        r = np.concatenate([np.arange(nu), np.arange(nu)])
        c = np.concatenate([z.start + np.arange(nu), y.start + np.arange(nu) // nc])
        bld.add_rows("shape_global", r, c, np.r_[np.ones(nu), -np.ones(nu)], np.full(nu, -np.inf), np.zeros(nu), b)
    bld.add_rows("shape_cap", np.zeros(nt, dtype=np.int64), y.start + np.arange(nt), np.ones(nt), -np.inf, max_shapes)
    if max_graphs is not None:
        _graph_cap_rows(bld, zs, nu, max_graphs)
    return bld.arrays(scale=bms[0].cost.objective_scale if bms else StrictCost.objective_scale, offset=const), blocks


def _graph_cap_rows(bld: ModelBuilder, zs: list[Block], nu: int, max_graphs: int) -> None:
    """At most ``max_graphs`` distinct compile units (graphs) across all buckets:  z[b,u] <= q[u],  sum q <= cap."""
    q = bld.add_cols("graph", np.zeros(nu), 0.0, 1.0, True)
    for b, z in enumerate(zs):
        r = np.concatenate([np.arange(nu), np.arange(nu)])
        c = np.concatenate([z.start + np.arange(nu), q.start + np.arange(nu)])
        bld.add_rows("graph_global", r, c, np.r_[np.ones(nu), -np.ones(nu)], np.full(nu, -np.inf), np.zeros(nu), b)
    bld.add_rows("graph_cap", np.zeros(nu, dtype=np.int64), q.start + np.arange(nu), np.ones(nu), -np.inf,
                 max_graphs)


def _flow_rows(bld: ModelBuilder, b: int, lv: Levels, reach: np.ndarray, i: np.ndarray, j: np.ndarray,
               w: Block, a: Block, d: Block) -> None:
    """Conservation at every level:  n[i,j] + a[i-1,j] + d[i,j-1] - a[i,j] - d[i,j] - sum_v w[i,j,v] = 0.

    Flows into unreachable levels are fixed at 0 by the rows of those levels (nothing enters them)."""
    nt, ng = lv.supply.shape
    node = np.arange(nt * ng).reshape(nt, ng)
    rows, cols, vals = [], [], []
    if nt > 1:  # a[i, j] leaves (i, j) and enters (i+1, j)
        ai = np.arange((nt - 1) * ng)
        src = node[:-1].reshape(-1)
        dst = node[1:].reshape(-1)
        rows += [src, dst]
        cols += [a.start + ai, a.start + ai]
        vals += [-np.ones(len(ai)), np.ones(len(ai))]
    if ng > 1:  # d[i, j] leaves (i, j) and enters (i, j+1)
        di = np.arange(nt * (ng - 1))
        src = node[:, :-1].reshape(-1)
        dst = node[:, 1:].reshape(-1)
        rows += [src, dst]
        cols += [d.start + di, d.start + di]
        vals += [-np.ones(len(di)), np.ones(len(di))]
    rows.append(node[i, j])
    cols.append(w.start + np.arange(len(i)))
    vals.append(-np.ones(len(i)))
    supply = lv.supply.reshape(-1)
    bld.add_rows("flow", np.concatenate(rows), np.concatenate(cols), np.concatenate(vals), -supply, -supply, b)


def _size_rows(bld: ModelBuilder, b: int, w: Block, m: Block, lo: np.ndarray, hi: np.ndarray, total: float) -> None:
    """A box's members split into its batches:  lo m <= w <= hi m  (w <= total m where uncapped)."""
    k = np.arange(w.stop - w.start)
    cap = np.where(hi < NO_CAP, hi, total).astype(np.float64)
    r = np.concatenate([k, k])
    c = np.concatenate([w.start + k, m.start + k])
    bld.add_rows("batch_cap", r, c, np.concatenate([np.ones(len(k)), -cap]), np.full(len(k), -np.inf),
                 np.zeros(len(k)), b)
    bld.add_rows("batch_floor", r, c, np.concatenate([np.ones(len(k)), -lo.astype(np.float64)]), np.zeros(len(k)),
                 np.full(len(k), np.inf), b)


def _shape_rows(bld: ModelBuilder, b: int, u: np.ndarray, m: Block, z: Block, m_ub: np.ndarray) -> None:
    """A box runs only where its bucket compiles its unit (its shape, or its graph):  m_k <= M_k z[b, u_k]."""
    k = np.arange(len(u))
    r = np.concatenate([k, k])
    c = np.concatenate([m.start + k, z.start + u])
    v = np.concatenate([np.ones(len(k)), -m_ub])
    bld.add_rows("shape_link", r, c, v, np.full(len(k), -np.inf), np.zeros(len(k)), b)


def _limits(bld: ModelBuilder, b: int, bm: BucketModel, t, g, v, box_u, fixed, lat, unit, w: Block, m: Block,
            z: Block, unit_ts: np.ndarray, relax: bool, pen: dict[str, float], spikes: bool) -> None:
    """The limit rows of one bucket (module docstring): cost, pad, sequential time, P95 (``unit_ts``: the
    shape of each compile unit)."""
    lim = bm.limits
    kw = np.arange(w.stop - w.start)
    nu = z.stop - z.start
    if lim.max_cost is not None:
        cols = np.concatenate([m.start + kw, w.start + kw, z.start + np.arange(nu)])
        vals = np.concatenate([fixed, unit, bm.cost.shape_charge(unit_ts)])
        limit_row(bld, "cost", b, cols, vals, lim.max_cost - bm.const_cost, relax, pen)
    if lim.max_pad_ratio is not None:
        per_batch, per_member = box_pad(bm, t, g, v)  # every token a box holds, a graph's padding rows included
        cols = np.concatenate([m.start + kw, w.start + kw])
        vals = np.concatenate([per_batch, per_member])
        keep = vals != 0
        limit_row(bld, "pad", b, cols[keep], vals[keep], (1 + lim.max_pad_ratio) * bm.real_tokens, relax, pen)
    if lim.max_sequential_ms is not None:
        useq = box_unit_seq(bm, t, g, v)
        spike = bm.cost.spike_ms if spikes else 0.0
        cols = np.concatenate([m.start + kw, w.start + kw, z.start + np.arange(nu)])
        vals = np.concatenate([lat, useq, np.full(nu, spike)])
        limit_row(bld, "seq", b, cols, vals, lim.max_sequential_ms, relax, pen)
    if bm.p95_allowed is not None:
        viol = arc_violates(bm, np.zeros(len(kw), np.int64), t, g, v)
        keep = np.flatnonzero(viol > 0)
        cols, vals = [w.start + keep], [viol[keep]]
        if bm.cost.shared_batch_time:
            e = spike_rows(bld, b, bm, v, box_u, m, z)
            cols.append(np.arange(e.start, e.stop))
            vals.append(np.ones(e.stop - e.start))
        limit_row(bld, "p95", b, np.concatenate(cols), np.concatenate(vals), float(bm.p95_allowed), relax, pen)


def spike_rows(bld: ModelBuilder, b: int, bm: BucketModel, v: np.ndarray, box_u: np.ndarray, m: Block, z: Block
               ) -> Block:
    """Device mode: each compile unit's spike (a shape's, or a graph's) lands on a member of one of its batches
    -- harmlessly if some batch of the unit is spike-safe (T + compile_ms within the P95 limit) or has its
    members over the limit anyway (one more ms there counts no one new), else it may push one member over:
    sum_{such boxes of unit u} m_k + e_u >= z[b,u],  and e_u counts against the P95."""
    nu = z.stop - z.start
    e = bld.add_cols("spike_over", np.zeros(nu), 0.0, 1.0, True, b)
    harmless = np.flatnonzero(bm.safe[v] | bm.slow[v])
    r = np.concatenate([box_u[harmless], np.arange(nu), np.arange(nu)])
    c = np.concatenate([m.start + harmless, e.start + np.arange(nu), z.start + np.arange(nu)])
    vals = np.concatenate([np.ones(len(harmless)), np.ones(nu), -np.ones(nu)])
    bld.add_rows("spike_safe", r, c, vals, np.zeros(nu), np.full(nu, np.inf), b)
    return e
