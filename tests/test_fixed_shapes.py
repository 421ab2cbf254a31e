"""Planning under a fixed set of allowed shapes (``Problem.allowed_shapes``): the MIP against brute force,
its bound against the restricted optimum, every packer inside the set, the evaluator's rule, the errors."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import REPO, brute_force, bucket, check_valid, plan_mip, planned, problem
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from model import pipeline
from model.base.errors import InfeasibleError, InputError
from model.cost.common import align
from model.domain.schema import Batching, Limits
from model.domain.shapeset import check_fits, checked, parse_shapes, round_up_to, usable
from model.evaluation.validate import evaluate_plans
from model.histogram.cells import build_histogram
from model.load.profile import load_profile
from model.packers import PACKERS
from model.planning.stages import shape_setup

pytestmark = pytest.mark.filterwarnings("ignore:.*PuLP 4.0:DeprecationWarning")

SIX = bucket([60, 100, 130, 64, 250, 190], [10, 30, 20, 40, 10, 20])  # aligned prompts 64, 128, 192, 64, 256, 192
X = bucket([60, 100, 130], [10, 30, 20], "x")  # largest aligned prompt 192
Y = bucket([64, 250, 190], [40, 10, 20], "y")  # 256
Z = bucket([300, 70], [5, 50], "z")  # 320


def shapes_of(prob, batchings) -> set[int]:
    return {int(s) for r in check_valid(prob, batchings) for s in r.metrics.shapes}


def mip(prob):
    planned_ = plan_mip(prob, time_limit=20)
    results = check_valid(prob, planned_.batchings)
    assert all(r.ok for r in results), [r.checks for r in results]
    return sum(r.metrics.cost for r in results), planned_.report.bound, shapes_of(prob, planned_.batchings)


# -- the allowed set changes the optimum, and the MIP finds the restricted one ------------------

@pytest.mark.slow  # 2-7 s each on 2 cores: the default run's 90 s budget; cheaper siblings cover it by default
def test_allowed_set_changes_the_strict_optimum():
    """Free: shapes 128 and 256 (cost 142,454,142).  Only 192 and 320 allowed: every batch pays for the
    longer shape, and the brute force over every plan declaring only those agrees with the MIP."""
    free = problem(SIX, k=2, mode="strict")
    fixed = problem(SIX, k=2, mode="strict", allowed_shapes=(192, 320))
    assert brute_force(free).cost == 142_454_142.0
    best = brute_force(fixed)
    assert best.cost == 182_069_374.0
    cost, bound, shapes = mip(fixed)
    assert cost == pytest.approx(best.cost, rel=1e-9)
    assert shapes <= {192, 320}
    assert bound <= cost * (1 + 1e-12)


def test_reference_one_shape_per_bucket_is_chosen_among_the_allowed():
    """Needs 192, 256, 320 become 256, 256, 448 under {256, 448, 512}: with K = 2 x and y share 256 and z
    takes 448 -- not the free choice (192 | 256 | 320), and not the largest allowed shape."""
    prob = problem(X, Y, Z, k=2, mode="reference", allowed_shapes=(256, 448, 512))
    fine = [build_histogram(b) for b in prob.buckets]
    assert shape_setup(prob, fine).ref_shape == [256, 256, 448]
    k1 = problem(X, Y, Z, k=1, mode="reference", allowed_shapes=(256, 448, 512))
    assert shape_setup(k1, fine).ref_shape == [448, 448, 448]
    cost, bound, shapes = mip(prob)
    assert shapes == {256, 448}
    assert cost == pytest.approx(brute_force(prob).cost, rel=1e-9)
    assert bound <= cost * (1 + 1e-12)


def test_strict_candidates_are_the_allowed_shapes_covering_each_prompt():
    prob = problem(SIX, k=3, mode="strict", allowed_shapes=(128, 320, 384, 1024))
    setup = shape_setup(prob, [build_histogram(SIX)])
    assert setup.shapes.tolist() == [128, 320]  # 64 -> 128, 192 and 256 -> 320; 384 and 1024 never pay
    assert setup.covers_all


CASES = {
    "six strict K=1 {256, 512}": problem(SIX, k=1, mode="strict", allowed_shapes=(256, 512)),
    "six strict K=2 {128, 256, 320}": problem(SIX, k=2, mode="strict", allowed_shapes=(128, 256, 320)),
    "five strict K=3 {64, 192, 320, 448}": problem(bucket([60, 100, 130, 250, 190], [10, 30, 20, 10, 20]), k=3,
                                                   mode="strict", allowed_shapes=(64, 192, 320, 448)),
    "six reference K=2 {320}": problem(SIX, k=2, allowed_shapes=(320,)),
    "two buckets strict K=2 {192, 384}": problem(X, Y, k=2, mode="strict", allowed_shapes=(192, 384)),
    "two buckets reference K=1 {256, 512}": problem(X, Y, k=1, allowed_shapes=(256, 512)),
    "six strict K=2 pad limit {128, 256, 320}": problem(SIX, k=2, mode="strict", allowed_shapes=(128, 256, 320),
                                                        limits=Limits(max_pad_ratio=1.2)),
    "six strict K=2 B=2 {192, 320}": problem(SIX, k=2, mode="strict", allowed_shapes=(192, 320), max_batch_size=2),
}


@pytest.mark.parametrize("name", list(CASES))
def test_mip_reaches_the_restricted_optimum_and_bounds_it(name):
    """The brute force enumerates every plan declaring allowed shapes only (every allowed shape, not just
    the planner's candidates); the MIP's exact cost equals it and its bound never exceeds it."""
    prob = CASES[name]
    best = brute_force(prob).cost
    cost, bound, shapes = mip(prob)
    assert cost == pytest.approx(best, rel=1e-9)
    assert bound is not None and bound <= best * (1 + 1e-12)
    assert shapes <= set(prob.allowed_shapes)


# -- every planner stays inside the set ------------------------------------------------------------

lengths = st.tuples(st.integers(1, 900), st.integers(1, 120))


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(lengths, min_size=1, max_size=12), min_size=1, max_size=2), st.integers(1, 4),
       st.sampled_from(["reference", "strict"]), st.sets(st.integers(1, 20), min_size=1, max_size=6),
       st.sampled_from([None, 2]))
def test_every_packer_stays_inside_the_set(reqs, k, mode, extra, max_batch):
    buckets = [bucket([p for p, _ in r], [g for _, g in r], f"b{i}") for i, r in enumerate(reqs)]
    top = int(max(align(b.prompt_len).max() for b in buckets))
    allowed = checked({64 * e for e in extra} | {top + 64 * (min(extra) % 3)})  # the largest covers every prompt
    prob = problem(*buckets, k=k, mode=mode, allowed_shapes=allowed, max_batch_size=max_batch)
    for name, pack in PACKERS.items():
        used = shapes_of(prob, pack(prob))
        assert used <= set(allowed), (name, used, allowed)
        assert len(used) <= k


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(lengths, min_size=1, max_size=10), st.integers(1, 3), st.sampled_from(["reference", "strict"]),
       st.sets(st.integers(1, 16), min_size=1, max_size=5))
def test_mip_stays_inside_the_set_and_its_bound_below_its_cost(reqs, k, mode, extra):
    b = bucket([p for p, _ in reqs], [g for _, g in reqs])
    allowed = checked({64 * e for e in extra} | {int(align(b.prompt_len).max())})
    prob = problem(b, k=k, mode=mode, allowed_shapes=allowed)
    planned_ = plan_mip(prob, time_limit=10)
    assert shapes_of(prob, planned_.batchings) <= set(allowed)
    assert planned_.report.bound <= planned_.report.objective * (1 + 1e-9)
    free = plan_mip(problem(b, k=k, mode=mode), time_limit=10)
    assert free.report.bound <= planned_.report.objective * (1 + 1e-9)  # restricting never beats the free bound


# -- the evaluator ---------------------------------------------------------------------------------

def test_a_shape_outside_the_set_breaks_a_rule():
    b = bucket([60, 100], [10, 10])
    plan = pipeline.expand(problem(b), planned((Batching(np.array([0, 1]), np.array([64, 128])),)))
    free, _ = evaluate_plans(problem(b), plan)
    assert free[0].ok
    results, _ = evaluate_plans(problem(b, allowed_shapes=(128, 256)), plan)
    assert [v.rule for v in results[0].violations] == ["allowed-shapes"]
    assert "seq_align 64 is not an allowed shape" in results[0].violations[0].message
    assert not results[0].ok


# -- parsing and the fit check ----------------------------------------------------------------------

@pytest.mark.parametrize("text", ["", "0", "65", "abc", "64,,128", "-64", "128,", " ", "1e3", "64.0", "99999999999"])
def test_bad_shape_lists_are_input_errors(text):
    with pytest.raises(InputError) as err:
        parse_shapes(text)
    assert str(err.value).startswith("--shapes:")


def test_shape_lists_parse_sorted_and_distinct():
    assert parse_shapes(" 512, 128,256 ,128") == (128, 256, 512)
    assert round_up_to([1, 128, 129, 300], np.array([128, 256, 320])).tolist() == [128, 128, 256, 320]


def test_a_set_too_small_names_the_first_request_that_does_not_fit():
    b = bucket([60, 300, 100, 700], [1, 1, 1, 1])
    with pytest.raises(InputError) as err:
        check_fits(problem(b, allowed_shapes=(128, 256)))
    assert str(err.value).startswith("<b>:2: field 'prompt_len': 300 (aligned 320) does not fit the largest allowed "
                                     "shape 256: 2 request(s)")
    check_fits(problem(b, allowed_shapes=(128, 704)))


def test_shapes_above_max_seq_len_are_left_out():
    b = bucket([60, 300], [1, 1])
    prob = problem(b, allowed_shapes=(128, 320, 1024), max_seq_len=512)
    assert usable(prob).tolist() == [128, 320]
    with pytest.raises(InputError, match="left out"):
        check_fits(problem(bucket([600], [1]), allowed_shapes=(128, 1024), max_seq_len=640))


def test_planners_refuse_a_set_too_small_built_in_code():
    prob = problem(bucket([60, 300], [1, 1]), allowed_shapes=(128,))
    for name in PACKERS:
        with pytest.raises(InfeasibleError, match="largest allowed shape 128"):
            PACKERS[name](prob)
    with pytest.raises(InfeasibleError, match="longer than every allowed shape"):
        plan_mip(prob, time_limit=5)


# -- device mode (a measured profile): the flow planner and dpfill honour the set too ----------------

@pytest.fixture(scope="module")
def profile():
    return load_profile(REPO / "data" / "profiles" / "opt13b-a100-tp1.toml")


@pytest.mark.parametrize("allowed", [(192, 320), pytest.param((128, 256, 512), marks=pytest.mark.slow), (320,)])
def test_device_mode_reaches_the_restricted_optimum(profile, allowed):
    prob = problem(SIX, k=2, mode="device", params=profile, allowed_shapes=allowed)
    best = brute_force(prob).cost
    cost, bound, shapes = mip(prob)
    assert shapes <= set(allowed)
    assert cost == pytest.approx(best, rel=1e-9)
    assert bound <= best * (1 + 1e-12)


def test_device_mode_packers_stay_inside_the_set(profile):
    b = bucket(list(range(20, 1000, 37)), [(7 * i) % 90 + 1 for i in range(27)])
    prob = problem(b, k=3, mode="device", params=profile, allowed_shapes=(320, 640, 768, 1024))
    for name, pack in PACKERS.items():
        assert shapes_of(prob, pack(prob)) <= {320, 640, 768, 1024}, name
