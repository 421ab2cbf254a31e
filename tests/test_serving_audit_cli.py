"""``model.audit --cost-model serving`` and ``model.replay --replicas auto`` end to end, and hostile flags.

The worked example of ``shared/serving_model.md`` is today's config (its gaudi graphs,
one decode miss compiled at run time); the planned side is a set with no miss.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest
from helpers import cli
from replay_helpers import GAUDI, GAUDI_SERVER, PROFILE, example_trace, write_example

from model.cost.serving import ServingCost
from model.deploy.serving_audit import serving_audit
from model.evaluation.capacity import capacity, scaled
from model.evaluation.replay_metrics import Slo, summarize
from model.evaluation.replay_run import replay, trace_of
from model.load.profile import load_profile_file
from model.load.requests import Columns, load_requests
from model.serving.replay_graphs import read_graph_set

REPO = Path(__file__).resolve().parents[1]

PLANNED = {"prompt": [[1, 1024], [2, 512], [4, 256]], "decode": [[2, 8], [4, 96]]}


@pytest.fixture
def example(tmp_path) -> Path:
    write_example(tmp_path)
    (tmp_path / "planned.json").write_text(json.dumps(PLANNED))
    return tmp_path


def audit(folder: Path, *extra: str, planned: bool = True):
    more = ("--graphs", "planned.json", "--graphs-format", "json") if planned else ()
    return cli("model.audit", "--cost-model", "serving", "--device-profile", "profile.toml", "--shapes-from",
               "gaudi.json", "--shapes-format", "json", *more, "requests.jsonl", *extra, cwd=folder)


def test_today_against_planned_side_by_side(example):
    done = audit(example, "--slo-ttft-ms", "200", "--slo-tpot-ms", "50", "--out", "out")
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert "Headline: the planned graphs would cut busy time" in text
    assert "run-time compiles 1 -> 0" in text and "decode (4, 96)" in text  # today's miss, named
    assert "10338.57248" not in text  # the text rounds; the JSON keeps every digit
    doc = json.loads((example / "out" / "audit.json").read_text())
    today, planned = (s["replay"] for s in doc["sides"])
    assert today["busy_ms"] == pytest.approx(10338.57248, rel=1e-9) and today["runtime_compiles"]["count"] == 1
    assert planned["runtime_compiles"]["count"] == 0 and planned["busy_ms"] < today["busy_ms"]
    assert doc["busy_saving_ms"] == pytest.approx(today["busy_ms"] - planned["busy_ms"])
    graphs = json.loads((example / "out" / "today-graphs.json").read_text())
    assert graphs["prompt"] == [list(g) for g in GAUDI.prompt] and graphs["stack"] == "gaudi"


@pytest.mark.slow  # four pictures (and matplotlib's import): seconds
def test_the_report_holds_both_sides_pictures(example):
    done = audit(example, "--report", "rep", "--out", "out")
    assert done.returncode == 0, done.stderr
    names = {p.name for p in (example / "rep").iterdir()}
    assert names == {"report.md", "report.html", "today-timeline.png", "today-latency.png", "planned-timeline.png",
                     "planned-latency.png"}
    assert "Headline" in (example / "rep" / "report.md").read_text() and (example / "out" / "audit.json").exists()


def test_the_report_pictures_count_against_the_time_limit(example, monkeypatch):
    """The four pictures were drawn after the last look at --time-limit (1.8 s of a 2.7 s audit of 2,000
    requests under --time-limit 1): past it, exit 4 and nothing written."""
    import time

    from model.report import serving_plots

    def slow(result, summary):
        time.sleep(0.4)  # longer than the limit alone: exit 4 on a host of any speed
        return {"timeline.png": b"png", "latency.png": b"png"}

    monkeypatch.setattr(serving_plots, "report_files", slow)
    done = audit(example, "--report", "rep", "--out", "out", "--time-limit", "0.3")
    assert done.returncode == 4 and "did not finish within --time-limit 0.3 s" in done.stderr, done.stderr
    assert not (example / "rep").exists() and not (example / "out").exists()


def test_todays_graphs_written_by_out_replay_the_same(example):
    assert audit(example, "--out", "out", planned=False).returncode == 0
    again = cli("model.replay", "requests.jsonl", "--device-profile", "profile.toml", "--graphs",
                "out/today-graphs.json", "--json", "-", cwd=example)
    assert again.returncode == 0, again.stderr
    first = json.loads((example / "out" / "audit.json").read_text())["sides"][0]["replay"]
    assert json.loads(again.stdout)["busy_ms"] == first["busy_ms"]


def test_auto_gives_each_side_a_capacity_table(example):
    done = audit(example, "--replicas", "auto", "--rate-scale", "1", "4", "--slo-ttft-ms", "200", "--out", "out")
    assert done.returncode == 0, done.stderr
    doc = json.loads((example / "out" / "audit.json").read_text())
    cost, slo = ServingCost(PROFILE), Slo(ttft_ms=200.0)
    want = capacity(example_trace(), (1.0, 4.0), GAUDI_SERVER, GAUDI, cost, slo, 1024, scan_below=16)
    rows = doc["sides"][0]["capacity"]["rows"]
    assert [r["replicas"] for r in rows] == [s.replicas for s in want]
    assert doc["replicas"] == max(r["replicas"] for r in (s["capacity"]["rows"][0] for s in doc["sides"]))
    assert "Capacity" in done.stdout and "rate" in done.stdout and "busy share" in done.stdout


def test_replay_auto_prints_the_table_and_writes_its_rows(example):
    done = cli("model.replay", "requests.jsonl", "--device-profile", "profile.toml", "--graphs", "gaudi.json",
               "--replicas", "auto", "--rate-scale", "1", "2", "--slo-ttft-ms", "200", "--slo-tpot-ms", "50",
               "--json", "-", cwd=example)
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)["capacity"]["rows"]
    assert [r["rate_scale"] for r in rows] == [1.0, 2.0]
    for row in rows:  # the row's count meets the SLOs, and one fewer does not
        r = row["replicas"]
        trace = example_trace()
        cost, slo = ServingCost(PROFILE), Slo(ttft_ms=200.0, tpot_ms=50.0)
        met = summarize(replay(scaled(trace, row["rate_scale"]), GAUDI_SERVER, GAUDI, cost, r), cost, slo).slo
        assert met.ttft_met and met.tpot_met and row["proved_fewest"]
    assert "TTFT p95 ms" in done.stderr


def test_replay_auto_draws_no_pictures_and_runs_on_nxdi(example):
    base = ("requests.jsonl", "--device-profile", "profile.toml", "--replicas", "auto", "--slo-ttft-ms", "100")
    done = cli("model.replay", *base, "--graphs", "gaudi.json", "--report", "pics", cwd=example)
    assert done.returncode == 2 and done.stderr.startswith("error: --report:") and not (example / "pics").exists()
    done = cli("model.replay", *base, "--graphs", "nxdi.json", "--stack", "nxdi", "--json", "-", cwd=example)
    assert done.returncode == 0, done.stderr
    (row,) = json.loads(done.stdout)["capacity"]["rows"]
    assert row["at"]["meets_slo"] and row["proved_fewest"] and row["at"]["ttft_ms_at_quantile"] <= 100


def test_an_slo_no_count_meets_is_said_and_capped(example):
    done = cli("model.replay", "requests.jsonl", "--device-profile", "profile.toml", "--graphs", "gaudi.json",
               "--replicas", "auto", "--slo-ttft-ms", "0", "--max-replicas", "5", cwd=example)
    assert done.returncode == 0, done.stderr
    assert "> 5" in done.stdout and "no count up to the cap 5 meets the SLOs" in done.stdout
    done = cli("model.replay", "requests.jsonl", "--device-profile", "profile.toml", "--graphs", "gaudi.json",
               "--replicas", "auto", "--slo-ttft-ms", "0", cwd=example)
    assert done.returncode == 0 and "none found" in done.stdout and "raising --max-replicas cannot help" in done.stdout


@pytest.mark.parametrize("extra, start", [
    (("--rate-scale", "0"), "error: --rate-scale:"),
    (("--rate-scale", "nan"), "error: --rate-scale:"),
    (("--rate-scale", "-2"), "error: --rate-scale:"),
    (("--rate-scale", "1e300"), "error: --rate-scale:"),
    (("--rate-scale", "inf"), "error: --rate-scale:"),
    (("--rate-scale", "x"), "error: --rate-scale:"),
    (("--rate-scale", "1", "2"), "error: --rate-scale:"),  # several need auto
    (("--replicas", "auto", "--rate-scale", "2", "2", "--slo-ttft-ms", "1"), "error: --rate-scale:"),
    (("--rate-scale", "1", "--rate-scale", "2"), "error: --rate-scale:"),  # twice adds: two values, no auto
    (("--replicas", "auto", "--slo-ttft-ms", "1", "--rate-scale", *["1"] * 65), "error: --rate-scale:"),
    (("--replicas", "0"), "error: --replicas:"),
    (("--replicas", "-1"), "error: --replicas:"),
    (("--replicas", "99999999999999999999"), "error: --replicas:"),
    (("--replicas", "Auto"), "error: --replicas:"),
    (("--replicas", "auto"), "error: --replicas:"),  # no SLO
    (("--replicas", "auto", "--slo-ttft-ms", "1", "--max-replicas", "0"), "error: --max-replicas:"),
    (("--replicas", "auto", "--slo-ttft-ms", "1", "--max-replicas", "70000"), "error: --max-replicas:"),
    (("--max-replicas", "4"), "error: --max-replicas:"),  # needs auto
    (("--replicas", "auto", "--slo-ttft-ms", "nan"), "error: --slo-ttft-ms:"),
    (("--replicas", "auto", "--slo-tpot-ms", "-1"), "error: --slo-tpot-ms:"),
    (("--time-limit", "0"), "error: --time-limit:"),
])
@pytest.mark.parametrize("command", ["audit", "replay"])
def test_hostile_flags_exit_2_with_one_line(example, extra, start, command):
    if command == "audit":
        done = audit(example, *extra)
    else:
        done = cli("model.replay", "requests.jsonl", "--device-profile", "profile.toml", "--graphs", "gaudi.json",
                   *extra, cwd=example)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.startswith(start) and done.stderr.count("\n") == 1, done.stderr


def test_bad_graph_inputs_and_outputs_exit_2_and_write_nothing(example):
    (example / "keep").mkdir()
    old = (example / "gaudi.json").read_text()
    for extra, start in ((("--out", "gaudi.json"), "error: --out"),
                         (("--graphs-format", "list"), "error: --graphs-format"),
                         (("--graphs-format", "nxdi"), "error: --graphs-format"),
                         (("--shapes-format", "vllm-tpu"), "error: --shapes-format"),
                         (("--report", "rep", "--out", "requests.jsonl"), "error: --out")):
        done = audit(example, *extra)
        assert done.returncode == 2 and done.stderr.startswith(start) and done.stderr.count("\n") == 1, done.stderr
    assert (example / "gaudi.json").read_text() == old and not (example / "rep").exists()
    (example / "bad.json").write_text('{"prompt": [[1, 256]], "decode": [[2, "x"]]}')
    done = cli("model.audit", "--cost-model", "serving", "--device-profile", "profile.toml", "--shapes-from",
               "gaudi.json", "--graphs", "bad.json", "requests.jsonl", cwd=example)
    assert done.returncode == 2 and "bad.json" in done.stderr and done.stderr.count("\n") == 1, done.stderr


def test_past_the_time_limit_exits_4_and_writes_nothing(example):
    rows = "".join(json.dumps({"request_id": k, "prompt_len": 100, "gen_len": 3, "arrival_s": k * 1.0}) + "\n"
                   for k in range(3000))
    (example / "requests.jsonl").write_text(rows)
    done = audit(example, "--time-limit", "1e-9", "--out", "out", "--replicas", "auto", "--slo-ttft-ms", "100")
    assert done.returncode == 4 and "did not finish within --time-limit" in done.stderr, done.stderr
    assert not (example / "out").exists()


def test_only_cost_model_serving_takes_the_serving_audit():
    from model.audit import serving_mode

    assert serving_mode(["r.csv", "--cost-model", "serving"]) and serving_mode(["--cost-model=serving", "r"])
    assert not serving_mode(["r.csv", "--cost-model", "device"]) and not serving_mode(["r.csv", "--shapes-from", "x"])
    assert not serving_mode(["r.csv", "--graphs", "serving"])


def test_ctrl_c_in_the_capacity_search_exits_130_and_writes_nothing(example, monkeypatch):
    import os
    import signal

    from model.evaluation import capacity as capacity_module

    real = capacity_module.replay
    calls = []

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:  # mid-search: two counts replayed already
            os.kill(os.getpid(), signal.SIGINT)
        return real(*args, **kwargs)

    monkeypatch.setattr(capacity_module, "replay", interrupted)
    (example / "out").mkdir()
    (example / "out" / "audit.json").write_text("old\n")
    done = audit(example, "--replicas", "auto", "--slo-ttft-ms", "1", "--out", "out")
    assert done.returncode == 130 and "interrupted by SIGINT" in done.stderr, done.stderr
    assert (example / "out" / "audit.json").read_text() == "old\n"
    assert not (example / "out" / "today-graphs.json").exists()


@pytest.fixture
def bench(monkeypatch):
    """scripts/bench_serving_capacity.py imported fresh from scripts/ (not a package), undone after the test."""
    monkeypatch.syspath_prepend(str(REPO / "scripts"))
    monkeypatch.delitem(sys.modules, "bench_serving_capacity", raising=False)
    return importlib.import_module("bench_serving_capacity")


def test_the_benchmarks_exp_buckets_are_the_181_graphs_of_issue_20(tmp_path, bench):
    """The benchmark's today: vllm-gaudi exp at the targets' settings, counted by the stack's rules."""
    graphs = read_graph_set(bench.exp_config(tmp_path, 66144, 128), "gaudi-env", bench.SERVER).graphs
    assert (graphs.count, len(graphs.prompt), len(graphs.decode), graphs.unused) == (181, 61, 60, 60)
    assert read_graph_set(bench.exp_config(tmp_path, 66144, 1), "gaudi-env", bench.SERVER).graphs.count == 87


@pytest.mark.slow  # the conversation trace's capacity search: seconds
def test_the_conversation_trace_needs_six_exp_replicas_at_1x(tmp_path, bench):
    profile, _ = load_profile_file(REPO / "data" / "profiles" / "opt13b-a100-tp1.toml")
    graphs = read_graph_set(bench.exp_config(tmp_path, profile.kv_capacity_tokens, 128), "gaudi-env",
                            bench.SERVER).graphs
    trace = trace_of([load_requests(bench.TRACES["conv"], "conv", Columns.parse("azure"))])
    audit = serving_audit(trace, bench.SERVER, [("exp", "exp", graphs)], ServingCost(profile), None, (1.0,),
                          Slo(2000.0, 200.0), 1024, scan_below=16)
    (row,) = audit.sides[0].capacity
    assert row.replicas == 6 and row.proved and audit.replicas == 6
