"""The cost model as one object: the planner's pricing and the evaluator's judging are the same arithmetic.

Each mode's ``batch_total`` (what the planner's bounds and the final shape pass charge a batch) equals what
the evaluator charges a one-batch plan, compile aside; a box's fixed part plus n per-member parts is that
total; the factory and the flag resolution refuse what they refused before, with the same words.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import REPO

from model.base.errors import InputError
from model.cost.analytic import CostParams
from model.cost.device import DeviceProfile
from model.cost.model import (
    DeviceCost,
    ReferenceCost,
    StrictCost,
    cost_from_flags,
    cost_model,
    flag_coefficients,
    needs_profile,
)
from model.load.profile import load_profile

PROFILE = load_profile(REPO / "data" / "profiles" / "opt13b-a100-tp1.toml")
TWO_REGIMES = DeviceProfile(name="two", prefill=(3.0, 0.01, 1e-6), decode=(2.0, 1e-4, 0.3),
                            decode_large=(1.0, 5e-5, 0.1), decode_large_from=8, compile_ms=700.0,
                            kv_capacity_tokens=100_000)
MODELS = [ReferenceCost(), StrictCost(), DeviceCost(PROFILE), DeviceCost(TWO_REGIMES)]


@pytest.mark.parametrize("cost", MODELS, ids=lambda c: f"{c.name}-{getattr(c.params, 'name', '')}")
@pytest.mark.parametrize(("n", "s", "g"), [(1, 64, 1), (3, 128, 40), (9, 512, 300), (20, 2048, 7)])
def test_the_batch_total_is_what_the_evaluator_charges_one_batch(cost, n, s, g):
    """n members all prompted at s (so reference and strict agree on the length), the longest gen g."""
    prompts = np.full(n, s)
    gens = np.r_[np.full(n - 1, 1), g]
    metrics = cost.plan_metrics(prompts, gens, np.array(["b"] * n, dtype=object), np.full(n, s))
    charged = float(cost.batch_total(np.int64(n), np.int64(s), np.int64(g)))
    assert metrics.cost - metrics.compile_cost == pytest.approx(charged, rel=1e-12)
    assert metrics.compile_cost == pytest.approx(float(cost.shape_charge(s)), rel=1e-12)


@pytest.mark.parametrize("cost", [StrictCost(), DeviceCost(PROFILE), DeviceCost(TWO_REGIMES)], ids=lambda c: c.name)
def test_a_box_prices_a_batch_as_its_fixed_part_plus_one_part_per_member(cost):
    t, g = np.array([128, 1024]), np.array([5, 200])
    for n in (1, 3, 7, 8, 30):
        large = cost.is_large(np.full(2, n))
        fixed, _ = cost.box_fixed(t, g, large)
        assert np.allclose(fixed + n * cost.box_unit_cost(t, g, large), cost.batch_total(n, t, g), rtol=1e-12)


def test_reference_mode_prices_a_box_by_decode_and_fixes_the_prefill():
    cost = ReferenceCost()
    S, count = np.array([64, 128]), np.array([3, 2])
    fixed = cost.constant_cost(S, count)
    assert fixed == pytest.approx(float((count * cost.member_cost(S, np.zeros(2, np.int64))).sum()
                                        - (count * cost.box_unit_cost(S, np.zeros(2, np.int64), False)).sum()))
    assert cost.prompt_pad(S, 512).tolist() == [0, 0] and StrictCost().prompt_pad(S, 512).tolist() == [448, 384]


@pytest.mark.parametrize("cost", MODELS, ids=lambda c: c.name)
def test_without_compile_charges_nothing_for_a_shape_and_nothing_else_changes(cost):
    """Compiles free and instant in every mode: a window's sub-problem takes neither their cost nor their spike
    (the windowed planner charges the shared compiles once, for the whole plan)."""
    free = cost.without_compile()
    assert float(free.shape_charge(1024)) == 0.0 and free.spike_ms == 0.0
    assert free.batch_total(4, 256, 30) == pytest.approx(cost.batch_total(4, 256, 30), rel=0)


def test_the_factory_refuses_mismatched_coefficients():
    assert cost_model("strict") == StrictCost(CostParams())
    with pytest.raises(ValueError, match="needs a DeviceProfile"):
        cost_model("device", CostParams())
    with pytest.raises(ValueError, match="needs CostParams"):
        cost_model("reference", PROFILE)
    with pytest.raises(ValueError, match="unknown cost mode"):
        cost_model("gpu")
    assert needs_profile("device") and not needs_profile("strict")


@pytest.mark.parametrize(("mode", "params", "device", "base", "message"), [
    ("strict", None, PROFILE, None, "a device profile prices plans in device mode, not --cost-model strict"),
    (None, CostParams(), PROFILE, None, "cost params do not apply in device mode"),
    ("device", CostParams(), None, None, "cost params do not apply in device mode"),
    ("device", None, None, None, "--cost-model device needs --device-profile FILE.toml"),
    ("device", None, None, StrictCost(), "--cost-model device needs --device-profile FILE.toml"),
    ("strict", None, None, DeviceCost(PROFILE), "the scenario prices plans in device mode; --cost-model strict "
                                                 "needs --cost-params or no scenario device profile"),
    (None, CostParams(), None, DeviceCost(PROFILE), "cost params do not apply in device mode"),
])
def test_contradicting_flags_are_bad_input_with_one_line(mode, params, device, base, message):
    with pytest.raises(InputError, match=message.replace("-", r"\-").replace(".", r"\.")):
        cost_from_flags(*flag_coefficients(mode, params, device), base)


def test_flags_over_a_scenario_keep_what_they_do_not_set():
    tuned = CostParams(Kp_attn=3.0)
    assert cost_from_flags("strict", None, ReferenceCost(tuned)) == StrictCost(tuned)
    assert cost_from_flags(None, None, DeviceCost(PROFILE)) == DeviceCost(PROFILE)
    assert cost_from_flags(None, tuned, StrictCost()) == StrictCost(tuned)
    assert cost_from_flags(None, None) == ReferenceCost()
