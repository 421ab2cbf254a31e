"""Serving mode's graph planner: the closest-assignment MIP against brute force, each constraint probed on 2-5
demands, the loop on the contract's example (judged by an independent replay), and the configs it writes."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest
from replay_helpers import GAUDI_SERVER, NXDI_SERVER, PROFILE, REQUESTS, bucket_of, example_trace

from model.cost.serving import ServingCost
from model.domain.server import GraphSet
from model.evaluation.replay_metrics import Slo, summarize
from model.evaluation.replay_run import replay, trace_of
from model.serveplan.candidates import Grid, dense_set, gaudi_families
from model.serveplan.configs import write_all
from model.serveplan.cover import Family, lookup_ms, solve_cover, uncovered
from model.serveplan.demands import Demands, merged, replay_demands
from model.serveplan.plan import PlanSpec, plan
from model.serving.replay_graphs import json_graphs, read_graph_set
from solvers.backends.result import Status

COST = ServingCost(PROFILE)


def family(kind, cands, times, cells) -> Family:
    return Family(kind, tuple(cands), np.asarray(times, dtype=float), np.asarray(cells, dtype=np.int64).reshape(-1, 3))


def brute(families: tuple[Family, ...], n: int) -> float | None:
    """The least recorded time over every choice of at most n candidates (None: none covers every demand)."""
    pool = [(i, g) for i, f in enumerate(families) for g in f.candidates]
    best = None
    for k in range(1, n + 1):
        for chosen in itertools.combinations(pool, k):
            parts = [lookup_ms(f, tuple(g for j, g in chosen if j == i)) for i, f in enumerate(families)]
            if any(p is None for p in parts):
                continue
            total = sum(parts)
            best = total if best is None or total < best else best
    return best


@pytest.mark.parametrize("seed", range(12))
def test_the_mip_is_the_brute_force_optimum_of_the_lookup(seed):
    rng = np.random.default_rng(seed)
    fams = []
    slowdown = None if seed % 2 else 1.3  # odd seeds: no limit; even: a slowdown limit of 1.3
    for kind in ("prompt", "decode"):
        cands = sorted({(int(rng.integers(1, 4)), int(rng.integers(1, 8)) * 16) for _ in range(4)} | {(4, 128)})
        times = [1.0 + b * s * 0.02 + rng.random() for b, s in cands]
        cells = sorted({(int(rng.integers(1, 5)), int(rng.integers(1, 129)), int(rng.integers(0, 4)))
                        for _ in range(3)})
        exact = np.array([1.0 + n * x * 0.02 for n, x, _ in cells])
        fams.append(Family(kind, tuple(cands), np.asarray(times), np.asarray(cells, dtype=np.int64).reshape(-1, 3),
                           exact, slowdown))
    n = int(rng.integers(2, 5))
    got = solve_cover(tuple(fams), n)
    want = brute(tuple(fams), n)
    if want is None:
        assert got.graphs is None and got.report.status is Status.INFEASIBLE
        return
    assert got.graphs is not None and sum(len(g) for g in got.graphs) <= n
    on_lookup = sum(lookup_ms(f, g) for f, g in zip(fams, got.graphs, strict=True))
    assert on_lookup == pytest.approx(want, rel=1e-9)
    assert got.report.objective == pytest.approx(on_lookup, rel=1e-7)
    assert got.report.status is Status.OPTIMAL and got.report.gap == pytest.approx(0.0, abs=1e-6)


def test_a_demand_runs_on_the_first_covering_graph_not_the_cheapest():
    # (1, 50) is covered by (1, 1000) before (2, 100) in sorted order: the stack runs it there
    f = family("prompt", [(1, 1000), (2, 100)], [10.0, 2.0], [(1, 50, 10), (1, 900, 1)])
    got = solve_cover((f,), 2)
    assert got.report.objective == pytest.approx(110.0)  # not 2 * 10 + 10: (2, 100) cannot take (1, 50) from it
    assert lookup_ms(f, got.graphs[0]) == pytest.approx(110.0)
    # with the order the other way round the cheap graph catches it
    g = family("prompt", [(1, 100), (2, 1000)], [2.0, 10.0], [(1, 50, 10), (2, 900, 1)])
    assert solve_cover((g,), 2).report.objective == pytest.approx(30.0)


def test_the_graph_cap_binds_and_is_infeasible_below_a_cover():
    f = family("prompt", [(1, 100), (2, 50), (2, 100)], [1.0, 1.0, 5.0], [(1, 90, 1), (2, 40, 1)])
    assert solve_cover((f,), 1).graphs == (((2, 100),),)
    assert solve_cover((f,), 2).report.objective == pytest.approx(2.0)
    g = family("prompt", [(1, 100), (2, 50)], [1.0, 1.0], [(1, 90, 1), (2, 40, 1)])
    one = solve_cover((g,), 1)
    assert one.graphs is None and one.report.status is Status.INFEASIBLE


def test_the_slowdown_limit_forbids_a_padded_graph():
    exact = np.array([2.0, 10.0])
    f = Family("decode", ((1, 20), (1, 600)), np.array([2.0, 10.0]), np.array([[1, 10, 5], [1, 500, 1]]), exact, 1.5)
    assert solve_cover((f,), 1).report.status is Status.INFEASIBLE  # (1, 600) is 5x (1, 10)'s own time
    two = solve_cover((f,), 2)
    assert two.graphs == (((1, 20), (1, 600)),) and two.report.objective == pytest.approx(20.0)
    loose = Family("decode", f.candidates, f.step_ms, f.cells, exact, 5.0)
    assert solve_cover((loose,), 1).graphs == (((1, 600),),)


def test_a_demand_with_no_steps_is_still_covered():
    f = family("decode", [(1, 20), (1, 600)], [1.0, 9.0], [(1, 10, 5), (1, 500, 0)])
    assert solve_cover((f,), 1).graphs == (((1, 600),),)
    assert solve_cover((f,), 2).report.objective == pytest.approx(5.0)


def test_demands_over_the_token_budget_have_no_candidate():
    demands = Demands(np.array([[1, 700, 2], [2, 600, 1]]), np.array([[1, 6, 3]]))
    prompt, decode = gaudi_families(demands, GAUDI_SERVER, COST, cap=2, longest=1000)
    assert all(b * s <= GAUDI_SERVER.max_num_batched_tokens for b, s in prompt.candidates)
    assert uncovered(prompt).tolist() == [[2, 600, 1]] and not len(uncovered(decode))
    assert all(b <= nb for b, nb in decode.candidates)


def test_the_recorded_demands_are_the_worked_examples_steps():
    from replay_helpers import GAUDI

    result = replay(example_trace(), GAUDI_SERVER, GAUDI, COST, record=True)
    d = replay_demands(result)
    assert d.prompt.tolist() == [[1, 50, 1], [1, 120, 1], [1, 200, 1], [1, 700, 1], [1, 900, 1], [2, 300, 1]]
    assert d.decode.tolist() == [[1, 1, 1], [1, 2, 4], [1, 6, 1], [2, 4, 1], [2, 9, 1], [2, 14, 1]]
    both = merged([Demands(d.prompt[:1], d.decode[:1])], [d])
    assert both.prompt[:, 2].tolist() == [1, 0, 0, 0, 0, 0] and both.decode[:, 2].sum() == 1


def final_replay(attempt, trace):
    return summarize(replay(trace, attempt.settings, attempt.graphs, COST), COST)


def test_the_plan_on_the_example_is_judged_by_its_replay():
    trace = example_trace()
    got = plan(trace, PlanSpec(GAUDI_SERVER, 4), COST)
    best = got.best
    assert best is not None and best.accepted and best.stable
    assert best.graphs.count <= 4 and not best.summary.runtime_compiles
    again = final_replay(best, trace)
    assert again.busy_ms == best.summary.busy_ms and not again.runtime_compiles
    assert best.settings.max_prefill_seqs == max(b for b, _ in best.graphs.prompt)
    assert all(b * s <= GAUDI_SERVER.max_num_batched_tokens for b, s in best.graphs.prompt)


def test_requests_that_never_overlap_get_the_brute_force_best_set():
    # one request at a time: every schedule is the same, so the best set over the grid is a brute-force search
    rows = [("a", 100, 3, 0.0), ("b", 300, 2, 100.0), ("c", 900, 4, 200.0)]
    trace = trace_of([bucket_of(rows)])
    server = replace(GAUDI_SERVER, max_prefill_seqs=1)
    got = plan(trace, PlanSpec(server, 3, caps=(1,)), COST)
    assert got.best is not None
    lengths = [128, 320, 928]  # each prompt rounded up to the grid's 32
    blocks = [2, 4, 8]  # ceil((p + j) / 128) reaches 1, 3, 8 blocks: the grid's step is 2
    best = None
    for k in range(1, 3):
        for prompt in itertools.combinations(lengths, k):
            for decode in itertools.combinations(blocks, 3 - k):
                graphs = GraphSet("gaudi", prompt=tuple((1, s) for s in prompt), decode=tuple((1, b) for b in decode))
                s = summarize(replay(trace, server, graphs, COST), COST)
                if not s.runtime_compiles and (best is None or s.busy_ms < best):
                    best = s.busy_ms
    assert got.best.summary.busy_ms == pytest.approx(best, rel=1e-12)


def test_nxdi_plans_buckets_that_cover_the_trace():
    trace = example_trace()
    got = plan(trace, PlanSpec(NXDI_SERVER, 4), COST)
    best = got.best
    assert best is not None and not best.summary.runtime_compiles and best.graphs.count <= 4
    assert best.graphs.context[-1] >= max(p for _, p, _, _ in REQUESTS)
    assert best.graphs.token_generation[-1] >= max(p + g - 1 for _, p, g, _ in REQUESTS)


def test_slos_the_replay_misses_refuse_every_cap():
    got = plan(example_trace(), PlanSpec(GAUDI_SERVER, 4, Slo(ttft_ms=1.0), caps=(1, 2), slowdowns=(None, 1.5)), COST)
    assert [a.slowdown for a in got.attempts[:2]] == [None, 1.5]  # the tighter level is tried when the SLO fails
    assert got.best is None
    assert all(not a.accepted and a.reason.startswith("SLO missed") for a in got.attempts if a.summary is not None)


def test_the_dense_first_set_pads_little_and_stays_in_the_stack_rules():
    dense = dense_set("gaudi", GAUDI_SERVER, 2, 900, 904, 16)
    assert all(b * s <= 1024 for b, s in dense.prompt) and all(b <= nb for b, nb in dense.decode)
    assert Grid().lengths >= 8


def test_configs_read_back_to_the_set():
    graphs = GraphSet("gaudi", prompt=((1, 256), (1, 512), (2, 256), (2, 512)),
                      decode=((2, 8), (2, 16), (4, 8), (4, 16)))
    out = {w.fmt: w for w in write_all(graphs, GAUDI_SERVER, 900, "test.")}
    assert out["gaudi-env"].text is not None and out["gaudi-file"].text is not None
    assert json_graphs(out["graphs"].name, out["graphs"].text, "gaudi") == replace(graphs, source="graphs.json")
    for fmt in ("list", "vllm-neuron", "vllm-tpu", "json", "nxdi"):
        assert out[fmt].text is None and out[fmt].refused
    odd = GraphSet("gaudi", prompt=((1, 224), (2, 320)), decode=((2, 14),))
    env = {w.fmt: w for w in write_all(odd, GAUDI_SERVER, 900, "test.")}["gaudi-env"]
    assert env.text is None and "not such a product" in env.refused
    nx = GraphSet("nxdi", context=(320, 928), token_generation=(320, 928))
    outs = {w.fmt: w for w in write_all(nx, NXDI_SERVER, 904, "test.")}
    assert outs["nxdi"].text is not None and outs["gaudi-file"].text is None


def test_the_gaudi_file_is_the_set_by_the_replays_reader(tmp_path):
    graphs = GraphSet("gaudi", prompt=((1, 224), (1, 928), (2, 320)), decode=((1, 6), (2, 14)))
    text = {w.fmt: w for w in write_all(graphs, GAUDI_SERVER, 904, "test.")}["gaudi-file"].text
    path = tmp_path / "b.txt"
    path.write_text(text)
    back = read_graph_set(path, "gaudi-file", replace(GAUDI_SERVER, max_prefill_seqs=2))
    assert back.graphs.prompt == graphs.prompt and back.graphs.decode == graphs.decode and not back.notes


# ---------------------------------------------------------------- the command line

def solve(folder, *extra):
    from helpers import cli

    return cli("model.solve", "requests.jsonl", "--cost-model", "serving", "--device-profile", "profile.toml",
               *extra, cwd=folder)


@pytest.fixture
def example(tmp_path):
    from replay_helpers import write_example

    write_example(tmp_path)
    return tmp_path


@pytest.mark.slow  # about 2 s: three command lines, the replay's and the export's imports among them
def test_the_cli_writes_the_set_and_configs_the_stack_reads_back(example):
    import json

    from helpers import cli

    done = solve(example, "--limit-graphs", "4", "--out", "plan", "--slo-ttft-ms", "5000")
    assert done.returncode == 0, done.stderr
    assert "gap 0.000% for the RECORDED demands" in done.stdout and "run-time compiles 0" in done.stdout
    folder = example / "plan"
    assert sorted(p.name for p in folder.iterdir()) == ["gaudi-buckets.txt", "graphs.json", "plan.json"]
    check = cli("model.export", "--check", "plan/gaudi-buckets.txt", "--format", "gaudi-file", cwd=example)
    assert check.returncode == 0, check.stdout + check.stderr
    again = cli("model.replay", "requests.jsonl", "--device-profile", "profile.toml", "--graphs",
                "plan/gaudi-buckets.txt", "--shapes-format", "gaudi-file", "--json", "-", cwd=example)
    assert again.returncode == 0, again.stderr
    reported = json.loads((folder / "plan.json").read_text())["replay"]
    replayed = json.loads(again.stdout)
    assert replayed["busy_ms"] == reported["busy_ms"] and replayed["runtime_compiles"]["count"] == 0
    assert replayed["graphs"]["count"] == reported["graphs"]["count"] <= 4
    assert "replay the export: python -m model.replay requests.jsonl --device-profile profile.toml" in done.stdout


@pytest.mark.slow  # two command lines, about 0.5 s on a quiet host
def test_the_cli_plans_nxdi(example):
    import json

    from helpers import cli

    done = solve(example, "--stack", "nxdi", "--limit-graphs", "4", "--out", "plan")
    assert done.returncode == 0, done.stderr
    assert (example / "plan" / "nxdi.json").is_file() and not (example / "plan" / "gaudi-buckets.txt").exists()
    again = cli("model.replay", "requests.jsonl", "--device-profile", "profile.toml", "--stack", "nxdi", "--graphs",
                "plan/nxdi.json", "--shapes-format", "nxdi", "--json", "-", cwd=example)
    assert again.returncode == 0, again.stderr
    reported = json.loads((example / "plan" / "plan.json").read_text())["replay"]
    assert json.loads(again.stdout)["busy_ms"] == reported["busy_ms"]


def test_slos_no_set_meets_write_nothing(example):
    done = solve(example, "--limit-graphs", "4", "--out", "plan", "--slo-ttft-ms", "1", "--max-prefill-seqs", "1")
    assert done.returncode == 1 and "nothing written" in done.stdout
    assert not (example / "plan").exists()


@pytest.mark.parametrize("extra, start", [
    ((), "error: --limit-graphs: serving mode needs --limit-graphs N or --max-warmup-s S"),
    (("--limit-graphs", "1"), "error: --limit-graphs: allows 1 graph"),
    (("--limit-graphs", "0"), "error: --limit-graphs: must be a positive integer"),
    (("--max-warmup-s", "nan"), "error: --max-warmup-s"),
    (("--max-warmup-s", "15"), "error: --max-warmup-s: allows 1 graph"),
    (("--limit-graphs", "4", "--slo-ttft-ms", "1", "--slo-quantile", "2"), "error: --slo-quantile"),
    (("--limit-graphs", "4", "--replicas", "0"), "error: --replicas"),
    (("--limit-graphs", "4", "--stack", "tpu"), "error: --stack"),
    (("--limit-graphs", "4", "--backend", "nope"), "error: --backend"),
    (("--limit-graphs", "4", "--out", "requests.jsonl"), "error: --out"),
    (("--limit-graphs", "4", "--max-num-batched-tokens", "500"), "error: requests.jsonl:"),
])
def test_bad_inputs_exit_2_with_one_line(example, extra, start):
    done = solve(example, *extra)
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(start), lines
    assert not (example / "plan").exists()


def test_a_request_file_without_arrival_times_is_one_line(example):
    (example / "requests.jsonl").write_text('{"request_id": 1, "prompt_len": 10, "gen_len": 2}\n')
    done = solve(example, "--limit-graphs", "4")
    assert done.returncode == 2 and "arrival" in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_a_rare_prompt_batch_gets_a_graph_inside_the_budget():
    # 500 carries 1 step in 51: no quantile lands on it, and (2, 1024) passes the budget of 1024 tokens
    demands = Demands(np.array([[1, 1000, 50], [2, 500, 1]]), np.array([[1, 8, 1]]))
    prompt, _ = gaudi_families(demands, GAUDI_SERVER, COST, cap=2, longest=1010)
    assert (2, 512) in prompt.candidates and not len(uncovered(prompt))


def test_the_graph_cap_from_the_warm_up_budget():
    from model.solve_serving import graph_cap

    assert graph_cap(None, 250.0, 10000.0) == 25  # 250 s of warm-up at 10 s a graph
    assert graph_cap(24, 250.0, 10000.0) == 24 and graph_cap(30, 250.0, 10000.0) == 25
    assert graph_cap(None, 1.0, 0.0) == 4096  # compiling is free: only the format's ceiling


def test_the_json_on_stdout_is_the_only_stdout(example):
    import json

    done = solve(example, "--limit-graphs", "4", "--json", "-")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["replay"]["runtime_compiles"]["count"] == 0 and doc["mip"]["certifies"].startswith("the recorded")
    assert "serving plan search" in done.stderr


def test_serving_flags_do_not_change_the_other_modes():
    from model.solve_serving import serving_requested

    assert serving_requested(["a.jsonl", "--cost-model", "serving"]) and serving_requested(["--cost-model=serving"])
    assert not serving_requested(["--cost-model", "device", "serving"]) and not serving_requested(["--cost-model"])


def test_a_time_limit_before_any_set_is_exit_4_and_writes_nothing(example):
    done = solve(example, "--limit-graphs", "4", "--time-limit", "0.001", "--out", "plan")
    assert done.returncode == 4 and "nothing written" in done.stderr
    assert not (example / "plan").exists()


def test_json_to_stdout_is_the_documented_document_with_the_summary(example):
    """`--json -`: stdout is one document of docs/json.md's schema (the plan's own keys after the common ones),
    whose summary says what the MIP's gap covers and reports the replay's busy time in device-hours."""
    import json

    from test_summary_json import check_document

    done = solve(example, "--limit-graphs", "4", "--json", "-")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    check_document(doc)
    summary = doc["summary"]
    assert summary["command"] == "solve" and summary["cost"]["unit"] == "device-ms"
    assert summary["cost"]["value"] == doc["replay"]["busy_ms"] and summary["cost"]["device_hours"] > 0
    assert summary["certainty"]["kind"] == "simulation" and "RECORDED" in summary["certainty"]["detail"]
