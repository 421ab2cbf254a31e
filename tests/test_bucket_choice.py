"""--batch-buckets auto: the planner chooses the batch buckets; its plan holds under the buckets it chose and its
bound under every list of buckets (brute force over every list and every plan of 3-5 requests)."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest
from helpers import brute_force, bucket, check_valid, problem

from model import pipeline
from model.base.errors import NoPlanFound
from model.cost.device import DeviceProfile
from model.domain.schema import Limits, Problem
from model.planning.bucket_choice import auto_problem, bucket_top, candidate_buckets, used_buckets, with_buckets

TOY = DeviceProfile(name="toy", prefill=(2.0, 0.01, 1e-5), decode=(5.0, 1e-4, 0.02),
                    decode_large=(3.0, 1e-4, 0.05), decode_large_from=3, compile_ms=40.0, kv_capacity_tokens=8000)
FIVE = bucket([51, 100, 130, 700, 64], [19, 53, 20, 300, 16])
FOUR = bucket([60, 100, 190, 64], [10, 30, 200, 40])
THREE = bucket([100, 130, 640], [20, 10, 5])


def auto(*buckets, k: int = 2, limits: Limits = Limits(), prof: DeviceProfile = TOY, **kw) -> Problem:
    return auto_problem(problem(*buckets, k=k, limits=limits, params=prof, mode="device", **kw))


def every_list_optimum(prob: Problem) -> float:
    """The cheapest plan over every list of batch buckets within 1..top (each list's brute-force optimum)."""
    sizes = range(1, bucket_top(prob) + 1)
    lists = (c for r in range(1, len(sizes) + 1) for c in itertools.combinations(sizes, r))
    return min(brute_force(with_buckets(prob, lst)).cost for lst in lists)


@pytest.mark.parametrize("prob", [
    pytest.param(auto(FIVE), marks=pytest.mark.slow), pytest.param(auto(FOUR, k=3), marks=pytest.mark.slow), auto(FOUR, k=3, max_graphs=2), auto(THREE, k=2, max_graphs=1),
    pytest.param(auto(FIVE, k=2, max_graphs=2), marks=pytest.mark.slow), auto(FOUR, k=2, max_graphs=3), auto(FOUR, k=2, limits=Limits(max_p95_latency_ms=900.0)),
    auto(FOUR, k=2, prof=replace(TOY, kv_capacity_tokens=None), max_batch_size=3),
], ids=["five", "four K=3", "four cap 2", "three cap 1", "five cap 2", "four K=2 cap 3", "four P95", "four B<=3 no kv"])
def test_auto_plans_hold_under_their_buckets_and_the_bound_under_every_list(prob):
    best = every_list_optimum(prob)
    planned = pipeline.plan(prob, "mip", time_limit=10)
    chosen = pipeline.planned_problem(prob, planned)
    assert chosen.cost.batch_buckets == planned.chosen_buckets and not chosen.choose_buckets
    results = check_valid(chosen, planned.batchings)
    cost = sum(r.metrics.cost for r in results)
    assert all(r.ok for r in results)
    assert cost == pytest.approx(planned.report.objective, rel=1e-12)
    assert best <= cost * (1 + 1e-12)  # the brute force sees every list
    assert planned.report.bound <= best * (1 + 1e-9)
    graphs = set().union(*(set(r.metrics.graphs) for r in results))
    assert prob.graph_cap is None or len(graphs) <= prob.graph_cap


def test_candidates_are_powers_of_two_and_the_kv_top():
    assert candidate_buckets(1) == (1,)
    assert candidate_buckets(5) == (1, 2, 4, 5)
    assert candidate_buckets(8) == (1, 2, 4, 8)
    prob = auto(bucket([64] * 40, [1] * 40))  # 8000 // (64 + 1) = 123 members fit, 40 requests exist
    assert bucket_top(prob) == 40 and prob.cost.batch_buckets[-1] == 40 and prob.choose_buckets


def test_a_plan_judged_under_its_used_buckets_costs_the_same():
    prob = auto(FIVE, k=3)
    bt = pipeline.plan(replace(prob, choose_buckets=False), "dpfill").batchings
    used = used_buckets(prob, bt)
    assert set(used) <= set(prob.cost.batch_buckets)
    over = [r.metrics for r in check_valid(replace(prob, choose_buckets=False), bt)]
    under = [r.metrics for r in check_valid(with_buckets(prob, used), bt)]
    assert [m.cost for m in over] == [m.cost for m in under]
    assert [m.graphs for m in over] == [m.graphs for m in under]


def test_packers_choose_buckets_too_and_report_no_bound():
    prob = auto(FIVE, k=2)
    planned = pipeline.plan(prob, "dpfill")
    assert planned.report.bound is None and planned.chosen_buckets is not None
    assert all(r.ok for r in check_valid(pipeline.planned_problem(prob, planned), planned.batchings))


def test_a_cap_no_candidate_list_meets_is_no_plan_not_a_proof():
    # P95 below what one graph of every request allows, with one graph: infeasible over the candidates, and
    # over every list too, but only the candidates were searched
    prob = auto(FOUR, k=1, max_graphs=1, limits=Limits(max_p95_latency_ms=50.0))
    with pytest.raises(NoPlanFound, match="not proven for every choice of buckets"):
        pipeline.plan(prob, "mip", time_limit=5)


def test_used_buckets_of_no_batch_is_one():
    prob = auto(THREE)
    empty = (replace(pipeline.plan(replace(prob, choose_buckets=False), "solo").batchings[0],
                     batch_of=np.zeros(0, np.int64)),)
    assert used_buckets(prob, empty) == (1,)


# ---------------------------------------------------------------- auto from the profile, the scenario and the flags

def test_auto_in_a_profile_or_a_scenario_makes_the_planner_choose(tmp_path):
    from test_graph_input import profile_text, scenario

    from model.load.scenario import load_scenario

    (tmp_path / "p.toml").write_text(profile_text('batch_buckets = "auto"'))
    from_profile, _ = pipeline.load_problem(pipeline.InputSpec(scenario=scenario(tmp_path, 'device = "p.toml"')))
    assert from_profile.choose_buckets and from_profile.cost.batch_buckets[0] == 1
    (tmp_path / "q.toml").write_text(profile_text("batch_buckets = [1, 2]"))
    sc = load_scenario(scenario(tmp_path, 'device = "q.toml"\nbatch_buckets = "auto"'))
    assert sc.cost.params.auto_buckets and sc.cost.batch_buckets is None
    chosen, _ = pipeline.load_problem(pipeline.InputSpec(scenario=sc.path, max_graphs=2))
    assert chosen.choose_buckets and chosen.max_graphs == 2
    fixed, _ = pipeline.load_problem(pipeline.InputSpec(scenario=sc.path, batch_buckets=(2, 16)))
    assert not fixed.choose_buckets and fixed.cost.batch_buckets == (2, 16)  # the flag replaces auto


def test_evaluate_refuses_auto_with_the_list_to_give(tmp_path):
    from test_graph_input import PROFILE, write_example

    from model import evaluate
    from model.base.errors import InputError

    reqs, plan = write_example(tmp_path)
    with pytest.raises(InputError, match="auto chooses the buckets while planning") as err:
        evaluate.main([str(reqs), str(plan), "--device-profile", str(PROFILE), "--batch-buckets", "auto"])
    assert err.value.file == "--batch-buckets"


def test_cli_solve_auto_prints_the_chosen_buckets_and_evaluate_accepts_them(tmp_path, capsys):
    from test_graph_input import PROFILE, write_example

    from model import evaluate, solve

    reqs, _ = write_example(tmp_path)
    out = tmp_path / "out"
    assert solve.main([str(reqs), "--device-profile", str(PROFILE), "--batch-buckets", "auto", "--limit-graphs",
                       "2", "--time-limit", "10", "--out", str(out), "--quiet"]) == 0
    text = capsys.readouterr().out
    line = next(x for x in text.splitlines() if x.startswith("note: batch buckets chosen by the planner: "))
    chosen = line.split(": ")[2].split(" (")[0].replace(" ", "")
    assert "lower bound" in text
    assert evaluate.main([str(reqs), str(out / "plan_reqs.jsonl"), "--device-profile", str(PROFILE),
                          "--batch-buckets", chosen, "--limit-graphs", "2"]) == 0
    assert "OK" in capsys.readouterr().out


# ---------------------------------------------------------------- arrival windows with batch buckets

def windowed_bucket(prompts, gens, arrivals):
    b = bucket(prompts, gens, name="w")
    return replace(b, arrival_s=np.asarray(arrivals, dtype=np.float64))


WINDOWED = windowed_bucket([60, 100, 190, 64], [10, 30, 200, 40], [0.0, 1.0, 2.0, 11.0])


@pytest.mark.parametrize("buckets, cap", [((1, 2, 4), None), ((2, 4), 2), ("auto", 2), ("auto", None)],
                         ids=["1,2,4", "2,4 cap 2", "auto cap 2", "auto"])
def test_windows_with_batch_buckets_plan_within_windows_and_bound_the_optimum(buckets, cap):
    from model.domain.windowing import windowed, windows_of

    base = problem(WINDOWED, k=2, params=TOY, mode="device", max_graphs=cap)
    plain = auto_problem(base) if buckets == "auto" else with_buckets(base, buckets)
    prob = windowed(plain, 10.0)
    planned = pipeline.plan(prob, "mip", time_limit=10)
    judged = pipeline.planned_problem(prob, planned)
    results = check_valid(judged, planned.batchings)
    assert all(r.ok for r in results)
    wins = windows_of(judged, judged.buckets[0])
    for b in np.unique(planned.batchings[0].batch_of):
        assert len(set(wins[planned.batchings[0].batch_of == b].tolist())) == 1  # no batch spans two windows
    # windows only forbid plans: the optimum without them (over every list, with auto) is below the windowed one
    best = every_list_optimum(plain) if buckets == "auto" else brute_force(plain).cost
    assert planned.report.bound <= best * (1 + 1e-9)
    assert planned.report.bound <= sum(r.metrics.cost for r in results) * (1 + 1e-12)


def test_dask_refuses_a_profile_whose_buckets_are_auto(tmp_path):
    import argparse

    from test_graph_input import profile_text

    from model.base.errors import InputError
    from model.cli_common import dask_settings

    path = tmp_path / "p.toml"
    path.write_text(profile_text('batch_buckets = "auto"'))
    args = argparse.Namespace(limit_shapes=None, max_seq_len=None, max_batch_size=None, batch_buckets=None,
                              limit_graphs=None, max_warmup_s=None, cost_params=None, device_profile=path,
                              cost_model=None, columns=None, format=None)
    with pytest.raises(InputError, match="dask does not support compiled batch sizes"):
        dask_settings(args)


def test_bucket_moves_drop_add_and_swap_but_keep_the_largest():
    from model.planning.bucket_choice import bucket_moves

    moves = bucket_moves((2, 8, 16), (5, 8, 20))
    assert (8, 16) in moves and (2, 16) in moves and (2, 8) not in moves  # the largest stays
    assert (2, 5, 8, 16) in moves and (2, 8, 16, 20) in moves
    assert (5, 8, 16) in moves and (2, 5, 16) in moves  # swaps between neighbours only
    assert len(moves) == len(set(moves)) and (2, 8, 16) not in moves


def test_full_batch_sizes_are_what_the_kv_capacity_holds_at_each_shape():
    from model.planning.bucket_choice import full_batch_sizes

    prob = auto(bucket([100, 120, 600, 640], [100, 100, 400, 400]))
    assert full_batch_sizes(prob, (128, 640), 4) == ()  # 8000 // 228 = 35 and 8000 // 1040 = 7: above the top
    assert full_batch_sizes(prob, (128, 640), 64) == (7, 35)
    assert full_batch_sizes(auto(bucket([100], [10]), prof=replace(TOY, kv_capacity_tokens=None)), (128,), 4) == ()


def test_a_hold_out_checks_the_chosen_shapes_with_the_chosen_buckets():
    from model.deploy.holdout import holdout

    b = bucket([60, 100, 130, 64, 90, 120, 70, 110], [10, 30, 20, 40, 15, 25, 35, 12], name="h")
    prob = auto(b, k=2, max_graphs=2)
    check, train = holdout(prob, 0.25, "mip", time_limit=10)
    assert train.planned.chosen_buckets is not None and check.fixed is not None
    held = {B for r in check.fixed.evaluation.results for B, _ in r.metrics.graphs}
    assert held <= set(train.planned.chosen_buckets)  # the deployed buckets, not a new choice
    assert check.fixed.planned.chosen_buckets is None
