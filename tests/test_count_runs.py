"""The runs DP with the P95 count as a state (``model.planning.count_runs``) and its use: per-constraint probes,
brute-force oracles over every set partition of 3-7 requests (one group, several groups and shapes, the compile
spike's spot), and the re-batching that uses it reaching the judged optimum of a plan's own shapes."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from helpers import bucket, problem, set_partitions

from model import pipeline
from model.base.runtime import Deadline
from model.cost.common import align, allowed_above
from model.cost.device import DeviceProfile
from model.cost.model import DeviceCost, GraphCost
from model.domain.schema import Batching, Limits, Problem
from model.domain.windowing import windowed
from model.packers import PACKERS
from model.planning.count_runs import best_runs, group_runs, min_plus, spiked
from model.planning.rebatch import rebatched

TOY = DeviceProfile(name="toy", prefill=(2.0, 0.01, 1e-5), decode=(5.0, 1e-4, 0.02),
                    decode_large=(3.0, 1e-4, 0.05), decode_large_from=3, compile_ms=40.0, kv_capacity_tokens=2000)
SPIKE = 40.0


def partition_value(cost, s: int, gens: np.ndarray, part, limit: float | None) -> tuple[float, int, bool]:
    """(time, members over ``limit``, whether a batch is a harmless spot for the spike) of one partition; time
    inf where a batch does not fit."""
    total, over, spot = 0.0, 0, limit is None
    for blk in part:
        n, g = len(blk), int(gens[blk].max())
        if not cost.batch_fits(n, s, g):
            return np.inf, 0, False
        t = float(cost.batch_total(n, s, g))
        total += t
        if limit is not None and t > limit:
            over += n
            spot = True
        elif limit is not None and t + SPIKE <= limit:
            spot = True
    return total, over, spot


def brute_curve(cost, s: int, gens: np.ndarray, limit: float | None, most: int) -> np.ndarray:
    """Per final count k <= most (the spike's member included), the least time of any partition."""
    out = np.full(most + 1, np.inf)
    for part in set_partitions(list(range(len(gens)))):
        t, over, spot = partition_value(cost, s, gens, part, limit)
        k = over + (0 if spot else 1)
        if k <= most:
            out[k] = min(out[k], t)
    return out


COSTS = [DeviceCost(TOY), GraphCost(replace(TOY, batch_buckets=(1, 2, 4, 8)))]


@pytest.mark.parametrize("cost", COSTS, ids=["free batch", "graphs"])
@pytest.mark.parametrize("seed,n", [(0, 3), (1, 4), (2, 5), (3, 6), pytest.param(4, 7, marks=pytest.mark.slow),
                                    pytest.param(5, 7, marks=pytest.mark.slow)])
def test_one_group_reaches_every_partitions_least_time_at_each_count(cost, seed, n):
    rng = np.random.default_rng(seed)
    gens = np.sort(rng.integers(1, 150, n))
    s = int(rng.choice([64, 128, 256]))
    alone = [float(cost.batch_total(1, s, int(g))) for g in gens]
    limit = float(np.quantile(alone, 0.6)) + 5.0  # some batches over, some within, some with room for the spike
    most = n
    table = group_runs(gens, s, cost, None, limit, most, SPIKE)
    found, _ = spiked(table.value, most)
    # at most k over (what a count allows): a cut into consecutive runs can only lower a count, so the curves at
    # exactly k may differ, their running minima may not
    assert np.allclose(np.minimum.accumulate(found), np.minimum.accumulate(brute_curve(cost, s, gens, limit, most)),
                       rtol=1e-12)
    # and the batching it walks back to has the time and the count it claims
    k = int(np.argmin(found))
    h = 1 if np.isfinite(table.value[1, k]) and table.value[1, k] == found[k] else 0
    runs = table.batches(h, k if h else k - 1)
    sizes = np.bincount(runs)
    t = cost.batch_total(sizes, s, gens[np.cumsum(sizes) - 1])
    assert float(t.sum()) == pytest.approx(found[k], rel=1e-12)


def test_no_limit_is_the_plain_runs_dp_and_a_count_of_zero_keeps_every_batch_within_the_limit():
    cost = DeviceCost(TOY)
    gens = np.array([3, 8, 20, 40, 90])
    free = group_runs(gens, 128, cost, None, None, 5, SPIKE)
    assert free.value.shape == (2, 1) and not np.isfinite(free.value[0, 0])
    assert free.value[1, 0] == pytest.approx(brute_curve(cost, 128, gens, None, 0)[0], rel=1e-12)
    limit = float(cost.batch_total(2, 128, 90)) + 1.0  # the longest fits within it only in a small batch
    within = group_runs(gens, 128, cost, None, limit, 0, SPIKE)
    runs = within.batches(0, 0) if np.isfinite(within.value[0, 0]) else within.batches(1, 0)
    sizes = np.bincount(runs)
    assert (cost.batch_total(sizes, 128, gens[np.cumsum(sizes) - 1]) <= limit).all()


def test_the_spike_needs_a_spot_or_costs_one_member():
    """One member whose batch is well within the limit but not by a spike: the spike puts it over (count 1);
    with a limit the spike fits under, the count is 0."""
    cost = DeviceCost(TOY)
    gens = np.array([10])
    t = float(cost.batch_total(1, 64, 10))
    tight = spiked(group_runs(gens, 64, cost, None, t + 1.0, 1, SPIKE).value, 1)[0]
    assert not np.isfinite(tight[0]) and tight[1] == pytest.approx(t)
    roomy = spiked(group_runs(gens, 64, cost, None, t + SPIKE, 1, SPIKE).value, 1)[0]
    assert roomy[0] == pytest.approx(t)
    assert not np.isfinite(spiked(group_runs(gens, 64, cost, None, t + 1.0, 0, SPIKE).value, 0)[0]).any()


def test_min_plus_is_the_least_split_of_a_count():
    a, b = np.array([5.0, 3.0, 1.0]), np.array([4.0, np.inf, 0.5])
    c, split = min_plus(a, b, 3)
    assert c.tolist() == [9.0, 7.0, 5.0, 3.5] and split.tolist() == [0, 0, 0, 2]
    assert min_plus(a, b, 1)[0].tolist() == [9.0, 7.0]


@pytest.mark.parametrize("seed", range(5))
def test_groups_of_two_shapes_share_one_count_and_a_spike_per_shape(seed):
    """Three groups: two at one shape (two windows) and one at another; against every partition of each group,
    the count summed, a spike per shape harmless where any of its groups has a spot."""
    cost = DeviceCost(TOY)
    rng = np.random.default_rng(10 + seed)
    groups = [np.sort(rng.integers(1, 150, n)) for n in (3, 2, 3)]
    shapes = [64, 64, 256]
    limit = float(cost.batch_total(2, 64, 100))
    most = 4
    tables = [group_runs(g, s, cost, None, limit, most, SPIKE) for g, s in zip(groups, shapes, strict=True)]
    found = best_runs(tables, shapes, most)
    best = np.inf
    parts = [list(set_partitions(list(range(len(g))))) for g in groups]
    for p0 in parts[0]:
        for p1 in parts[1]:
            for p2 in parts[2]:
                vals = [partition_value(cost, s, g, p, limit) for g, s, p in zip(groups, shapes, (p0, p1, p2),
                                                                                 strict=True)]
                count = sum(v[1] for v in vals) + (0 if vals[0][2] or vals[1][2] else 1) + (0 if vals[2][2] else 1)
                if count <= most:
                    best = min(best, sum(v[0] for v in vals))
    if not np.isfinite(best):
        assert found is None
        return
    value, runs = found
    assert value == pytest.approx(best, rel=1e-12)
    again = 0.0
    for g, s, r in zip(groups, shapes, runs, strict=True):
        sizes = np.bincount(r)
        again += float(cost.batch_total(sizes, s, g[np.cumsum(sizes) - 1]).sum())
    assert again == pytest.approx(value, rel=1e-12)


# -- the re-batching that uses it, judged ------------------------------------------------------------------


def judged_optimum(prob: Problem, batching: Batching) -> float:
    """The least judged cost of any plan keeping every request on its declared shape (one bucket, no windows):
    every set partition of each shape's members, judged by the evaluator (spikes placed by the expansion)."""
    b = prob.buckets[0]
    shape = batching.shape_of[batching.batch_of]
    keys = sorted(set(shape.tolist()))
    per = [[list(map(int, blk)) for blk in [np.flatnonzero(shape == s)]][0] for s in keys]
    best = np.inf

    def rec(i: int, blocks: list[tuple[int, list[int]]]) -> None:
        nonlocal best
        if i == len(keys):
            batch_of = np.empty(len(b), dtype=np.int64)
            for k, (_, blk) in enumerate(blocks):
                batch_of[blk] = k
            bt = Batching(batch_of, np.array([s for s, _ in blocks], dtype=np.int64))
            j = pipeline.judge(prob, "brute", (bt,))
            if j.acceptable:
                best = min(best, j.cost)
            return
        for part in set_partitions(per[i]):
            rec(i + 1, blocks + [(keys[i], blk) for blk in part])

    rec(0, [])
    return best


@pytest.mark.parametrize("seed", range(6))
def test_rebatching_under_a_p95_limit_reaches_the_judged_optimum_of_its_shapes(seed):
    rng = np.random.default_rng(30 + seed)
    n = 6
    b = bucket(rng.integers(1, 300, n).tolist(), rng.integers(1, 200, n).tolist())
    base = problem(b, k=2, params=TOY, mode="device")
    alone = [float(base.cost.batch_total(1, int(s), int(g))) for s, g in zip(align(b.prompt_len), b.gen_len,
                                                                               strict=True)]
    prob = replace(base, limits=(Limits(max_p95_latency_ms=float(np.median(alone)) + 60.0),))
    for name in ("solo", "pow2", "dpfill"):
        judged = pipeline.judge(prob, name, PACKERS[name](prob))
        if not judged.acceptable:
            continue
        best = judged_optimum(prob, judged.batchings[0])
        found = rebatched(prob, pipeline.judge, judged, Deadline.never())
        got = found.cost if found is not None else judged.cost
        assert got == pytest.approx(best, rel=1e-9)


def test_a_window_limits_the_count_by_its_waits_and_the_judge_has_the_last_word():
    """With windows the DP takes each group's longest wait off the limit; whatever it returns meets the limit."""
    rng = np.random.default_rng(7)
    n = 7
    b = replace(bucket(rng.integers(1, 300, n).tolist(), rng.integers(1, 200, n).tolist()),
                arrival_s=np.sort(rng.uniform(0, 20, n)))
    prob = windowed(problem(b, k=2, params=TOY, mode="device", limits=Limits(max_p95_latency_ms=900.0)), 10.0)
    assert allowed_above(n) == 0
    for name in ("solo", "pow2"):
        judged = pipeline.judge(prob, name, PACKERS[name](prob))
        if judged.acceptable:
            found = rebatched(prob, pipeline.judge, judged, Deadline.never())
            assert found is None or (found.acceptable and found.cost < judged.cost)


def default_bucket_alone(b: int, shapes: list[int]) -> tuple[Problem, Batching]:
    """The embedded default scenario's bucket b alone, every request alone at its smallest of ``shapes``."""
    prob, _ = pipeline.load_problem(pipeline.InputSpec(scenario=pipeline.DEFAULT_SCENARIO, max_shapes=8))
    prob = replace(prob, buckets=(prob.buckets[b],), limits=(prob.limits[b],))
    S = align(prob.buckets[0].prompt_len)
    ys = np.array(shapes)
    return prob, Batching(np.arange(len(S)), ys[np.searchsorted(ys, S)])


def test_the_count_beats_the_weight_where_the_curve_is_not_convex_and_the_judge_agrees_with_the_dp():
    """The default scenario's chat bucket on 320, 1024, 2048: the Lagrangian weight's best re-batching costs
    345,197.1 device-ms, the counted DP's 336,894.3 (what the main job's plan gained); its judged cost is the
    DP's own value, compiles included."""
    from model.planning import rebatch
    from model.planning.count_runs import counted_runs
    from model.planning.groups import groups_of

    prob, bt = default_bucket_alone(0, [320, 1024, 2048])
    groups = groups_of(prob, 0, bt)
    weighted = [rebatch.cut(prob, groups, len(bt.batch_of), 0.0, w, Deadline.never()) for w in
                np.geomspace(1.0, 1e5, 41)]
    costs = [pipeline.judge(prob, "w", (w,)) for w in weighted if w is not None]
    best_weighted = min(j.cost for j in costs if j.acceptable)
    exact = rebatch.counted(prob, 0, groups, 0.0, pipeline.judge, "x", Deadline.never())
    assert exact is not None and exact[1] < best_weighted * 0.98
    value, _ = counted_runs(prob, groups, allowed_above(len(bt.batch_of)))
    assert exact[1] == pytest.approx(value, rel=1e-9)


@pytest.mark.parametrize("unit", [2, 3, 8])
def test_counts_in_units_never_claim_fewer_members_over_than_there_are(unit):
    """In units of u members a run over the limit takes ceil(n / u) units: what comes back meets the count in
    members, and it costs no less than the exact count's answer."""
    cost = DeviceCost(TOY)
    rng = np.random.default_rng(unit)
    gens = np.sort(rng.integers(1, 200, 40))
    limit = float(cost.batch_total(4, 128, 170))
    allowed = 16
    exact = best_runs([group_runs(gens, 128, cost, None, limit, allowed, SPIKE)], [128], allowed)
    coarse = best_runs([group_runs(gens, 128, cost, None, limit, allowed // unit, SPIKE, unit=unit)], [128],
                       allowed // unit)
    assert exact is not None
    if coarse is None:  # coarser counts may find nothing (a spike alone takes a unit): never a false plan
        assert unit > 2
        return
    sizes = np.bincount(coarse[1][0])
    t = cost.batch_total(sizes, 128, gens[np.cumsum(sizes) - 1])
    spot = bool(((t > limit) | (t + SPIKE <= limit)).any())
    assert int(sizes[t > limit].sum()) + (0 if spot else 1) <= allowed
    assert coarse[0] >= exact[0] * (1 - 1e-12) and float(t.sum()) == pytest.approx(coarse[0], rel=1e-12)


def test_a_group_its_classes_cannot_cut_gives_no_batching_with_or_without_a_limit():
    """Three members where only batches of exactly 2 may run (the graph of bucket 2): no cut exists, and the
    bucket's counted runs say so (None) rather than failing to walk back."""
    from model.planning.count_runs import counted_runs
    from model.planning.groups import Group

    cost = GraphCost(replace(TOY, batch_buckets=(1, 2, 4, 8)))
    two = frozenset(np.asarray(cost.size_class(np.array([2]))).tolist())
    prob = problem(bucket([10, 10, 10], [5, 6, 7]), k=1, cost=cost)
    for p95 in (None, 1e9):
        g = Group(np.arange(3), np.array([5, 6, 7]), 64, 0, np.zeros(3), p95, two)
        assert counted_runs(prob, [g], 0 if p95 is None else 1) is None
