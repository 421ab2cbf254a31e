"""Sweep engine and CLI: the grid, the tidy CSV, infeasible points as rows, carried plans, the recommendation."""

from __future__ import annotations

import csv
from dataclasses import fields
from pathlib import Path

import pytest
from sweep_helpers import grid_rows, tiny_problem, write_scenario

from model.base.errors import InputError
from model.domain.schema import Limits
from model.sweep import main, parse_solvers
from model.sweeping.grid import SweepPoint, check_sweep_limit, parse_factors, parse_ks, point_problem, sweep_points
from model.sweeping.recommend import recommend
from model.sweeping.runner import SweepRow, run_sweep
from model.sweeping.table import read_csv, write_csv

SOLVERS = "mip,baseline,greedy"


def read_rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def test_parse_ks_ranges_and_lists():
    assert parse_ks("1-4") == (1, 2, 3, 4)
    assert parse_ks("8,2,4-5,2") == (2, 4, 5, 8)
    for bad in ("0-3", "4-2", "x", "1-"):
        with pytest.raises(InputError):
            parse_ks(bad)


def test_parse_factors_sorted_and_positive():
    assert parse_factors("1.1,0.8,1.0") == (0.8, 1.0, 1.1)
    for bad in ("0,1", "-1", "a", ""):
        with pytest.raises(InputError):
            parse_factors(bad)


def test_parse_solvers_keeps_registry_order_and_refuses_unknown():
    assert parse_solvers("greedy,mip,baseline") == ("mip", "baseline", "greedy")
    with pytest.raises(InputError, match="nope"):
        parse_solvers("mip,nope")


def test_points_visit_tighter_neighbours_first():
    points = sweep_points((1, 2), "max_sequential_ms", (1.1, 0.9))
    assert [(p.factor, p.k) for p in points] == [(0.9, 1), (0.9, 2), (1.1, 1), (1.1, 2)]
    assert sweep_points((3, 1)) == (SweepPoint(1.0, 1), SweepPoint(1.0, 3))


def test_point_problem_reuses_buckets_and_scales_one_limit():
    base = tiny_problem(limits=Limits(max_cost=10.0, max_sequential_ms=100.0))
    p = point_problem(base, SweepPoint(0.5, 2, "max_sequential_ms"))
    assert p.buckets is base.buckets and p.max_shapes == 2
    assert all(lim == Limits(max_cost=10.0, max_sequential_ms=50.0) for lim in p.limits)


def test_sweeping_an_unset_limit_is_an_input_error():
    with pytest.raises(InputError, match="no bucket sets max_pad_ratio"):
        check_sweep_limit(tiny_problem(), "max_pad_ratio")
    with pytest.raises(InputError):
        check_sweep_limit(tiny_problem(), "max_tokens")


def test_cli_writes_one_row_per_point_bucket_and_planner(tmp_path):
    scenario = write_scenario(tmp_path)
    out = tmp_path / "s.csv"
    assert main(["--scenario", str(scenario), "--k", "1-2", "--solvers", SOLVERS, "--time-limit", "5",
                 "--out", str(out), "--quiet"]) == 0
    rows = read_rows(out)
    assert list(rows[0]) == [f.name for f in fields(SweepRow)]
    assert len(rows) == 2 * 3 * 2
    assert [(r["k"], r["planner"], r["bucket"]) for r in rows[:6]] == [
        ("1", p, b) for p in ("mip", "baseline", "greedy") for b in ("a", "b")]
    for r in rows:
        assert r["status"] != "infeasible" and float(r["cost"]) > 0
        assert float(r["ratio_to_mip"]) == pytest.approx(float(r["cost"]) / float(
            next(m["cost"] for m in rows if m["k"] == r["k"] and m["bucket"] == r["bucket"] and m["planner"] == "mip")))
        assert r["limits_met"] == "true"  # no limits set
    mip = [r for r in rows if r["planner"] == "mip"]
    assert all(float(r["ratio_to_mip"]) == 1.0 and float(r["bound"]) <= float(r["cost"]) * (1 + 1e-9) for r in mip)


def test_infeasible_point_is_a_row_not_a_crash(tmp_path):
    scenario = write_scenario(tmp_path, {"max_sequential_ms": 1.0})
    out = tmp_path / "s.csv"
    assert main(["--scenario", str(scenario), "--k", "2", "--solvers", SOLVERS, "--time-limit", "5",
                 "--out", str(out), "--quiet"]) == 0
    rows = {(r["planner"], r["bucket"]): r for r in read_rows(out)}
    for bucket in ("a", "b"):
        for planner in ("mip", "greedy"):
            r = rows[(planner, bucket)]
            assert r["status"] == "infeasible" and r["cost"] == "" and r["limits_met"] == "false"
            assert "cannot" in r["note"] or "infeasible" in r["note"]
        baseline = rows[("baseline", bucket)]
        assert baseline["limits_met"] == "false" and "sequential_ms" in baseline["broken"]
        assert baseline["ratio_to_mip"] == ""  # nothing to compare against


@pytest.mark.slow  # 2-7 s each on 2 cores: the default run's 90 s budget; cheaper siblings cover it by default
def test_limit_sweep_scales_each_bucket_limit_and_mip_cost_never_rises(tmp_path):
    base = tiny_problem(limits=Limits(max_sequential_ms=3.4e6))  # loose enough for the MIP to finish fast
    points = sweep_points((1, 2), "max_sequential_ms", (0.9, 1.5))
    result = run_sweep(base, points, ("mip", "greedy"), time_limit=1)
    assert len(result.rows) == 4 * 2 * 2
    for r in result.rows:
        assert r.limit_value == pytest.approx(3.4e6 * r.factor) == r.max_sequential_ms
    mip = {(r.factor, r.k): r.total_cost for r in result.rows if r.planner == "mip" and r.bucket == "a"}
    # a plan found at a tighter point is carried to looser ones, so cost is monotone on both axes
    for (f, k), cost in mip.items():
        for (f2, k2), cost2 in mip.items():
            if f2 >= f and k2 >= k and cost is not None:
                assert cost2 <= cost * (1 + 1e-9)
    assert set(result.mip_batchings) == set(points)


def test_csv_round_trips(tmp_path):
    rows = grid_rows({"mip": [10.0, 9.0], "pow2": [30.0, 20.0]}, broken=("pow2",))
    path = tmp_path / "x.csv"
    write_csv(rows, path)
    assert read_csv(path) == rows


def test_recommend_smallest_k_within_tolerance_and_savings_vs_best_rule():
    rows = grid_rows({"mip": [110.0, 100.2, 100.0], "greedy": [120.0, 125.0, 125.0], "pow2": [90.0, 90.0, 90.0]},
                     broken=("pow2",))
    rec = recommend(rows, tolerance=0.005)
    assert rec.planner == "mip" and rec.point.k == 2 and rec.cheapest_k == 3
    assert rec.cost == pytest.approx(100.2) and rec.bound == pytest.approx(0.99 * 100.2)
    assert rec.rule.planner == "greedy" and rec.rule.point.k == 1  # pow2 breaks limits: not a usable rule
    assert rec.savings == pytest.approx(1 - 100.2 / 120.0)
    assert rec.same_k_savings == pytest.approx(1 - 100.2 / 125.0)
    # the stack's rule at the same K is the reference even where it breaks a limit (the report says so)
    assert rec.stack_rule.planner == "pow2" and rec.stack_rule.point == rec.point and not rec.stack_rule.limits_met
    assert rec.stack_savings == pytest.approx(1 - 100.2 / 90.0) and rec.stack_rule_best is None
    assert recommend(rows, tolerance=0.0).point.k == 3


def test_recommend_uses_the_base_factor_and_says_when_nothing_fits():
    rows = grid_rows({"mip": [100.0, 90.0]}, factors=(0.5, 1.0, 2.0), limit="max_sequential_ms")
    assert recommend(rows).point == SweepPoint(1.0, 2, "max_sequential_ms")
    none = recommend(grid_rows({"mip": [100.0]}, broken=("mip",)))
    assert none.point is None and none.savings is None
