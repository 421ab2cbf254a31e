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


# ---------------------------------------------------------------- graphs: compiled batch sizes [1, 4]

BUCKETS = (1, 4)


def graph_model():
    """Device mode on a stack that compiles batch sizes 1 and 4 (``GraphCost``)."""
    from dataclasses import replace

    from model.cost.model import cost_model
    return cost_model("device", replace(load_profile(PROFILE), batch_buckets=BUCKETS))


def test_graph_mode_batch_times_are_the_graphs_to_the_last_digit():
    cm = graph_model()
    assert cm.compiles_graphs and cm.batch_buckets == BUCKETS
    assert cm.graph_batch([2, 1, 2]).tolist() == [4, 1, 4]
    T = cm.batch_total([2, 1, 2], [128, 128, 768], [53, 16, 300]).tolist()
    assert T == [1155.9193004218532, 352.1945567152713, 7064.855844205051]


def test_graph_mode_worked_example_to_the_last_digit():
    cm = graph_model()
    m = cm.plan_metrics(PROMPT, GEN, BATCH, SHAPE)
    assert m.graphs == ((1, 128), (4, 128), (4, 768)) and m.shapes == (128, 768) and m.n_batches == 3
    assert m.compile_cost == 60000.0  # 3 graphs, 20 s each
    assert m.cost == 68572.96970134217
    assert (m.pad_tokens, m.real_tokens) == (3687, 1453)
    assert m.pad_ratio == 2.537508602890571
    assert m.p95_latency_ms == 27064.85584420505
    assert m.sequential_ms == m.cost == 68572.96970134217
    lat = cm.member_latencies(PROMPT, GEN, BATCH, SHAPE).tolist()
    # a (spike of graph (4, 128)), b, e (spike of (1, 128): its own graph), c (spike of (4, 768)), d
    assert lat == [21155.919300421854, 1155.9193004218532, 20352.194556715272, 27064.85584420505,
                   7064.855844205051]
    assert cm.warmup_ms(len(m.graphs)) == 60000.0


def test_without_batch_buckets_graph_mode_is_device_mode():
    cm = graph_model()
    plain = load_profile(PROFILE)
    one_each = cm.plan_metrics(PROMPT, GEN, ["x", "y", "z", "u", "v"], SHAPE)
    from dataclasses import replace

    from model.cost.model import cost_model
    assert one_each == cost_model("device", replace(plain, batch_buckets=(1, 2, 3))).plan_metrics(
        PROMPT, GEN, ["x", "y", "z", "u", "v"], SHAPE)
    m = plan_metrics(PROMPT, GEN, BATCH, SHAPE, plain, "device")
    assert m.graphs == ((1, 128), (2, 128), (2, 768))  # the batch is free: one graph per (size, shape)
    assert m.compile_cost == 40000.0  # charged per shape
