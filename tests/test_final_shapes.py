"""The final shape pass: whatever batching plan_mip returns (its own or a packer's) declares the shapes that
cost least for those batches, as long as the exact evaluation still finds every limit met.

- reference mode: the declared shape only moves compile cost and spikes, so one shape per bucket (jointly
  under K, within the allowed set); the greedy plan that wins on the Azure conversation trace kept 8;
- strict and device mode: each batch at the smallest kept shape covering it, the kept ones chosen by an
  exact DP (a level is dropped when its compile charge exceeds what its batches pay one level up).
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import TRACES, bucket, check_valid, plan_mip, problem
from test_device_mode import TOY

from model import pipeline
from model.base.runtime import Deadline
from model.cost.analytic import compile_cost, decode_cost, prefill_cost
from model.domain.schema import Batching, Limits, Problem, Status
from model.evaluation.validate import evaluate_plans
from model.pipeline import judge
from model.planning import mip
from model.planning.mip import final_shapes
from model.planning.reshape import redeclared
from model.planning.stages import SearchOutcome, greedy_plan


def shapes_of(prob: Problem, batchings) -> list[tuple[int, ...]]:
    return [r.metrics.shapes for r in check_valid(prob, batchings)]


def cost_of(prob: Problem, batchings) -> float:
    return sum(r.metrics.cost for r in check_valid(prob, batchings))


@pytest.fixture(scope="module")
def conv() -> Problem:
    """The Azure conversation trace as ``--columns azure`` reads it, reference mode, K = 8, no limits."""
    prob, _ = pipeline.load_problem(pipeline.InputSpec(files=(TRACES / "AzureLLMInferenceTrace_conv.csv",),
                                                       columns="azure", max_shapes=8))
    return prob


def test_azure_conv_reference_returns_one_shape_when_that_is_cheaper(conv):
    """The greedy plan wins there; declared at its bucket's largest shape alone it costs 0.27 % less."""
    planned = plan_mip(conv, time_limit=20)
    (shapes,) = shapes_of(conv, planned.batchings)
    assert shapes == (14080,)
    greedy = judge(conv, "greedy", greedy_plan(conv))
    if len(greedy.evaluation.results[0].metrics.shapes) > 1:  # the dominated declaration is dearer
        assert planned.report.objective < greedy.cost
    assert planned.report.objective == pytest.approx(cost_of(conv, planned.batchings), rel=1e-12)


def test_reference_one_shape_per_bucket_jointly_under_k_and_within_the_allowed_set():
    """Two buckets, K = 1: both declare 704 (the larger need); with allowed shapes 256, 512, 1024 and K = 2:
    x declares 256 (its need 192 rounded up), y 1024."""
    x, y = bucket([60, 190], [10, 10], "x"), bucket([500, 700], [10, 10], "y")
    many = (Batching(np.array([0, 1]), np.array([64, 192])), Batching(np.array([0, 1]), np.array([512, 704])))
    (_, one), = redeclared(problem(x, y, k=1), many)
    assert [bt.shape_of.tolist() for bt in one] == [[704, 704], [704, 704]]
    fixed = problem(x, y, k=2, allowed_shapes=(256, 512, 1024))
    (_, one), = redeclared(fixed, (Batching(np.array([0, 1]), np.array([256, 256])),
                                   Batching(np.array([0, 1]), np.array([512, 1024]))))
    assert [bt.shape_of.tolist() for bt in one] == [[256, 256], [1024, 1024]]


# ---------------------------------------------------------------- strict mode, by hand

# strict, every request alone (B = 1): prompts 60 and 120 at their own shapes 64 and 128 pay compile(64) =
# 2,572,288; at 128 the short one pays 286,720 more prefill and 143,360 more decode (gen 1)
PAIR = bucket([60, 120], [1, 1])
APART = (Batching(np.array([0, 1]), np.array([64, 128])),)


def test_strict_merges_a_shape_level_whose_compile_exceeds_what_its_batches_save():
    prob = problem(PAIR, k=2, mode="strict", max_batch_size=1)
    extra = float(prefill_cost(128) - prefill_cost(64) + decode_cost(128, 1) - decode_cost(64, 1))
    assert extra < float(compile_cost(64))
    judged = judge(prob, "greedy", APART)
    new, note = final_shapes(prob, judge, judged, Deadline.never(), 0.0)
    assert [bt.shape_of.tolist() for bt in new.batchings] == [[128, 128]]
    assert new.cost == pytest.approx(judged.cost - float(compile_cost(64)) + extra, rel=1e-12)
    assert note and "2 -> 1 shapes" in note


def test_strict_lowers_a_batch_declared_above_what_it_needs():
    """Prompt 60 declared at 192 beside a batch that needs 128: 128 covers it and costs less (gens of 1000
    make a shape level worth far more than its compile charge, so both levels stay)."""
    prob = problem(bucket([60, 120, 180], [1000, 1000, 1000]), k=3, mode="strict", max_batch_size=1)
    judged = judge(prob, "greedy", (Batching(np.array([0, 1, 2]), np.array([192, 128, 192])),))
    new, _ = final_shapes(prob, judge, judged, Deadline.never(), 0.0)
    assert new.batchings[0].shape_of.tolist() == [128, 128, 192] and new.cost < judged.cost


def test_a_redeclaration_that_breaks_a_limit_is_not_taken():
    """With the pad limit at the apart plan's own (strict mode pads the short prompt to its declared shape),
    merging would break it: the plan stays as it was."""
    free = problem(PAIR, k=2, mode="strict", max_batch_size=1)
    pad = judge(free, "greedy", APART).evaluation.results[0].metrics.pad_ratio
    prob = problem(PAIR, k=2, mode="strict", max_batch_size=1, limits=Limits(max_pad_ratio=pad))
    judged = judge(prob, "greedy", APART)
    assert judged.acceptable
    new, note = final_shapes(prob, judge, judged, Deadline.never(), 0.0)
    assert new is judged and note is None


def test_plan_mip_applies_the_pass_to_the_packer_plan_it_returns(monkeypatch):
    """The search finds nothing (forced), so greedy's plan is returned -- with its shapes re-declared."""
    prob = problem(PAIR, k=2, mode="strict", max_batch_size=1)

    def nothing(problem, fine, setup, greedy, solver, deadline, reserves=None, options=None):
        return SearchOutcome(None, None, -np.inf, None, Status.TIME_LIMIT_NO_SOLUTION, "highs", "", ())

    monkeypatch.setattr(mip, "search", nothing)
    monkeypatch.setattr(mip, "greedy_plan", lambda *a, **k: APART)
    planned = plan_mip(prob, time_limit=20)
    assert [bt.shape_of.tolist() for bt in planned.batchings] == [[128, 128]]
    assert any("final shape pass on the greedy plan" in n for n in planned.report.notes)
    results, _ = evaluate_plans(prob, planned.plans)
    assert results[0].metrics.shapes == (128,)


def test_device_mode_lowers_and_merges_too():
    """Device mode (toy profile, compile 40 ms): a batch declared at 256 that needs 64 moves down."""
    prob = problem(bucket([60, 60], [10, 10]), k=2, params=TOY, mode="device", max_batch_size=1)
    judged = judge(prob, "dpfill", (Batching(np.array([0, 1]), np.array([64, 256])),))
    new, note = final_shapes(prob, judge, judged, Deadline.never(), 0.0)
    assert new.batchings[0].shape_of.tolist() == [64, 64] and new.cost < judged.cost and note


def test_device_mode_declares_a_shape_no_bucket_used_where_that_is_cheaper():
    """Bucket y's batches need 128 but sit at 256, a shape bucket x needs: the pass may add 128 (a new
    shape, within K) where y's batches save more than its compile; with K = 1 it may not."""
    x = bucket([250, 240], [10, 10], "x")
    y = bucket([100, 120], [400, 400], "y")
    at256 = (Batching(np.array([0, 0]), np.array([256])), Batching(np.array([0, 1]), np.array([256, 256])))
    prob = problem(x, y, k=2, params=TOY, mode="device")
    judged = judge(prob, "dpfill", at256)
    new, note = final_shapes(prob, judge, judged, Deadline.never(), 0.0)
    assert new.batchings[1].shape_of.tolist() == [128, 128] and new.cost < judged.cost
    assert note and "every batch's own prompt shape" in note and "2 -> 2 shapes" not in note
    assert "re-declared by the final shape pass" in new.method
    assert all("every batch's own prompt shape" not in what
               for what, _ in redeclared(problem(x, y, k=1, params=TOY, mode="device"), at256))
