"""Fast probes (2-5 cells) for what the slow graph-cap tests of test_graph_mip.py check: the MIP with batch buckets
never costlier than dpfill and bounded, the graph cap kept across buckets at the brute-force optimum, solve ->
evaluate with buckets and a graph cap, and the sweep and solve judging the warm-up cap.  In process, so each
takes well under a second."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from helpers import brute_force, bucket, check_valid, plan_mip, problem
from test_graph_mip import PROFILE, TOY, graphs_of, pipeline_cost

from model import evaluate, solve, sweep
from model.cost.model import cost_model
from model.domain.schema import Limits

A = bucket([60, 300, 310, 70], [20, 40, 30, 15], name="a")
B = bucket([100, 320, 90], [25, 60, 10], name="b")


def graphs_problem(max_graphs=None, limits=Limits(), compile_ms=TOY.compile_ms):
    prof = replace(TOY, batch_buckets=(1, 2, 4), compile_ms=compile_ms)
    return problem(A, B, k=2, cost=cost_model("device", prof), limits=limits, max_graphs=max_graphs)


@pytest.mark.parametrize("limits", [Limits(), Limits(max_p95_latency_ms=700.0)], ids=["no limit", "P95"])
def test_probe_the_mip_plans_graphs_no_costlier_than_dpfill_and_bounds_itself(limits):
    prob = graphs_problem(limits=limits)
    planned = plan_mip(prob, time_limit=5)
    results = check_valid(prob, planned.batchings)
    mine = sum(r.metrics.cost for r in results)
    assert all(r.ok for r in results)
    dpfill = pipeline_cost(prob, "dpfill")
    assert dpfill is None or mine <= dpfill * (1 + 1e-12)
    assert planned.report.bound <= mine * (1 + 1e-12)
    assert all(bt.batch_of.size == 0 or max(list(bt.batch_of).count(b) for b in set(bt.batch_of)) <= 4
               for bt in planned.batchings)


def test_probe_the_graph_cap_holds_across_buckets_at_the_optimum():
    pad = Limits(max_pad_ratio=0.6)  # compiles nearly free and padding capped: without a graph cap, 3 graphs
    cheap = graphs_problem(compile_ms=1.0, limits=pad)
    free = graphs_of(check_valid(cheap, plan_mip(cheap, time_limit=5).batchings))
    cap = len(free) - 1
    assert cap >= 1
    prob = graphs_problem(max_graphs=cap, compile_ms=1.0, limits=pad)
    planned = plan_mip(prob, time_limit=5)
    results = check_valid(prob, planned.batchings)
    assert all(r.ok for r in results) and len(graphs_of(results)) <= cap
    assert sum(r.metrics.cost for r in results) == pytest.approx(brute_force(prob).cost, rel=1e-9)


def write_requests(path: Path) -> Path:
    rows = [(100, 20), (130, 50), (700, 10), (90, 30), (500, 200)]
    path.write_text("".join(f'{{"request_id": "q{i}", "prompt_len": {p}, "gen_len": {g}}}\n'
                            for i, (p, g) in enumerate(rows)))
    return path


def test_probe_cli_solve_with_batch_buckets_and_a_cap_then_evaluate_accepts(tmp_path, capsys):
    reqs = write_requests(tmp_path / "r.jsonl")
    flags = ["--device-profile", str(PROFILE), "--batch-buckets", "1,4", "--limit-graphs", "2", "--limit-shapes", "2"]
    assert solve.main([str(reqs), *flags, "--time-limit", "5", "--quiet", "--out", str(tmp_path / "out")]) == 0
    assert evaluate.main([str(reqs), str(tmp_path / "out" / "plan_r.jsonl"), *flags]) == 0
    assert "OK" in capsys.readouterr().out


def test_probe_sweep_and_solve_judge_the_warm_up_cap(tmp_path):
    from model.sweeping.table import read_csv

    reqs = write_requests(tmp_path / "r.jsonl")
    flags = [str(reqs), "--device-profile", str(PROFILE), "--batch-buckets", "1,4", "--max-warmup-s", "30",
             "--time-limit", "5", "--quiet"]
    assert sweep.main([*flags, "--k", "2", "--solvers", "mip,solo", "--out", str(tmp_path / "s.csv")]) == 0
    rows = read_csv(tmp_path / "s.csv")
    mip = [r for r in rows if r.planner == "mip"]
    assert mip and all(r.limits_met and r.n_graphs == 1 and r.warmup_s == 20.0 for r in mip)  # 30 s: one graph
    solo = [r for r in rows if r.planner == "solo"]
    assert solo and not any(r.limits_met for r in solo) and all("warm-up" in r.broken for r in solo)
    out = tmp_path / "out"
    assert solve.main([*flags, "--solver", "solo", "--out", str(out)]) == 1
    assert solve.main([*flags, "--out", str(out)]) == 0
