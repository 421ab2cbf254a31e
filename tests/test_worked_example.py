"""The worked examples of shared/cost_model.md (reference and device mode), to the last printed digit."""

from pathlib import Path

import pytest

from model.cost.device import batch_time
from model.cost.metrics import member_latencies, plan_metrics
from model.load.profile import load_profile

PROMPT = [51, 100, 64, 130, 700]
GEN = [19, 53, 16, 20, 300]
BATCH = ["b-2", "b-2", "b-10", "b-3", "b-3"]
SHAPE = [128, 128, 128, 768, 768]


def test_cost_and_pad_ratio_exact():
    m = plan_metrics(PROMPT, GEN, BATCH, SHAPE)
    assert m.cost == 1_875_030_136.0
    assert (m.pad_tokens, m.real_tokens) == (421, 1453)
    assert m.pad_ratio == 0.28974535443909155


def test_latencies_p95_and_sequential_time():
    lat = member_latencies(PROMPT, GEN, BATCH, SHAPE)
    assert [round(x, 4) for x in lat] == [21991.5592, 22409.3512, 4819.4656, 896976.236, 899539.468]
    m = plan_metrics(PROMPT, GEN, BATCH, SHAPE)
    assert m.p95_latency_ms == 899539.468
    assert m.sequential_ms == pytest.approx(926768.2848, abs=1e-9)
    assert round(m.sequential_ms, 4) == 926768.2848


def test_breakdown_adds_up():
    m = plan_metrics(PROMPT, GEN, BATCH, SHAPE)
    assert m.prefill_cost + m.decode_cost + m.overhead_cost + m.compile_cost == m.cost
    assert m.overhead_cost == 3e7 and m.n_batches == 3 and m.shapes == (128, 768)


def test_strict_never_better_than_reference():
    ref = plan_metrics(PROMPT, GEN, BATCH, SHAPE, mode="reference")
    strict = plan_metrics(PROMPT, GEN, BATCH, SHAPE, mode="strict")
    assert strict.cost >= ref.cost and strict.pad_ratio >= ref.pad_ratio
    assert strict.sequential_ms >= ref.sequential_ms


# ---------------------------------------------------------------- device mode (shared/cost_model.md)

PROFILE = Path(__file__).resolve().parents[1] / "data" / "profiles" / "opt13b-a100-tp1.toml"


def test_device_mode_worked_example_to_the_last_digit():
    prof = load_profile(PROFILE)
    m = plan_metrics(PROMPT, GEN, BATCH, SHAPE, prof, "device")
    assert m.cost == pytest.approx(47999.159688797634, rel=1e-12)
    assert m.compile_cost == 40000.0 and m.n_batches == 3 and m.shapes == (128, 768)
    assert (m.pad_tokens, m.real_tokens) == (1189, 1453)
    assert m.pad_ratio == 0.8183069511355816
    assert m.p95_latency_ms == pytest.approx(26531.684589074277, rel=1e-12)
    assert m.sequential_ms == pytest.approx(47999.159688797634, rel=1e-12)
    lat = member_latencies(PROMPT, GEN, BATCH, SHAPE, prof, "device")
    expected = [1115.280543008088, 1115.280543008088, 20352.194556715272, 26531.684589074277, 6531.684589074276]
    assert lat == pytest.approx(expected, rel=1e-12)


def test_device_mode_batch_times():
    prof = load_profile(PROFILE)
    T = batch_time([2, 1, 2], [128, 128, 768], [53, 16, 300], prof)
    assert T == pytest.approx([1115.280543008088, 352.19455671527135, 6531.684589074276], rel=1e-12)
