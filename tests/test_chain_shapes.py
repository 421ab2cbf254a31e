"""The shape search by the rider chain (``model.planning.chain_shapes``): its neighbourhood on a probe, the sets
it returns (cover every prompt, at most K across buckets), its gates (only where the chain's batch model is the
plan's), and on the embedded default the set it finds and the cheaper plan the planner then returns."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from helpers import bucket, problem
from test_shape_lp import TOY

from model import pipeline
from model.base.runtime import Deadline
from model.cost.common import align
from model.packers import PACKERS
from model.planning.chain_shapes import chain_candidates, neighbours, on_sets, searched_sets


def test_the_neighbours_are_one_step_away_nearest_first_and_each_covers_the_longest_prompt():
    cands = np.array([64, 128, 192, 256, 320, 384])
    got = neighbours((128, 320), cands, top=300, room=1)
    assert len(got) == len(set(got)) and (128, 320) not in got
    assert all(max(s) >= 300 for s in got)  # 320 never moves below the longest prompt's 300
    assert got[:3] == [(64, 320), (192, 320), (128, 384)]  # one candidate either way first (256 would not cover)
    assert (128,) not in got and (320,) in got  # removals that still cover
    assert (64, 128, 320) in got and (128, 192, 320) in got  # an addition in each gap (the middle)
    assert not any(len(s) > 2 for s in neighbours((128, 320), cands, top=300, room=0))


def default_problem():
    prob, _ = pipeline.load_problem(pipeline.InputSpec(scenario=pipeline.DEFAULT_SCENARIO, max_shapes=8))
    return prob


def test_on_the_embedded_default_the_chat_set_moves_and_the_plan_on_it_is_cheaper():
    """From the plan the MIP, its re-batching and the moves reach (chat on 320, 1024, 2048; short on 320, 704),
    the chain ranks (192, 1088, 2048) cheaper for chat; planned on it the plan costs less, meets every limit, and
    every request sits on its bucket's set."""
    prob = default_problem()
    x = prob.buckets[0]
    start = PACKERS["solo"](prob)
    sets = ((320, 1024, 2048), (320, 704))
    judged = pipeline.judge(prob, "start", on_sets(prob, sets))
    from model.planning.rebatch import rebatch_plan
    base, _ = rebatch_plan(prob, pipeline.judge, judged, Deadline.never())
    found = searched_sets(prob, base, Deadline.never())
    assert found is not None and found[1] == (320, 704) and found[0] != (320, 1024, 2048)
    assert len({s for u in found for s in u}) <= prob.max_shapes and max(found[0]) >= align(x.prompt_len).max()
    out = chain_candidates(prob, pipeline.judge, [base], Deadline.never())
    assert len(out) == 1 and out[0].acceptable and out[0].cost < base.cost
    for bt, shapes in zip(out[0].batchings, found, strict=True):
        assert set(np.unique(bt.shape_of).tolist()) <= set(shapes)
    assert start is not None


def test_no_time_no_search():
    prob = default_problem()
    judged = pipeline.judge(prob, "start", on_sets(prob, ((320, 1024, 2048), (320, 704))))
    assert searched_sets(prob, judged, Deadline(0.0)) is None
    assert chain_candidates(prob, pipeline.judge, [judged], Deadline(0.0)) == []


@pytest.mark.parametrize("change", ["windows", "graphs", "strict"])
def test_it_stays_out_where_the_chains_batch_model_is_not_the_plans(change):
    """Windows (a batch never spans two), compiled batch sizes (a batch runs in its graph's time) and the analytic
    modes: no candidate."""
    from model.domain.schema import Windowing

    x = bucket([60, 100, 130, 64, 250, 190], [10, 30, 20, 40, 10, 200], "x")
    base = problem(x, k=3, params=TOY, mode="device")
    prob = {"windows": replace(base, windowing=Windowing(1.0, 0.0)),
            "graphs": problem(x, k=3, params=replace(TOY, batch_buckets=(1, 2, 4)), mode="device"),
            "strict": problem(x, k=3, mode="strict")}[change]
    judged = pipeline.judge(base, "dpfill", PACKERS["dpfill"](base))  # an acceptable plan to start from
    assert judged.acceptable
    assert chain_candidates(prob, pipeline.judge, [judged], Deadline.never()) == []


def test_with_allowed_shapes_it_searches_among_them_only():
    """The embedded default with the shapes the free search found allowed (and a few more): the set found is a
    subset of the allowed ones for every bucket."""
    prob = replace(default_problem(), allowed_shapes=(192, 256, 320, 704, 1024, 1088, 2048))
    judged = pipeline.judge(prob, "start", on_sets(prob, ((320, 1024, 2048), (320, 704))))
    found = searched_sets(prob, judged, Deadline.never())
    assert found is not None
    assert all(set(u) <= set(prob.allowed_shapes) for u in found)
