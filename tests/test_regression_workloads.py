"""The twin workloads (data/workloads/*, copies of the shared ones): what issue 3 asks of the planner, checked on each scenario.

Slow (a full solve per scenario): ``pytest -m slow``.  For every scenario folder: the MIP's plans are valid,
meet every limit of every bucket, use at most 8 shapes across all buckets, cost no more than the greedy
packer's plan on every bucket, and the run reports a gap of at most 1%.
"""

from __future__ import annotations

import pytest
from helpers import WORKLOADS, check_valid, plan_mip

from model.load.scenario import load_scenario
from model.packers import PACKERS

SCENARIOS = sorted(p.parent.name for p in WORKLOADS.glob("*/scenario.toml"))


@pytest.mark.slow
@pytest.mark.parametrize("name", SCENARIOS)
def test_mip_meets_every_limit_beats_greedy_and_closes_the_gap(name):
    prob = load_scenario(WORKLOADS / name / "scenario.toml").problem()
    out = plan_mip(prob)
    results = check_valid(prob, out.batchings)
    assert all(r.ok for r in results), [(r.name, [c for c in r.checks if not c.ok]) for r in results]
    assert len(set().union(*(r.metrics.shapes for r in results))) <= 8
    greedy = check_valid(prob, PACKERS["greedy"](prob))
    for mine, theirs in zip(results, greedy, strict=True):
        assert mine.metrics.cost <= theirs.metrics.cost, (mine.name, mine.metrics.cost, theirs.metrics.cost)
    assert out.report.gap is not None and out.report.gap <= 0.01, out.report
    assert out.report.bound <= sum(r.metrics.cost for r in results)
