"""The set-partitioning LP under a fixed shape set (``model.planning.shape_lp``): never above the best plan on
those shapes (brute force over every partition of 3-7 requests, with and without a P95 limit, a KV capacity and
a batch-size cap), exact on probes where the answer is known, and a valid bound when cut short."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from helpers import set_partitions

from model.base.runtime import Deadline
from model.cost.common import align, allowed_above
from model.cost.device import DeviceProfile
from model.cost.model import cost_model
from model.planning.shape_lp import cells_of, shape_lp

TOY = DeviceProfile(name="toy", prefill=(2.0, 0.01, 1e-5), decode=(5.0, 1e-4, 0.02),
                    decode_large=(3.0, 1e-4, 0.05), decode_large_from=3, compile_ms=40.0)


def best_on_shapes(cost, S, G, shapes, limit, max_batch) -> float:
    """The least total batch time over every partition and every shape of the set for each batch, each batch
    within the KV capacity and the batch-size cap, at most allowed_above(n) members in batches over the limit."""
    allowed = allowed_above(len(S)) if limit is not None else None
    best = np.inf
    for part in set_partitions(list(range(len(S)))):
        if max_batch is not None and max(len(b) for b in part) > max_batch:
            continue
        options = []
        for blk in part:
            g, n = int(G[blk].max()), len(blk)
            opts = [(float(cost.batch_total(n, s, g)), n) for s in shapes
                    if s >= S[blk].max() and cost.batch_fits(n, s, g)]
            options.append(opts)
        for pick in itertools.product(*options):
            total = sum(t for t, _ in pick)
            over = sum(n for t, n in pick if limit is not None and t > limit)
            if (allowed is None or over <= allowed) and total < best:
                best = total
    return best


def instance(seed: int):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 8))
    from dataclasses import replace
    prof = replace(TOY, kv_capacity_tokens=int(rng.integers(400, 1500)) if seed % 3 == 0 else None)
    cost = cost_model("device", prof)
    S = align(rng.integers(1, 300, n))
    G = rng.integers(1, 200, n)
    shapes = np.unique(np.r_[S.max(), rng.choice(np.unique(S), size=min(2, len(np.unique(S))), replace=False),
                             S.max() + 64 * int(rng.integers(0, 2))])
    g_top = int(G.max())
    lone = float(cost.batch_total(1, int(shapes[-1]), g_top))
    full = float(cost.batch_total(n, int(shapes[-1]), g_top))
    limit = None if seed % 2 else lone + rng.uniform(0.0, 1.0) * max(full - lone, 1.0)
    return cost, S, G, shapes, limit, (2 if seed % 5 == 4 else None)


@pytest.mark.parametrize("seed", range(30))
def test_never_above_the_best_plan_on_the_shapes(seed):
    cost, S, G, shapes, limit, cap = instance(seed)
    best = best_on_shapes(cost, S, G, shapes.tolist(), limit, cap)
    lp = shape_lp(cost, S, G, shapes, limit, cap)
    assert lp.converged
    assert lp.bound <= best * (1 + 1e-9), (lp, best)
    assert lp.bound > 0


def test_two_that_would_be_over_together_are_priced_apart():
    """Two requests: together their batch is over the limit and P95 of two lets none over, so the bound is both
    alone; without the limit it is the one batch of both (cheaper: the decode steps are shared)."""
    cost = cost_model("device", TOY)
    S, G = np.array([64, 64]), np.array([100, 100])
    one, two = float(cost.batch_total(1, 64, 100)), float(cost.batch_total(2, 64, 100))
    assert two < 2 * one and allowed_above(2) == 0
    free = shape_lp(cost, S, G, [64])
    assert free.bound == pytest.approx(two, rel=1e-8)
    held = shape_lp(cost, S, G, [64], limit=(one + two) / 2)
    assert held.converged and held.bound == pytest.approx(2 * one, rel=1e-8)


def test_a_kv_capacity_of_one_member_prices_every_request_alone():
    from dataclasses import replace
    cost = cost_model("device", replace(TOY, kv_capacity_tokens=200))
    S, G = np.array([64, 128, 64]), np.array([50, 10, 30])
    lp = shape_lp(cost, S, G, [128])
    alone = sum(float(cost.batch_total(1, 128, int(g))) for g in G)
    assert lp.bound == pytest.approx(alone, rel=1e-8)


def test_a_plan_given_as_start_is_never_below_the_bound_and_cells_merge_what_shapes_cannot_tell_apart():
    cost = cost_model("device", TOY)
    S, G = np.array([64, 128, 192, 64]), np.array([20, 20, 20, 5])
    cells = cells_of(S, G, np.array([192]))
    assert len(cells.n) == 2 and sorted(cells.n.tolist()) == [1, 3]  # all fit 192: only the gens differ
    plan = float(cost.batch_total(4, 192, 20))
    lp = shape_lp(cost, S, G, [192], start=[(192, np.arange(4))])
    assert lp.bound <= plan * (1 + 1e-9)
    with pytest.raises(ValueError, match="above every shape"):
        cells_of(S, G, np.array([128]))


def test_cut_short_it_claims_nothing_it_has_not_proved():
    cost, S, G, shapes, limit, cap = instance(0)
    cut = shape_lp(cost, S, G, shapes, limit, cap, deadline=Deadline(0.0))
    assert not cut.converged and cut.bound == -np.inf


def test_the_split_puts_each_bucket_beside_the_lp_on_its_own_shapes():
    """Two buckets planned by dpfill in device mode: each row's batch cost is what the evaluator charges the
    bucket less its compiles, and the LP on the same shapes is never above it; reference mode has no split."""
    from dataclasses import replace

    from helpers import bucket, problem

    from model.domain.schema import Limits
    from model.packers import PACKERS
    from model.pipeline import judge
    from model.planning.fixed_set import batching_split

    x = bucket([60, 100, 130, 64, 250, 190], [10, 30, 20, 40, 10, 200], "x")
    y = bucket([51, 100, 130, 700, 64], [19, 53, 20, 300, 16], "y")
    free = problem(x, y, k=4, params=TOY, mode="device")
    plan = PACKERS["dpfill"](free)
    judged = judge(free, "dpfill", plan)
    # a P95 limit the plan meets (its own P95 in each bucket)
    prob = replace(free, limits=tuple(Limits(max_p95_latency_ms=r.metrics.p95_latency_ms)
                                      for r in judged.evaluation.results))
    split = batching_split(prob, plan)
    assert [r.bucket for r in split] == ["x", "y"]
    for row, res in zip(split, judged.evaluation.results, strict=True):
        assert row.batches + row.compiles == pytest.approx(res.metrics.cost, rel=1e-12)
        assert row.shapes == tuple(res.metrics.shapes)
        assert row.on_shapes.lp.converged and 0 < row.on_shapes.bound <= row.batches * (1 + 1e-9)
        assert row.on_shapes.chain.bound <= row.on_shapes.lp.bound * (1 + 1e-6)
    assert batching_split(problem(x, y, k=4), plan) is None


@pytest.mark.parametrize("seed", range(16))
def test_the_fixed_set_bound_is_below_the_brute_force_optimum(seed):
    """Device instances with P95 limits (``test_limit_bound.instance``: one or two buckets, KV capacity, batch
    cap, pad and sequential limits) given a fixed set of allowed shapes: the LP bound on that set never passes
    the best plan, and the planner's reported bound (which takes it where higher) neither."""
    from dataclasses import replace

    from helpers import brute_force, plan_mip
    from test_limit_bound import instance as limited

    from model.planning.fixed_set import fixed_set_bound

    prob = limited(seed)
    top = max(int(align(b.prompt_len).max()) for b in prob.buckets)
    rng = np.random.default_rng(seed)
    allowed = tuple(sorted({top, *(64 * int(v) for v in rng.integers(1, top // 64 + 2, 2))}))
    prob = replace(prob, allowed_shapes=allowed)
    best = brute_force(prob).cost
    bound = fixed_set_bound(prob)
    assert np.isfinite(bound) and bound <= best * (1 + 1e-9), (bound, best)
    if np.isfinite(best):
        assert plan_mip(prob, time_limit=10).report.bound <= best * (1 + 1e-9)


def test_the_fixed_set_bound_prices_what_the_limit_keeps_apart():
    """Two requests that may not share a batch under the P95 limit and one allowed shape: the LP prices both
    alone, which is the optimum, and the planner's bound is at least that."""
    from helpers import bucket, plan_mip, problem

    from model.domain.schema import Limits

    cost = cost_model("device", TOY)
    one, two = float(cost.batch_total(1, 128, 3000)), float(cost.batch_total(2, 128, 3000))
    assert two - one > TOY.compile_ms  # alone, even the member the compile spike lands on stays within
    prob = problem(bucket([60, 100], [3000, 3000]), k=1, params=TOY, mode="device", allowed_shapes=(128,),
                   limits=Limits(max_p95_latency_ms=(one + TOY.compile_ms + two) / 2))
    from model.planning.fixed_set import fixed_set_bound

    assert fixed_set_bound(prob) == pytest.approx(2 * one + TOY.compile_ms, rel=1e-8)
    rep = plan_mip(prob, time_limit=10).report
    assert rep.bound >= fixed_set_bound(prob) * (1 - 1e-12)
    assert rep.objective == pytest.approx(rep.bound, rel=1e-8)


def test_the_subsets_bound_charges_the_compiles_a_bucket_must_pay_and_gives_up_on_too_many_subsets():
    """Two requests at 64 and one allowed shape set (64, 128, 192): every plan compiles at least 64 or a larger
    one, so the bound is at least the cheapest subset's batches plus its compile; with 9 allowed shapes and K = 8
    (more than MAX_SUBSETS subsets) it gives up (-inf) and the caller keeps one compile per bucket."""
    from model.planning.fixed_set import MAX_SUBSETS, subsets_bound

    cost = cost_model("device", TOY)
    S, G = np.array([64, 64]), np.array([100, 100])
    got = subsets_bound(cost, S, G, np.array([64, 128, 192]), None, None, 3, 0.0, Deadline.never())
    best = float(cost.batch_total(2, 64, 100)) + TOY.compile_ms
    assert got == pytest.approx(best, rel=1e-8)
    many = np.arange(1, 10) * 64
    assert sum(1 for k in range(1, 9) for _ in itertools.combinations(range(9), k)) > MAX_SUBSETS
    assert subsets_bound(cost, S, G, many, None, None, 8, 0.0, Deadline.never()) == -np.inf
