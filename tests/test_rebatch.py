"""Re-batching a judged plan's shapes exactly (``model.planning.rebatch``): the weighted runs DP, brute-force
oracles on 3-7 requests with and without windows, the limits kept, and the planners never above it."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest
from helpers import bucket, problem, set_partitions

from model import pipeline
from model.base.runtime import Deadline
from model.cost.device import DeviceProfile, batch_time
from model.cost.model import DeviceCost, GraphCost
from model.domain.schema import Batching, Bucket, Limits, Problem
from model.domain.windowing import windowed, windows_of
from model.packers import PACKERS
from model.planning.rebatch import groups_of, rebatched
from model.planning.run_cuts import members_over, optimal_runs, runs_time

TOY = DeviceProfile(name="toy", prefill=(2.0, 0.01, 1e-5), decode=(5.0, 1e-4, 0.02),
                    decode_large=(3.0, 1e-4, 0.05), decode_large_from=3, compile_ms=40.0, kv_capacity_tokens=2000)


def device(*buckets: Bucket, k: int = 2, limits: Limits = Limits(), prof: DeviceProfile = TOY, **kw) -> Problem:
    return problem(*buckets, k=k, limits=limits, params=prof, mode="device", **kw)


def timed(b: Bucket, arrivals) -> Bucket:
    return replace(b, arrival_s=np.asarray(arrivals, dtype=np.float64))


def compositions(n: int):
    """Every cut of 0..n into consecutive runs, as lists of run ends."""
    for mask in range(1 << (n - 1)):
        yield [i + 1 for i in range(n - 1) if mask >> i & 1] + [n]


# -- the weighted DP ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("cost", [DeviceCost(TOY), GraphCost(replace(TOY, batch_buckets=(1, 2, 4, 8)))],
                         ids=["free batch", "graphs"])
def test_weighted_runs_minimise_time_plus_weights_and_report_their_own_time(cost):
    """Against every composition of the gen-sorted list: the cut minimises time + pad_weight * KV tokens +
    over_weight * members over the limit, and the total it returns is the runs' own device time."""
    rng = np.random.default_rng(4)
    gens = np.sort(rng.integers(1, 120, 8))
    s, lam, mu, limit = 128, 0.01, 30.0, 60.0
    _, batch = optimal_runs(gens, s, cost, None, limit, None, lam, mu)

    def weighted(ends) -> float:
        total, start = 0.0, 0
        for end in ends:
            n, g = end - start, int(gens[end - 1])
            t = float(cost.batch_total(n, s, g))
            total += t + lam * float(cost.kv_tokens(n, s, g)) + (mu * n if t > limit else 0.0)
            start = end
        return total

    ends = (np.flatnonzero(np.diff(np.r_[batch, -1])) + 1).tolist()
    assert weighted(ends) == pytest.approx(min(weighted(e) for e in compositions(len(gens))), rel=1e-12)
    time_, _ = optimal_runs(gens, s, cost, None, limit, None, lam, mu)
    assert time_ == pytest.approx(runs_time(gens, batch, s, cost), rel=1e-12)


def test_a_heavy_pad_weight_holds_fewer_tokens_and_a_zero_over_weight_drops_the_limit():
    rng = np.random.default_rng(9)
    gens = np.sort(rng.integers(1, 300, 30))
    cost = DeviceCost(TOY)

    def tokens(batch) -> float:
        sizes = np.bincount(batch)
        return float(cost.kv_tokens(sizes, 64, gens[np.cumsum(sizes) - 1]).sum())

    held = [tokens(optimal_runs(gens, 64, cost, None, pad_weight=w)[1]) for w in (0.0, 1e-3, 1e-2, 1.0)]
    assert all(a >= b for a, b in zip(held, held[1:], strict=False)) and held[-1] < held[0]
    free = optimal_runs(gens, 64, cost, None)[0]
    assert optimal_runs(gens, 64, cost, None, 50.0, None, 0.0, 0.0)[0] == pytest.approx(free, rel=1e-12)
    # a weight that dominates every time counts members over the limit first: no more of them than the hard
    # limit leaves (which keeps batches of members under it alone within it: with decode_large from 3 members
    # a batch of 3 can be faster than one of 2, so the hard cut is not the least count)
    hard = optimal_runs(gens, 64, cost, None, 400.0)[1]
    soft = optimal_runs(gens, 64, cost, None, 400.0, None, 0.0, 1e9)[1]
    assert members_over(gens, soft, 64, cost, 400.0) <= members_over(gens, hard, 64, cost, 400.0)


# -- brute-force oracles on 3-7 requests -------------------------------------------------------------------


def group_optimum(prob: Problem, b: int, batching: Batching) -> float:
    """The least cost of any batching that keeps every request on its declared shape and every batch in one
    window (compile charged per shape used, as the plan does): every set partition of each group."""
    bk = prob.buckets[b]
    shape = batching.shape_of[batching.batch_of]
    wins = windows_of(prob, bk)
    total = float(prob.cost.shape_charge(np.unique(shape)).sum())
    for key in sorted(set(zip(wins.tolist(), shape.tolist(), strict=True))):
        rows = [i for i in range(len(bk)) if (wins[i], shape[i]) == key]
        best = np.inf
        for part in set_partitions(rows):
            c = 0.0
            for blk in part:
                n, g = len(blk), int(bk.gen_len[blk].max())
                if not prob.cost.batch_fits(n, key[1], g):
                    c = np.inf
                    break
                c += float(batch_time(n, key[1], g, prob.cost.params))
            best = min(best, c)
        total += best
    return total


def tiny(seed: int, n: int, window: bool) -> Problem:
    rng = np.random.default_rng(seed)
    b = bucket(rng.integers(1, 400, n).tolist(), rng.integers(1, 200, n).tolist())
    if not window:
        return device(b)
    return windowed(device(timed(b, np.sort(rng.uniform(0, 20, n)))), 10.0)


@pytest.mark.parametrize("window", [False, True], ids=["no windows", "windows of 10 s"])
@pytest.mark.parametrize("seed,n", [(0, 3), (1, 5), (2, 6), (3, 7)])
def test_rebatching_a_plan_without_limits_reaches_the_brute_force_optimum_of_its_shapes(seed, n, window):
    prob = tiny(seed, n, window)
    for name in ("solo", "pow2"):
        judged = pipeline.judge(prob, name, PACKERS[name](prob))
        best = group_optimum(prob, 0, judged.batchings[0])
        found = rebatched(prob, pipeline.judge, judged, Deadline.never())
        if found is None:  # the plan was already optimal for its shapes
            assert judged.cost == pytest.approx(best, rel=1e-9)
        else:
            assert found.acceptable and found.cost == pytest.approx(best, rel=1e-9) and found.cost < judged.cost


@pytest.mark.parametrize("window", [False, True], ids=["no windows", "windows of 10 s"])
@pytest.mark.parametrize("limits", [Limits(max_p95_latency_ms=700.0), Limits(max_pad_ratio=1.2),
                                    Limits(max_p95_latency_ms=900.0, max_pad_ratio=2.0)],
                         ids=["P95", "pad", "both"])
@pytest.mark.parametrize("seed", range(3))
def test_rebatching_under_limits_meets_them_and_never_costs_more(seed, limits, window):
    base = tiny(seed, 7, window)
    prob = replace(base, limits=(limits,))
    for name in ("solo", "pow2", "dpfill"):
        judged = pipeline.judge(prob, name, PACKERS[name](prob))
        if not judged.acceptable:
            continue
        found = rebatched(prob, pipeline.judge, judged, Deadline.never())
        if found is not None:
            assert found.acceptable and found.cost < judged.cost
            assert found.cost >= group_optimum(prob, 0, judged.batchings[0]) * (1 - 1e-9)
            shapes = found.batchings[0].shape_of[found.batchings[0].batch_of]
            assert (shapes == judged.batchings[0].shape_of[judged.batchings[0].batch_of]).all()


def test_groups_split_at_windows_and_shapes_and_keep_the_graphs_in_use():
    b = timed(bucket([64, 64, 64, 64, 200], [10, 30, 20, 5, 7]), [0.0, 1.0, 12.0, 13.0, 14.0])
    prob = windowed(device(b, prof=replace(TOY, batch_buckets=(1, 2, 4))), 10.0)
    bt = Batching(np.array([0, 0, 1, 2, 3]), np.array([64, 64, 128, 256]))
    groups = groups_of(prob, 0, bt)
    assert [(g.rows.tolist(), g.shape) for g in groups] == [([0, 1], 64), ([2], 64), ([3], 128), ([4], 256)]
    assert groups[0].classes == frozenset({1}) and groups[1].classes == frozenset({0})


# -- the planners ------------------------------------------------------------------------------------------


@pytest.mark.slow  # the MIP runs to its 3 s limit
def test_the_mip_is_never_costlier_than_dpfill_rebatched():
    """A few dozen requests with a KV capacity that binds and limits on pad and P95: the MIP's plan costs no
    more than dpfill's plan re-batched exactly (the issue's long-context target, in miniature)."""
    rng = np.random.default_rng(11)
    n = 40
    b = bucket(rng.integers(100, 900, n).tolist(), np.maximum(1, rng.lognormal(3.5, 1.0, n)).astype(int).tolist())
    prob = device(b, k=3, limits=Limits(max_pad_ratio=3.0, max_p95_latency_ms=1500.0))
    dp = pipeline.judge(prob, "dpfill", PACKERS["dpfill"](prob))
    assert dp.acceptable
    again = rebatched(prob, pipeline.judge, dp, Deadline.never())
    reference = again.cost if again is not None else dp.cost
    run = pipeline.run(prob, "mip", time_limit=3)
    assert run.evaluation.ok and run.evaluation.total_cost <= reference * (1 + 1e-9)


def test_a_deadline_already_passed_rebatches_nothing():
    prob = tiny(2, 6, False)
    judged = pipeline.judge(prob, "solo", PACKERS["solo"](prob))
    assert rebatched(prob, pipeline.judge, judged, Deadline.after(-1.0)) is None


def test_shapes_never_change_and_every_batch_fits():
    prob = tiny(3, 7, True)
    judged = pipeline.judge(prob, "solo", PACKERS["solo"](prob))
    found = rebatched(prob, pipeline.judge, judged, Deadline.never())
    assert found is not None
    bt = found.batchings[0]
    wins = windows_of(prob, prob.buckets[0])
    for k in range(len(bt.shape_of)):
        members = np.flatnonzero(bt.batch_of == k)
        assert len(set(wins[members].tolist())) == 1
        assert prob.cost.batch_fits(len(members), bt.shape_of[k], prob.buckets[0].gen_len[members].max())
    assert list(itertools.chain(found.notes))


def test_the_start_rebatches_the_cheapest_fallback_and_the_end_skips_it_only_when_complete():
    """``mip.rebatched_fallback``: the cheapest fallback re-batched at the start (so the search's time cannot
    squeeze it).  With all the time it needs the search is complete: the tried one and the new one are marked,
    re-batching the new one finds nothing, and the end's ``rebatched_candidates`` re-batches only the other
    fallback.  With no time the tried one stays unmarked and the end re-batches it after all."""
    from model.planning.mip import rebatched_fallback
    from model.planning.rebatch import rebatched_candidates
    rng = np.random.default_rng(11)
    n = 40
    b = bucket(rng.integers(100, 900, n).tolist(), np.maximum(1, rng.lognormal(3.5, 1.0, n)).astype(int).tolist())
    prob = device(b, k=3, limits=Limits(max_pad_ratio=3.0, max_p95_latency_ms=1500.0))
    fallbacks = [pipeline.judge(prob, name, PACKERS[name](prob)) for name in ("dpfill", "solo")]
    assert all(f.acceptable for f in fallbacks) and fallbacks[0].cost < fallbacks[1].cost
    out = rebatched_fallback(prob, pipeline.judge, fallbacks, Deadline.never())
    assert [f.rebatched for f in out[:2]] == [True, False]
    assert len(out) == 3 and out[2].rebatched and out[2].acceptable and out[2].cost < fallbacks[0].cost
    assert rebatched(prob, pipeline.judge, out[2], Deadline.never()) is None
    assert [j.name for j in rebatched_candidates(prob, pipeline.judge, out, Deadline.never())] == ["solo"]
    cut = rebatched_fallback(prob, pipeline.judge, fallbacks, Deadline.after(-1.0))
    assert len(cut) == 2 and not any(f.rebatched for f in cut)
    assert [j.name for j in rebatched_candidates(prob, pipeline.judge, cut, Deadline.never())] == ["dpfill", "solo"]
    assert rebatched_fallback(prob, pipeline.judge, [], Deadline.never()) == []
