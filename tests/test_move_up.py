"""Moving a group's longest-gen members up a shape (``model.planning.move_up``): the ladder, the pairs searched,
the move itself, a judged gain on the default scenario, and on 3-6 requests never below the brute-force optimum
over every batching on the plan's shapes nor above the fixed-shape re-batching."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest
from helpers import bucket, problem, set_partitions
from test_count_runs import TOY, default_bucket_alone

from model import pipeline
from model.base.runtime import Deadline
from model.cost.common import align
from model.domain.schema import Batching, Limits, Problem
from model.domain.windowing import windowed
from model.packers import PACKERS
from model.planning.groups import groups_of, moved_up
from model.planning.move_up import ladder, moved, moved_bucket, pairs
from model.planning.rebatch import rebatched


def test_the_ladder_doubles_to_the_size():
    assert ladder(1) == [1] and ladder(5) == [1, 2, 4, 5] and ladder(8) == [1, 2, 4, 8] and ladder(0) == []


def test_a_move_keeps_gen_order_and_the_pairs_stay_within_a_window_largest_shape_first():
    b = replace(bucket([10, 20, 30, 200, 210, 600], [5, 50, 40, 30, 1, 9]), arrival_s=np.array([0, 0, 0, 0, 0, 11.]))
    prob = windowed(problem(b, k=3, params=TOY, mode="device"), 10.0)
    bt = Batching(np.array([0, 0, 0, 1, 1, 2]), np.array([64, 256, 640]))
    groups = groups_of(prob, 0, bt)
    assert [(g.shape, g.window) for g in groups] == [(64, 0), (256, 0), (640, 1)]
    assert pairs(groups) == [(0, 1)]  # the 640 group is alone in its window
    stay, grown = moved_up(groups[0], groups[1], 2)
    assert stay.rows.tolist() == [0] and stay.gens.tolist() == [5]
    assert grown.rows.tolist() == [4, 3, 2, 1] and grown.gens.tolist() == [1, 30, 40, 50] and grown.shape == 256


@pytest.mark.slow  # 1.7 s; the brute-force cases below find moves on 5-6 requests in the default run
def test_moving_the_longest_gens_of_the_short_bucket_up_beats_its_fixed_shape_optimum():
    """The default scenario's short bucket on 320, 704: the counted re-batching keeps 142,463.9 device-ms; moving
    the longest-gen members into the 704 batches costs less (the LP on these shapes does it too), every limit
    met."""
    prob, bt = default_bucket_alone(1, [320, 704])
    judged = pipeline.judge(prob, "solo", (bt,))
    fixed = rebatched(prob, pipeline.judge, judged, Deadline.never())
    found = moved(prob, pipeline.judge, fixed, Deadline.never())
    assert found is not None and found.acceptable and found.cost < fixed.cost * 0.98
    shapes = found.batchings[0].shape_of[found.batchings[0].batch_of]
    S = align(prob.buckets[0].prompt_len)
    assert ((S <= 320) & (shapes == 704)).any() and (shapes >= S).all()


def best_on_shapes(prob: Problem, shapes: list[int]) -> float:
    """The least judged cost of any plan of the one bucket using only ``shapes`` (each batch at any of them that
    covers it): every set partition, every covering shape per block."""
    S = align(prob.buckets[0].prompt_len)
    best = np.inf
    for part in set_partitions(list(range(len(S)))):
        options = [[s for s in shapes if s >= S[blk].max()] for blk in part]
        for pick in itertools.product(*options):
            batch_of = np.empty(len(S), dtype=np.int64)
            for k, blk in enumerate(part):
                batch_of[blk] = k
            j = pipeline.judge(prob, "brute", (Batching(batch_of, np.array(pick, dtype=np.int64)),))
            if j.acceptable:
                best = min(best, j.cost)
    return best


@pytest.mark.parametrize("p95", [False, True], ids=["free", "P95"])
@pytest.mark.parametrize("seed,n", [(1, 5), (3, 6), pytest.param(2, 6, marks=pytest.mark.slow),
                                    pytest.param(4, 6, marks=pytest.mark.slow)])
def test_moves_are_never_below_the_brute_force_optimum_of_the_shapes_nor_above_the_fixed_shape_rebatching(
        seed, n, p95):
    """With a P95 limit at the solo plan's own P95 (which it meets), and without one; on these seeds moving
    members up pays for the solo plan."""
    rng = np.random.default_rng(50 + seed)
    b = bucket(rng.integers(1, 300, n).tolist(), rng.integers(1, 200, n).tolist())
    prob = problem(b, k=2, params=TOY, mode="device")
    if p95:
        solo = pipeline.judge(prob, "solo", PACKERS["solo"](prob)).evaluation.results[0].metrics.p95_latency_ms
        prob = replace(prob, limits=(Limits(max_p95_latency_ms=float(solo)),))
    for name in ("solo", "pow2"):
        judged = pipeline.judge(prob, name, PACKERS[name](prob))
        if not judged.acceptable:
            continue
        fixed = rebatched(prob, pipeline.judge, judged, Deadline.never()) or judged
        found = moved(prob, pipeline.judge, fixed, Deadline.never())
        assert found is not None or name != "solo"
        if found is None:
            continue
        assert found.acceptable and found.cost < fixed.cost
        shapes = sorted(set(fixed.batchings[0].shape_of.tolist()))
        assert found.cost >= best_on_shapes(prob, shapes) * (1 - 1e-9)


def test_with_no_time_left_nothing_is_searched():
    rng = np.random.default_rng(51)
    b = bucket(rng.integers(1, 300, 5).tolist(), rng.integers(1, 200, 5).tolist())
    prob = problem(b, k=2, params=TOY, mode="device")
    judged = pipeline.judge(prob, "solo", PACKERS["solo"](prob))
    assert moved(prob, pipeline.judge, judged, Deadline.never()) is not None
    assert moved_bucket(prob, 0, judged, pipeline.judge, Deadline.after(0.0)) is None


def test_a_first_fold_that_cannot_fit_the_time_left_is_not_started(monkeypatch):
    """The first fold's counted DP cannot stop part-way, so when even its coarsest count needs more than the
    time left (``count_runs.dp_seconds``), no DP runs at all (on 12k long-context requests at a 3 s limit it
    ran 0.6 s past the limit)."""
    import model.planning.move_up as move_up
    rng = np.random.default_rng(51)
    b = bucket(rng.integers(1, 300, 5).tolist(), rng.integers(1, 200, 5).tolist())
    prob = problem(b, k=2, params=TOY, mode="device")
    judged = pipeline.judge(prob, "solo", PACKERS["solo"](prob))
    assert len(groups_of(prob, 0, judged.batchings[0])) >= 2  # a pair to move between: the check is reached

    def no_dp(*args, **kwargs):
        raise AssertionError("a counted DP was started")

    monkeypatch.setattr(move_up, "counted_runs", no_dp)
    monkeypatch.setattr(move_up, "dp_seconds", lambda works, most: 3600.0)
    assert moved_bucket(prob, 0, judged, pipeline.judge, Deadline.after(60.0)) is None
