"""The MIP, one constraint family at a time, on instances of 1-8 cells built by hand.

Two kinds of test:
- probes: for each family a tiny instance it must allow (feasible) and one it must
  forbid (infeasible), at the level of the arrays (the whole model over every box,
  solved by HiGHS: infeasible with the family, feasible once its rows are relaxed, so
  the family is what decides) and at the level of ``plan_mip``;
- residuals (as PyPSA checks its models): solve, then recompute every family from the
  solution vector -- once as A x against the row bounds, once from the meaning of the
  rows with ``model.cost`` alone -- and from the concrete plan judged by
  ``plan_metrics``, and check that every exact metric respects its limit.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pytest
from helpers import FullModel, bucket, check_valid, full_model, plan_mip, problem

from model.base.errors import InfeasibleError
from model.cost.analytic import compile_cost, decode_cost, member_latency, prefill_cost
from model.cost.common import allowed_above
from model.domain.schema import Batching, Limits, Problem
from solvers.backends import highs
from solvers.backends.milp import MipArrays
from solvers.backends.result import BackendResult, SolveOptions

KB = 1e7  # batch overhead cost
SPIKE = 1500.0


def lat(s: int, g: int) -> float:
    """Largest member latency of a batch with box (s, g), spike excluded."""
    return float(member_latency(s, s, g))


def solve(arrays: MipArrays) -> BackendResult:
    return highs.BACKEND.solve(arrays, SolveOptions(time_limit=20))


def blocks(arrays: MipArrays, kind: str, name: str):
    found = [b for b in (arrays.row_blocks if kind == "row" else arrays.col_blocks) if b.name == name]
    assert found, f"no {kind} block {name!r}"
    return found


def relaxed(arrays: MipArrays, name: str) -> MipArrays:
    """The model with every row of family ``name`` made free (-inf <= A x <= inf)."""
    lo, hi = arrays.row_lo.copy(), arrays.row_hi.copy()
    for blk in blocks(arrays, "row", name):
        lo[blk.slice()], hi[blk.slice()] = -np.inf, np.inf
    return replace(arrays, row_lo=lo, row_hi=hi)


def capped(arrays: MipArrays, name: str, ub: float) -> MipArrays:
    """The model with every column of block ``name`` bounded above by ``ub``."""
    new = arrays.ub.copy()
    for blk in blocks(arrays, "col", name):
        new[blk.slice()] = ub
    return replace(arrays, ub=new)


def with_rhs(arrays: MipArrays, name: str, hi: float) -> MipArrays:
    new = arrays.row_hi.copy()
    for blk in blocks(arrays, "row", name):
        new[blk.slice()] = hi
    return replace(arrays, row_hi=new)


def assert_decides(arrays: MipArrays, name: str) -> None:
    """Infeasible as built, feasible once family ``name`` is relaxed: that family is the one that forbids."""
    assert solve(arrays).status == "infeasible"
    assert solve(relaxed(arrays, name)).status == "optimal"


def raises_infeasible(prob: Problem) -> bool:
    try:
        plan_mip(prob, time_limit=20)
    except InfeasibleError:
        return True
    return False


# ---------------------------------------------------------------- probes: the arrays


def test_coverage_needs_an_arc_for_every_cell():
    fm = full_model(problem(bucket([64, 64, 130], [10, 10, 20])))
    assert solve(fm.arrays).status == "optimal"
    # drop every arc of cell 0: its two requests can no longer be planned
    x = blocks(fm.arrays, "col", "x")[0]
    keep_cols = fm.res[0].arc_cell != 0
    ub = fm.arrays.ub.copy()
    ub[x.start + np.flatnonzero(~keep_cols)] = 0.0
    assert_decides(replace(fm.arrays, ub=ub), "cover")


def test_link_needs_a_batch_wherever_requests_ride():
    fm = full_model(problem(bucket([64, 64, 130], [10, 10, 20])))
    no_batches = capped(fm.arrays, "m", 0.0)
    assert_decides(no_batches, "link")
    free = solve(relaxed(no_batches, "link"))
    assert free.objective < solve(fm.arrays).objective - KB  # without links the overheads vanish


def test_batch_cap_counts_members_of_all_cells_in_a_box():
    """Cells (64,10) x3 and (64,20) x2, B = 2, at most one batch per box: 5 requests need 3 batches,
    but link rows alone (x_ck <= 2 m_k per cell) would let box (64,20) hold 1 + 2."""
    prob = problem(bucket([64] * 5, [10, 10, 10, 20, 20]), max_batch_size=2)
    fm = full_model(prob)
    result = solve(fm.arrays)
    assert result.status == "optimal"
    m = result.x[blocks(fm.arrays, "col", "m")[0].slice()]
    assert round(m.sum()) == 3
    assert_decides(capped(fm.arrays, "m", 1.0), "batch_cap")


def test_cost_limit_row():
    prob = problem(bucket([64, 64, 130], [10, 10, 20]))
    best = solve(full_model(prob).arrays).objective
    at = full_model(problem(*prob.buckets, limits=Limits(max_cost=best)))
    assert solve(at.arrays).objective == pytest.approx(best, rel=1e-9)
    assert_decides(full_model(problem(*prob.buckets, limits=Limits(max_cost=best * (1 - 1e-6)))).arrays, "cost")


def seq_forces_one_batch(gens: list[int]) -> float:
    """A sequential limit that one 64-batch decoding max(gens) meets (with its spike) and two batches do not."""
    return lat(64, max(gens)) + SPIKE + 1.0


def test_pad_limit_row():
    """(64,10) and (64,20) must share a batch: 10 gen pad tokens over 158 real ones."""
    gens = [10, 20]
    seq = seq_forces_one_batch(gens)
    ok = full_model(problem(bucket([64, 64], gens), limits=Limits(max_sequential_ms=seq, max_pad_ratio=10 / 158)))
    assert solve(ok.arrays).status == "optimal"
    tight = full_model(problem(bucket([64, 64], gens), limits=Limits(max_sequential_ms=seq, max_pad_ratio=9 / 158)))
    assert_decides(tight.arrays, "pad")


def test_seq_limit_row_reserves_one_spike_per_shape():
    one = lat(64, 10) + SPIKE
    assert solve(full_model(problem(bucket([64], [10]), limits=Limits(max_sequential_ms=one))).arrays).status == "optimal"
    assert_decides(full_model(problem(bucket([64], [10]), limits=Limits(max_sequential_ms=one - 1.0))).arrays, "seq")


def p95_bucket(n_big: int):
    """19 short requests (64,10) and n_big long ones (704,300): nearest-rank P95 lets exactly one lie above."""
    return bucket([64] * 19 + [700] * n_big, [10] * 19 + [300] * n_big)


P95_LIMIT = 10_000.0  # far above a short request (2149 ms, 3649 with a spike), far below a long one


def test_p95_limit_row_counts_members_above():
    assert allowed_above(20) == 1 and allowed_above(21) == 1
    assert lat(64, 10) + SPIKE < P95_LIMIT < float(member_latency(64, 704, 300))
    ok = full_model(problem(p95_bucket(1), limits=Limits(max_p95_latency_ms=P95_LIMIT)))
    assert solve(ok.arrays).status == "optimal"
    assert_decides(full_model(problem(p95_bucket(2), limits=Limits(max_p95_latency_ms=P95_LIMIT))).arrays, "p95")


def test_strict_shape_rows():
    """Strict mode, prompts 64 and 704, K = 1: both ride at 704; without shapes nothing runs."""
    fm = full_model(problem(bucket([64, 700], [10, 10]), k=1, mode="strict"))
    result = solve(fm.arrays)
    assert result.status == "optimal"
    y = result.x[blocks(fm.arrays, "col", "y")[0].slice()]
    assert fm.shapes[np.rint(y) == 1].tolist() == [704]
    assert_decides(with_rhs(fm.arrays, "shape_cap", 0.0), "shape_cap")
    assert_decides(capped(fm.arrays, "z", 0.0), "shape_link")
    assert_decides(capped(fm.arrays, "y", 0.0), "shape_global")


# ---------------------------------------------------------------- probes: plan_mip


def test_plan_mip_cost_limit():
    b = bucket([64, 64, 130], [10, 10, 20])
    best = plan_mip(problem(b)).report.objective
    assert plan_mip(problem(b, limits=Limits(max_cost=best))).report.objective == best
    assert raises_infeasible(problem(b, limits=Limits(max_cost=best * (1 - 1e-6))))


def test_plan_mip_pad_limit_with_a_forced_merge():
    gens = [10, 20]
    lim = Limits(max_sequential_ms=seq_forces_one_batch(gens), max_pad_ratio=10 / 158)
    (bt,) = plan_mip(problem(bucket([64, 64], gens), limits=lim)).batchings
    assert bt.batch_of.tolist() == [0, 0]
    assert raises_infeasible(problem(bucket([64, 64], gens), limits=replace(lim, max_pad_ratio=9 / 158)))


def test_plan_mip_reference_prompt_pad_is_fixed():
    """Prompt 50 pads to 64 whatever the plan: 14 pad tokens over 60 real ones."""
    assert plan_mip(problem(bucket([50], [10]), limits=Limits(max_pad_ratio=14 / 60))).report.objective > 0
    assert raises_infeasible(problem(bucket([50], [10]), limits=Limits(max_pad_ratio=13 / 60)))


def test_plan_mip_strict_counts_alignment_pad():
    """Prompt 100 pads to 128 whatever the plan (ratio 28/105): a 0.1 limit cannot be met.  The model's pad
    rows omit this alignment pad in strict mode (see the residual cases below); plan_mip must still say so."""
    prob = problem(bucket([100], [5]), mode="strict", limits=Limits(max_pad_ratio=0.1))
    assert raises_infeasible(prob)


def test_plan_mip_seq_limit():
    one = lat(64, 10) + SPIKE
    assert plan_mip(problem(bucket([64], [10]), limits=Limits(max_sequential_ms=one))).report.objective > 0
    assert raises_infeasible(problem(bucket([64], [10]), limits=Limits(max_sequential_ms=one - 1.0)))


def test_plan_mip_max_batch_size_binds_against_seq_limit():
    """Three identical requests: one batch meets the sequential limit, three batches (B = 1) cannot."""
    b = bucket([64] * 3, [10] * 3)
    lim = Limits(max_sequential_ms=lat(64, 10) + SPIKE + 1.0)
    (bt,) = plan_mip(problem(b, limits=lim)).batchings
    assert bt.batch_of.tolist() == [0, 0, 0]
    assert raises_infeasible(problem(b, limits=lim, max_batch_size=1))


def test_plan_mip_p95_lets_exactly_the_allowed_members_above():
    prob = problem(p95_bucket(1), limits=Limits(max_p95_latency_ms=P95_LIMIT))
    (r,) = check_valid(prob, plan_mip(prob).batchings)
    assert r.metrics.p95_latency_ms <= P95_LIMIT
    assert raises_infeasible(problem(p95_bucket(2), limits=Limits(max_p95_latency_ms=P95_LIMIT)))


def test_plan_mip_p95_counts_the_compile_spike():
    """One request 100 ms under the limit: its compile spike (+1500 ms) breaks it in every plan (the P95 is
    the maximum), so plan_mip must say so with a proof."""
    prob = problem(bucket([64], [10]), limits=Limits(max_p95_latency_ms=lat(64, 10) + 100.0))
    assert raises_infeasible(prob)


def test_plan_mip_strict_shape_cap():
    """Strict, prompts 64 and 704: at K = 1 the 64 prompt pads to 704 (ratio 640/788), at K = 2 nothing pads."""
    b = bucket([64, 704], [10, 10])
    prob = problem(b, k=2, mode="strict", limits=Limits(max_pad_ratio=0.5))
    (bt,) = plan_mip(prob).batchings
    assert sorted(bt.shape_of.tolist()) == [64, 704]
    assert raises_infeasible(problem(b, k=1, mode="strict", limits=Limits(max_pad_ratio=0.5)))


@pytest.mark.parametrize("mode", ["reference", "strict"])
def test_plan_mip_shape_cap_is_joint_across_buckets(mode):
    prob = problem(bucket([60], [10], "x"), bucket([700], [10], "y"), k=1, mode=mode)
    results = check_valid(prob, plan_mip(prob).batchings)
    assert [r.metrics.shapes for r in results] == [(704,), (704,)]


# ---------------------------------------------------------------- residuals


def plan_from_solution(prob: Problem, fm: FullModel, x: np.ndarray) -> tuple[Batching, ...]:
    """Concrete batches read off the solution vector, independently of the planner's own expansion.

    Arc (c, k) with value v takes the next v requests of cell c (file order) into box k; a box's
    members split into chunks of at most B; the shape is the bucket's one shape (reference) or t_k.
    """
    out = []
    for b, (bm, r) in enumerate(zip(fm.bms, fm.res, strict=True)):
        xa = np.rint(x[fm.arrays.block("col", "x", b).slice()]).astype(int)
        queue = {c: list(np.flatnonzero(bm.hist.cell_of == c)) for c in range(len(bm.hist))}
        members: dict[int, list[int]] = {}
        for a in np.flatnonzero(xa):
            c, k = int(r.arc_cell[a]), int(r.arc_box[a])
            members.setdefault(k, []).extend(queue[c][:xa[a]])
            del queue[c][:xa[a]]
        batch_of = np.full(len(bm.hist.cell_of), -1)
        shapes = []
        size = prob.max_batch_size or len(batch_of)
        for k, reqs in sorted(members.items()):
            for lo in range(0, len(reqs), size):
                batch_of[reqs[lo:lo + size]] = len(shapes)
                shapes.append(fm.ref_shapes[b] if fm.ref_shapes is not None else int(r.t[k]))
        assert (batch_of >= 0).all(), "coverage: every request in some box"
        out.append(Batching(batch_of, np.asarray(shapes, dtype=np.int64)))
    return tuple(out)


REF_BUCKET = bucket([50, 64, 100, 130, 64, 200] + [60] * 14, [10, 12, 30, 20, 10, 40] + [11] * 14)
RESIDUAL_CASES = {  # feasible, with limits that bind (the unconstrained optimum breaks at least one)
    "reference, seq + P95 + cost": problem(
        REF_BUCKET, limits=Limits(max_cost=2.8e8, max_p95_latency_ms=15_000.0, max_sequential_ms=60_000.0)),
    "reference, pad + seq + cost": problem(
        REF_BUCKET, limits=Limits(max_cost=2.0e8, max_pad_ratio=0.135, max_sequential_ms=65_000.0)),
    "reference, batch cap": problem(
        bucket([64] * 5 + [128] * 3, [10, 10, 12, 14, 30, 10, 20, 20]), max_batch_size=3,
        limits=Limits(max_pad_ratio=20 / 830, max_sequential_ms=30_000.0)),  # the optimum without: 30 pad tokens
    "strict, aligned prompts, K=2": problem(
        bucket([64, 128, 128, 192, 256], [10, 10, 30, 20, 40]), k=2, mode="strict",
        limits=Limits(max_pad_ratio=0.2, max_sequential_ms=66_000.0)),
    "strict, two buckets, K=2": problem(
        bucket([64, 128, 192], [10, 30, 20], "x"), bucket([64, 256], [40, 10], "y"), k=2, mode="strict",
        limits=Limits(max_sequential_ms=40_000.0)),
}
STRICT_UNALIGNED = problem(bucket([50, 100, 130, 190, 250], [10, 10, 30, 20, 40]), k=2, mode="strict",
                           limits=Limits(max_pad_ratio=0.6))
ROWS_CASES = [pytest.param(p, id=name) for name, p in RESIDUAL_CASES.items()] + [
    pytest.param(STRICT_UNALIGNED, id="strict, unaligned prompts, pad limit")]
MEANING_CASES = ROWS_CASES


@pytest.fixture(scope="module")
def solved():
    cache: dict[int, tuple[FullModel, BackendResult]] = {}

    def get(prob: Problem):
        if id(prob) not in cache:
            fm = full_model(prob)
            cache[id(prob)] = (fm, solve(fm.arrays))
        return cache[id(prob)]
    return get


@pytest.mark.parametrize("prob", MEANING_CASES)
def test_residual_limits_bind(prob, solved):
    """Each residual case's limits change the optimum, so the checks below see binding rows."""
    _, result = solved(prob)
    free = Problem(prob.buckets, tuple(Limits() for _ in prob.buckets), prob.max_shapes, prob.cost,
                   prob.max_batch_size)
    assert result.objective > solve(full_model(free).arrays).objective * (1 + 1e-9)


@pytest.mark.parametrize("prob", ROWS_CASES)
def test_rows_hold_at_the_solution(prob, solved):
    fm, result = solved(prob)
    assert result.status == "optimal"
    a, x = fm.arrays, result.x
    assert (x >= a.lb - 1e-9).all() and (x <= a.ub + 1e-9).all()
    assert np.abs(x[a.integer] - np.rint(x[a.integer])).max() < 1e-6
    x = np.where(a.integer, np.rint(x), x)
    act = np.bincount(a.rows, weights=a.vals * x[a.cols], minlength=a.n_rows)
    for blk in a.row_blocks:
        s = blk.slice()
        tol = 1e-7 * np.maximum(1.0, np.abs(np.where(np.isfinite(a.row_hi[s]), a.row_hi[s], 0)))
        assert (act[s] >= a.row_lo[s] - tol).all() and (act[s] <= a.row_hi[s] + tol).all(), blk.name
    assert (a.c @ x + a.offset) * a.scale == pytest.approx(result.objective, rel=1e-9)


@dataclass(frozen=True)
class Family:
    """One bucket's constraint families evaluated at a solution, from what the rows mean."""

    cost: float
    pad: float  # pad tokens
    seq: float  # sum of batch latencies plus what the spikes add where the model places them
    above: float  # members whose latency exceeds the P95 limit, spikes counted where the model places them
    shapes: frozenset[int]


def spikes(prob: Problem, fm: FullModel, x: np.ndarray, b: int, member: np.ndarray, limit: float,
           used: frozenset[int]) -> tuple[float, float]:
    """What the compile spikes add to sequential time and to the members above the P95 limit, from the spike
    columns' meaning: per shape one option -- some harmless member (w: a whole spike, no count), any member
    (v: a whole spike, one count) or, in reference mode, a member of one arc (u: its batch grows by
    max(0, its latency + spike - the box's largest), one count if it crosses the limit)."""
    lim, r, a = prob.limits[b], fm.res[b], fm.arrays
    col = {name: x[blk.slice()] if (blk := a.block("col", name, b)) is not None else np.zeros(0)
           for name in ("spike_w", "spike_v", "spike_u")}
    if lim.max_p95_latency_ms is None and lim.max_sequential_ms is None:
        assert not any(len(c) for c in col.values())
        return SPIKE * len(used), 0.0
    xa = x[a.block("col", "x", b).slice()]
    top = member_latency(r.t, r.t, r.g, prob.cost.params)[r.arc_box]
    harmless = (member + SPIKE <= limit) | (member > limit)
    if prob.cost.pads_to_shape:
        if lim.max_p95_latency_ms is None:
            return SPIKE * len(used), 0.0
        shapes = fm.shapes.tolist()
        for s in used:
            i = shapes.index(s)
            assert col["spike_w"][i] + col["spike_v"][i] == 1, "one option per shape compiled"
            assert col["spike_w"][i] == 0 or (harmless & (r.t[r.arc_box] == s) & (xa > 0)).any(), "w: harmless"
        return SPIKE * len(used), float(col["spike_v"].sum())
    arcs = np.flatnonzero(member < top) if lim.max_sequential_ms is not None else np.zeros(0, np.int64)
    assert len(col["spike_u"]) == len(arcs)
    assert col["spike_w"].sum() + col["spike_v"].sum() + col["spike_u"].sum() == 1, "one recipient"
    assert col["spike_w"].sum() == 0 or (harmless & (xa > 0)).any(), "w: a harmless member rides"
    assert (col["spike_u"] <= xa[arcs]).all(), "u: a member of its arc rides"
    growth = np.maximum(0.0, member[arcs] + SPIKE - top[arcs])
    seq = SPIKE * (col["spike_w"].sum() + col["spike_v"].sum()) + growth @ col["spike_u"]
    return float(seq), float(col["spike_v"].sum() + (~harmless[arcs]) @ col["spike_u"])


def families(prob: Problem, fm: FullModel, x: np.ndarray) -> list[Family]:
    """Cover, link and batch_cap asserted; cost, pad, seq, P95 and shapes computed with model.cost alone."""
    p, strict, B = prob.cost.params, prob.cost.pads_to_shape, prob.max_batch_size
    out = []
    for b, (bm, r, lim) in enumerate(zip(fm.bms, fm.res, prob.limits, strict=True)):
        h = bm.hist
        m = x[fm.arrays.block("col", "m", b).slice()]
        xa = x[fm.arrays.block("col", "x", b).slice()]
        cell, t, g = r.arc_cell, r.t[r.arc_box], r.g[r.arc_box]
        assert (np.bincount(cell, xa, minlength=len(h)) == h.count).all(), "cover"
        assert (xa <= np.minimum(h.count[cell], B or np.inf) * m[r.arc_box]).all(), "link"
        if B is not None:
            assert (np.bincount(r.arc_box, xa, minlength=len(m)) <= B * m).all(), "batch_cap"
        used = frozenset(int(s) for s in r.t[m > 0]) if strict else frozenset({fm.ref_shapes[b]})
        prefill = prefill_cost(t, p) @ xa if strict else prefill_cost(h.S, p) @ h.count
        cost = KB * m.sum() + decode_cost(t, g, p) @ xa + prefill + compile_cost(np.array(sorted(used)), p).sum()
        prompt_pad = (t @ xa if strict else h.S @ h.count) - h.prompt_sum.sum()
        pad = prompt_pad + (g - h.G[cell]) @ xa
        limit = lim.max_p95_latency_ms if lim.max_p95_latency_ms is not None else np.inf
        member = member_latency(t if strict else h.S[cell], t, g, p)
        spike_seq, spike_above = spikes(prob, fm, x, b, member, limit, used)
        seq = member_latency(r.t, r.t, r.g, p) @ m + spike_seq
        above = (member > limit) @ xa + spike_above
        out.append(Family(float(cost), float(pad), float(seq), float(above), used))
    return out


@pytest.mark.parametrize("prob", MEANING_CASES)
def test_families_rebuilt_from_the_solution(prob, solved):
    """Every family recomputed from what the rows mean, with model.cost alone (not model.boxes)."""
    fm, result = solved(prob)
    fams = families(prob, fm, np.rint(result.x))
    for f, bk, lim in zip(fams, prob.buckets, prob.limits, strict=True):
        real = int(bk.prompt_len.sum() + bk.gen_len.sum())
        assert f.cost <= (lim.max_cost if lim.max_cost is not None else np.inf), "cost"
        assert f.pad <= (lim.max_pad_ratio * real if lim.max_pad_ratio is not None else np.inf), "pad"
        assert f.seq <= (lim.max_sequential_ms if lim.max_sequential_ms is not None else np.inf), "seq"
        assert f.above <= allowed_above(len(bk)), "p95"
    assert len(frozenset().union(*(f.shapes for f in fams))) <= prob.max_shapes, "shape_cap"
    assert sum(f.cost for f in fams) == pytest.approx(result.objective, rel=1e-9), "objective"


@pytest.mark.parametrize("prob", MEANING_CASES)
def test_concrete_plan_meets_every_limit_and_matches_the_model(prob, solved):
    """The plan behind the solution, judged by plan_metrics: the model's cost and pad are exact (no coarsening,
    tight boxes at an optimum), its sequential time a bound, and every limit holds."""
    fm, result = solved(prob)
    results = check_valid(prob, plan_from_solution(prob, fm, result.x))
    for r, f in zip(results, families(prob, fm, np.rint(result.x)), strict=True):
        assert r.metrics.cost == pytest.approx(f.cost, rel=1e-9)
        assert r.metrics.pad_tokens == round(f.pad)
        assert f.seq - SPIKE * len(f.shapes) <= r.metrics.sequential_ms <= f.seq * (1 + 1e-12)
        assert set(r.metrics.shapes) == f.shapes
        assert all(c.ok for c in r.checks), [c for c in r.checks if not c.ok]
