"""A window's LP bound under fixed shapes (``model.planning.window_lp``) and the split of a windowed gap
(``model.planning.window_gap``): brute-force oracles on 3-7 requests, with and without windows."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import numpy as np
import pytest
from helpers import bucket, problem, set_partitions

from model import pipeline
from model.base.runtime import Deadline
from model.cost.common import align
from model.cost.device import DeviceProfile
from model.cost.model import DeviceCost, GraphCost
from model.domain.schema import Bucket, Limits
from model.domain.windowing import windowed, windows_of
from model.planning.window_bound import window_bound
from model.planning.window_gap import gap_split
from model.planning.window_lp import price, window_lp
from model.planning.window_runs import window_pools

TOY = DeviceProfile(name="toy", prefill=(2.0, 0.01, 1e-5), decode=(5.0, 1e-4, 0.02),
                    decode_large=(3.0, 1e-4, 0.05), decode_large_from=3, compile_ms=40.0, kv_capacity_tokens=2500)


def fixed_optimum(cost, S: np.ndarray, G: np.ndarray, shapes: np.ndarray, max_batch: int | None = None) -> float:
    """The least cost of any batching of these requests under ``shapes``: every set partition, each block at
    the smallest shape covering it (a larger one never costs less), inf where a block fits no batch."""
    best = math.inf
    for part in set_partitions(list(range(len(S)))):
        total = 0.0
        for blk in part:
            fit = shapes[shapes >= S[blk].max()]
            n, g = len(blk), int(G[blk].max())
            if not len(fit) or not cost.batch_fits(n, int(fit[0]), g) or (max_batch and n > max_batch):
                total = math.inf
                break
            total += float(cost.batch_total(n, int(fit[0]), g))
        best = min(best, total)
    return best


COSTS = [DeviceCost(TOY), GraphCost(replace(TOY, batch_buckets=(1, 2, 4)))]


@pytest.mark.parametrize("cost", COSTS, ids=["free batch", "graphs"])
@pytest.mark.parametrize("seed,n", [(0, 3), (1, 4), (2, 5), (3, 6),
                                    pytest.param(4, 7, marks=pytest.mark.slow),
                                    pytest.param(5, 7, marks=pytest.mark.slow)])
def test_the_window_lp_never_exceeds_the_brute_force_optimum(seed, n, cost):
    rng = np.random.default_rng(seed)
    S = align(rng.integers(1, 400, n))
    G = rng.integers(1, 200, n)
    for shapes in (np.unique(S), np.unique(np.r_[S.max(), rng.choice(S, 1)])):
        best = fixed_optimum(cost, S, G, shapes)
        res = window_lp(cost, S, G, shapes, None)
        assert res.bound <= best * (1 + 1e-9)
        assert res.converged and res.bound >= 0.8 * best  # the set-partitioning LP is tight on these


def test_pricing_finds_the_most_negative_batch_there_is():
    """Against every subset at every shape: the least reduced cost and the largest dual-to-cost ratio."""
    rng = np.random.default_rng(7)
    n = 6
    S, G = align(rng.integers(1, 300, n)), rng.integers(1, 150, n)
    shapes, pi = np.unique(S), rng.uniform(0, 200, n)
    cost = DeviceCost(TOY)
    least, ratio, _ = price(cost, S, G, shapes, pi, None)
    want_least, want_ratio = 0.0, 0.0
    for k in range(1, n + 1):
        for blk in itertools.combinations(range(n), k):
            blk = list(blk)
            for s in shapes[shapes >= S[blk].max()].tolist():
                if cost.batch_fits(k, s, int(G[blk].max())):
                    t = float(cost.batch_total(k, s, int(G[blk].max())))
                    want_least = min(want_least, t - pi[blk].sum())
                    want_ratio = max(want_ratio, pi[blk].sum() / t)
    assert least == pytest.approx(want_least, rel=1e-9, abs=1e-9)
    assert ratio == pytest.approx(want_ratio, rel=1e-9)


def timed(b: Bucket, arrivals) -> Bucket:
    return replace(b, arrival_s=np.asarray(arrivals, dtype=np.float64))


@pytest.mark.parametrize("window", [False, True], ids=["no windows", "windows of 10 s"])
@pytest.mark.parametrize("seed", range(4))
def test_the_split_brackets_every_window_by_its_brute_force_optimum(seed, window):
    """relax <= LP <= the window's optimum under the plan's shapes <= the plan, window by window, and the
    shares add up to the gap (dpfill's plan against the windowed bound)."""
    rng = np.random.default_rng(seed)
    n = 6
    b = timed(bucket(rng.integers(1, 400, n).tolist(), rng.integers(1, 200, n).tolist()),
              np.sort(rng.uniform(0, 20, n)))
    prob = problem(b, k=2, params=TOY, mode="device", limits=Limits())
    prob = windowed(prob, 10.0 if window else 100.0)
    run = pipeline.run(prob, "dpfill")
    comp = sum(r.metrics.compile_cost for r in run.evaluation.results)
    bound = window_bound(prob, window_pools(prob), Deadline.never()).bound
    split = gap_split(prob, run.planned.batchings, run.evaluation.total_cost, bound, comp, Deadline.never())
    assert split.shape_part >= -1e-9  # the bound is the least of the prices over shape sets, the plan's one of them
    bt = run.planned.batchings[0]
    shapes = np.unique(bt.shape_of)
    wins = windows_of(prob, b)
    for w in split.windows:
        rows = np.flatnonzero(wins == w.window)
        best = fixed_optimum(prob.cost, align(b.prompt_len[rows]), b.gen_len[rows], shapes)
        assert w.lp is not None and w.relax <= w.lp * (1 + 1e-9)
        assert w.lp <= best * (1 + 1e-9) and best <= w.plan * (1 + 1e-9)
    parts = split.window_parts()
    if parts is not None:
        assert split.shape_part + sum(parts) == pytest.approx(split.gap, abs=1e-9)


@pytest.mark.slow  # a MIP per window
def test_each_windows_own_mip_is_a_plan_no_cheaper_than_the_optimum():
    rng = np.random.default_rng(3)
    n = 6
    b = timed(bucket(rng.integers(1, 400, n).tolist(), rng.integers(1, 200, n).tolist()),
              np.sort(rng.uniform(0, 20, n)))
    prob = windowed(problem(b, k=2, params=TOY, mode="device"), 10.0)
    run = pipeline.run(prob, "pow2")
    comp = sum(r.metrics.compile_cost for r in run.evaluation.results)
    split = gap_split(prob, run.planned.batchings, run.evaluation.total_cost, 0.0, comp, Deadline.never(),
                      window_s=2.0, judge=pipeline.judge)
    shapes = np.unique(run.planned.batchings[0].shape_of)
    wins = windows_of(prob, b)
    for w in split.windows:
        rows = np.flatnonzero(wins == w.window)
        best = fixed_optimum(prob.cost, align(b.prompt_len[rows]), b.gen_len[rows], shapes)
        assert w.found is not None and best * (1 - 1e-9) <= w.found
    surely, parts = split.plan_at_least(), split.window_parts()
    assert surely is not None and 0 <= surely <= parts[0] * (1 + 1e-9)
