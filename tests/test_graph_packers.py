"""Compiled batch sizes in the packers and the exact-runs DP: no batch exceeds the largest bucket, every graph's KV
fits, dpfill fills each shape's gen-sorted members in batches of the bucket sizes, and a run of n is priced by its
graph's T(B(n)) (shared/cost_model.md, "Compiled batch sizes (graphs) in device mode")."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from helpers import bucket, check_valid, problem

from model.cost.device import DeviceProfile, batch_time
from model.cost.model import cost_model
from model.domain.schema import Limits
from model.packers import PACKERS
from model.planning.exact_runs import IntervalRuns
from model.planning.run_cuts import optimal_runs, priced_runs

TOY = DeviceProfile(name="toy", prefill=(2.0, 0.01, 1e-5), decode=(5.0, 1e-4, 0.02),
                    decode_large=(3.0, 1e-4, 0.05), decode_large_from=3, compile_ms=40.0, kv_capacity_tokens=6000)
BUCKETS = (1, 2, 4, 8)


def graphs(prof: DeviceProfile = TOY, buckets=BUCKETS):
    return cost_model("device", replace(prof, batch_buckets=buckets))


def many(n: int, seed: int):
    rng = np.random.default_rng(seed)
    return bucket(rng.integers(1, 900, n).tolist(), rng.integers(1, 400, n).tolist())


@pytest.mark.parametrize("name", sorted(PACKERS))
def test_every_packer_keeps_batches_within_the_largest_bucket_and_the_graphs_kv(name):
    prob = problem(many(60, 1), k=3, cost=graphs())
    batchings = PACKERS[name](prob)
    results = check_valid(prob, batchings)  # the evaluator's rules: batch-buckets and the KV of B rows
    for b, bt in zip(prob.buckets, batchings, strict=True):
        n_b = np.bincount(bt.batch_of)
        assert n_b.max() <= BUCKETS[-1]
        g_max = np.zeros(len(n_b), np.int64)
        np.maximum.at(g_max, bt.batch_of, b.gen_len)
        rows = prob.cost.graph_batch(n_b)
        assert (rows * (bt.shape_of + g_max) <= TOY.kv_capacity_tokens).all()
    assert all(r.metrics.graphs for r in results)


def test_dpfill_fills_each_shape_in_batches_of_the_bucket_sizes():
    prof = replace(TOY, kv_capacity_tokens=None)
    b = bucket([100] * 11 + [700] * 3, list(range(1, 12)) + [5, 9, 2])
    prob = problem(b, k=2, cost=graphs(prof, (2, 4)))
    bt = PACKERS["dpfill"](prob)[0]
    for shape, sizes in ((128, [4, 4, 3]), (704, [3])):  # gen order, the largest bucket first, the tail padded
        batches = np.flatnonzero(bt.shape_of == shape)
        assert sorted(np.bincount(bt.batch_of)[batches].tolist(), reverse=True) == sizes
    m = check_valid(prob, (bt,))[0].metrics
    assert m.graphs == ((4, 128), (4, 704))  # the tails of 3 run in bucket 4: no graph of their own


def compositions(n: int):
    for mask in range(1 << (n - 1)):
        cuts = [0] + [i + 1 for i in range(n - 1) if mask >> i & 1] + [n]
        yield list(zip(cuts, cuts[1:], strict=False))


def test_optimal_runs_prices_a_run_by_its_graph_and_is_the_exact_cut():
    cm = graphs(replace(TOY, kv_capacity_tokens=None), (2, 3, 5))
    gens = np.sort(np.random.default_rng(4).integers(1, 80, 9))
    t, batch = optimal_runs(gens, 256, cm, None)
    sizes = np.bincount(batch)
    assert sizes.max() <= 5
    assert t == pytest.approx(sum(float(batch_time(cm.graph_batch(n), 256, gens[batch == k].max(), TOY))
                                  for k, n in enumerate(sizes)), rel=1e-12)
    best = min(sum(float(cm.batch_total(z - a, 256, gens[z - 1])) if z - a <= 5 else np.inf for a, z in runs)
               for runs in compositions(len(gens)))
    assert t == pytest.approx(best, rel=1e-12)


def test_priced_runs_drops_a_bucket_whose_compile_costs_more_than_it_saves():
    prof = replace(TOY, kv_capacity_tokens=None, compile_ms=5000.0)
    cm = graphs(prof, (1, 4))
    gens = np.array([10, 10, 10, 10, 10])  # 4 + 1 runs two graphs; 5 does not fit; 4 + 1 vs 1 x 5 alone
    total, batch = priced_runs(gens, 128, cm, None)
    sizes = np.bincount(batch)
    assert len(set(cm.graph_batch(sizes).tolist())) == 1  # one graph only: its compile dominates
    exact = sum(float(cm.batch_total(n, 128, 10)) for n in sizes) + 5000.0
    assert total == pytest.approx(exact, rel=1e-12)


def test_interval_runs_cost_is_what_the_evaluator_charges_in_graph_mode():
    a, b = many(40, 2), many(30, 3)
    b = replace(b, name="c", request_ids=np.array([f"c-{i}" for i in range(len(b))], dtype=object))
    prob = problem(a, b, k=3, cost=graphs(), limits=Limits(max_p95_latency_ms=900.0))
    runs = IntervalRuns(prob)
    for shapes in ([896], [256, 896], [128, 512, 896]):
        sh = np.asarray(shapes, dtype=np.int64)
        results = check_valid(prob, runs.batching(sh))
        assert runs.total(sh) == pytest.approx(sum(r.metrics.cost for r in results), rel=1e-12)
