"""The diagnosis of limits no plan meets: "at best" values that hold for the problem as given, and a single
unmeetable limit named as such (proven only by an exact search, else "not proven" and NoPlanFound).

- ``at_best`` never exceeds the true minimum of a metric over every plan of the problem -- its batch-size
  cap, allowed shapes, K and cost mode (device mode too) included -- checked by enumeration on small
  instances; with B = 1 (every request its own batch) sequential time is exact: the solo latencies plus
  the spikes;
- with ``--max-batch-size 1`` on the embedded reference scenario the message names the exact least
  sequential time (it said 1.2e7 where the least is ~3e8 on the hostile tester's input);
- a single limit no plan meets is said to be unmeetable alone, never "each limit alone is reachable".
"""

from __future__ import annotations

import itertools
import re

import numpy as np
import pytest
from helpers import DATA, bucket, explain_infeasible, layout_metrics, layouts, mode_cost, plan_mip, problem
from test_device_mode import TOY
from test_mip_known import SIX
from test_runtime import failing_mip

from model import pipeline
from model.base.errors import InfeasibleError, NoPlanFound
from model.cost.common import align
from model.domain.schema import Limits, Problem, Status
from model.planning.diagnose import at_best

METRICS = ("cost", "pad_ratio", "p95_latency_ms", "sequential_ms")


def true_minima(prob: Problem) -> dict[str, float]:
    """Each metric's least value over every plan: partitions x shapes within K x spike placements."""
    (b,) = prob.buckets
    values = sorted(prob.allowed_shapes) if prob.allowed_shapes else sorted(set(align(b.prompt_len).tolist()))
    best = dict.fromkeys(METRICS, np.inf)
    for lay in layouts(b, values, prob.max_shapes, prob.max_batch_size):
        by_shape: dict[int, list[int]] = {}
        for blk, s in zip(lay.blocks, lay.shapes, strict=True):
            by_shape.setdefault(s, []).extend(blk)
        for pick in itertools.product(*by_shape.values()):
            m = layout_metrics(b, lay, prob, dict(zip(by_shape, pick, strict=True)))
            for key in METRICS:
                best[key] = min(best[key], m.value(key))
    return best


def small_problems(count: int, seed: int, modes=("reference", "strict")):
    rng = np.random.default_rng(seed)
    for i in range(count):
        n = int(rng.integers(2, 6))
        bases = rng.choice(np.arange(1, 10) * 64, size=int(rng.integers(1, 4)), replace=False)
        b = bucket([int(rng.choice(bases) - rng.integers(0, 64)) for _ in range(n)], rng.integers(1, 80, n).tolist())
        allowed = None
        if rng.random() < 0.3:
            top = int(align(b.prompt_len).max()) + 128
            allowed = tuple(sorted({int(x) for x in rng.choice(np.arange(1, 12) * 64, 4, replace=False)} | {top}))
        mode = modes[i % len(modes)]
        yield Problem((b,), (Limits(),), int(rng.integers(1, 4)), mode_cost(mode, TOY),
                      max_batch_size=[None, 1, 2][int(rng.integers(0, 3))], allowed_shapes=allowed)


@pytest.mark.parametrize("prob", list(small_problems(36, 1)) + list(small_problems(12, 2, ("device",))))
def test_at_best_holds_for_the_problem_as_given_and_is_exact_for_sequential_time_when_b_is_1(prob):
    best = true_minima(prob)
    claimed = at_best(prob.buckets[0], prob)
    for key in METRICS:
        assert claimed[key] <= best[key] * (1 + 1e-12), (key, claimed[key], best[key])
    if prob.max_batch_size == 1:
        assert claimed["sequential_ms"] == pytest.approx(best["sequential_ms"], rel=1e-12)


@pytest.mark.slow
def test_max_batch_size_1_names_the_exact_least_sequential_time():
    """The embedded reference scenario with B = 1: every request is its own batch, so chat's sequential time is
    at least the sum of its solo latencies plus one spike -- and that plan reaches it."""
    prob, _ = pipeline.load_problem(pipeline.InputSpec(scenario=DATA / "default" / "reference.toml",
                                                       max_batch_size=1))
    chat = prob.buckets[0]
    least = float(prob.cost.fastest_latency(align(chat.prompt_len), chat.gen_len).sum()) + 1500.0
    with pytest.raises(InfeasibleError) as stop:
        plan_mip(prob, time_limit=20)
    said = re.search(r"chat: sequential_ms <= \S+ can never be met: no plan goes below (\S+?)[;)]?(\s|$)",
                     str(stop.value))
    assert said, str(stop.value)
    assert float(said.group(1)) == pytest.approx(least, rel=1e-5)


def test_a_single_cost_limit_below_the_optimum_is_named_unmeetable_alone():
    """Cost one below the brute-force optimum, the only limit: the exact whole model proves it."""
    with pytest.raises(InfeasibleError) as stop:
        plan_mip(problem(SIX, k=2, limits=Limits(max_cost=124_940_157.0)), time_limit=20)
    said = str(stop.value)
    assert "cost <= 1.2494e+08 cannot be met, even alone (highs proved the whole exact model infeasible)" in said
    assert "reachable" not in said
    assert "the best value known is 1.2494e+08" in said  # the optimum, 124,940,158


def test_a_single_limit_no_search_settles_is_not_proven(monkeypatch):
    """The MIPs end without a solution (forced) and no packer helps: the only limit is named, not proven."""
    failing_mip(monkeypatch, Status.TIME_LIMIT_NO_SOLUTION)
    prob = problem(SIX, k=2, limits=Limits(max_cost=130_000_000.0))
    with pytest.raises(NoPlanFound) as stop:
        plan_mip(prob, time_limit=5)
    said = str(stop.value)
    assert "b: cost <= 1.3e+08, the only limit, is met by no plan found (not proven unmeetable)" in said
    assert said.endswith("not proven infeasible")


def test_with_several_limits_one_unmeetable_alone_is_named_not_called_reachable():
    """Cost one below the optimum beside a pad limit every plan meets: the cost limit alone is the conflict."""
    prob = problem(SIX, k=2, limits=Limits(max_cost=124_940_157.0, max_pad_ratio=0.9))
    said = explain_infeasible(prob, proof="test")
    assert "cost <= 1.2494e+08 cannot be met even alone (proven)" in said, said
    assert "reachable" not in said and "each limit alone" not in said
