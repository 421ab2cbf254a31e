"""``python -m model.replay`` end to end: outputs, flags, and every bad input as one line with exit 2."""

from __future__ import annotations

import json
import os
import signal
from fractions import Fraction
from pathlib import Path

import pytest
from helpers import cli
from replay_helpers import PROFILE_TOML, REQUESTS, write_example

import model.replay as replay_cli
from model.base.errors import InputError
from model.evaluation import replay_run


def run(folder: Path, *extra: str, graphs: str = "gaudi.json", requests: str = "requests.jsonl"):
    return cli("model.replay", requests, "--device-profile", "profile.toml", "--graphs", graphs, *extra, cwd=folder)


def jsonl(rows) -> str:
    return "".join(json.dumps({"request_id": i, "prompt_len": p, "gen_len": g, "arrival_s": a}) + "\n"
                   for i, p, g, a in rows)


@pytest.fixture
def example(tmp_path) -> Path:
    write_example(tmp_path)
    return tmp_path


def test_json_to_stdout_is_the_only_stdout(example):
    done = run(example, "--json", "-")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["steps"] == 12 and "busy" in done.stderr and "TTFT ms" in done.stderr


def test_the_text_names_every_number(example):
    done = run(example, "--slo-ttft-ms", "200", "--slo-tpot-ms", "50")
    assert done.returncode == 0, done.stderr
    for needle in ("steps             12", "10338.57248 device-ms", "device-hours", "p50 64.984", "p95 9715.23712",
                   "prompt 0.6202531646", "6 compiled before serving", "warm-up 60000 ms",
                   "run-time compiles 1", "step 5 at 167.73376 ms: decode graph (4, 96)", "goodput 42.86%"):
        assert needle in done.stdout, (needle, done.stdout)


def test_goodput_and_slo_quantile(example, tmp_path):
    out = tmp_path / "o.json"
    assert run(example, "--slo-ttft-ms", "200", "--slo-tpot-ms", "50", "--slo-quantile", "0.5", "--json",
               str(out)).returncode == 0
    slo = json.loads(out.read_text())["slo"]
    assert slo["goodput"] == pytest.approx(3 / 7)  # a, d (gen_len 1: TPOT holds) and g
    assert slo["ttft_at_quantile"] == pytest.approx(64.984) and slo["ttft_met"] is True
    assert slo["tpot_at_quantile"] == pytest.approx(44.75056) and slo["tpot_met"] is True


def test_rate_scale_compresses_the_arrivals(example):
    rows = [(i, p, g, a * 8) for i, p, g, a in REQUESTS]  # times 8 and back: exact in binary
    (example / "slow.jsonl").write_text(jsonl(rows))
    fast = json.loads(run(example, "--json", "-").stdout)
    scaled = json.loads(run(example, "--json", "-", "--rate-scale", "8", requests="slow.jsonl").stdout)
    assert scaled == fast


def test_replicas_deal_round_robin_and_each_warms_up(example):
    one = json.loads(run(example, "--json", "-").stdout)
    two = json.loads(run(example, "--json", "-", "--replicas", "2").stdout)
    assert two["replicas"] == 2 and two["requests"] == 7
    assert two["graphs"]["warmup_ms"] == 2 * one["graphs"]["warmup_ms"] == 120000
    assert two["ttft_ms"]["p95"] < one["ttft_ms"]["p95"]  # f no longer waits behind the compile


def test_outputs_are_written_together_and_never_over_an_input(example):
    old = b'{"old": true}\n'
    (example / "keep.json").write_bytes(old)
    (example / "afile").write_text("x")
    for extra, flag in ((("--json", "requests.jsonl"), "--json"), (("--json", "profile.toml"), "--json"),
                        (("--json", str(example)), "--json"),
                        (("--json", "keep.json", "--report", "afile"), "--report")):
        done = run(example, *extra)
        assert done.returncode == 2 and done.stderr.startswith(f"error: {flag}:"), done.stderr
        assert len(done.stderr.strip().splitlines()) == 1
    assert (example / "keep.json").read_bytes() == old
    assert (example / "requests.jsonl").read_text() == jsonl(REQUESTS)
    done = run(example, "--json", "keep.json", "--report", "pictures")
    assert done.returncode == 0, done.stderr
    assert json.loads((example / "keep.json").read_text())["steps"] == 12
    assert sorted(p.name for p in (example / "pictures").iterdir()) == ["latency.png", "timeline.png"]


BAD_REQUESTS = [
    ("no-times", '{"request_id": "a", "prompt_len": 5, "gen_len": 2}\n', None, "arrival_s", "no arrival times"),
    ("bad-time", jsonl(REQUESTS[:2]) + '{"request_id": "z", "prompt_len": 5, "gen_len": 2, "arrival_s": "soon"}\n',
     3, "arrival_s", "expected a time"),
    ("over-budget", jsonl(REQUESTS + [("h", 1025, 2, 1.0)]), 8, "prompt_len", "above max_num_batched_tokens 1024"),
    ("over-pool", jsonl(REQUESTS + [("h", 1000, 1100, 1.0)]), 8, "gen_len", "needs 17 KV blocks"),
]


@pytest.mark.parametrize("name,text,line,field,message", BAD_REQUESTS, ids=[b[0] for b in BAD_REQUESTS])
def test_bad_requests_name_file_line_and_field(example, name, text, line, field, message):
    (example / "bad.jsonl").write_text(text)
    done = run(example, requests="bad.jsonl")
    where = "bad.jsonl" if line is None else f"bad.jsonl:{line}"
    assert done.returncode == 2 and done.stderr.startswith(f"error: {where}: field '{field}':"), done.stderr
    assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_an_nxdi_request_beyond_the_largest_bucket(example):
    (example / "long.jsonl").write_text(jsonl(REQUESTS + [("h", 1000, 100, 1.0)]))
    done = run(example, "--stack", "nxdi", graphs="nxdi.json", requests="long.jsonl")
    assert done.returncode == 2 and done.stderr.startswith("error: long.jsonl:8: field 'gen_len':"), done.stderr
    assert "largest token-generation bucket 1024" in done.stderr


@pytest.mark.parametrize("extra,start", [
    (("--replicas", "0"), "error: --replicas:"),
    (("--rate-scale", "0"), "error: --rate-scale:"),
    (("--rate-scale", "nan"), "error: --rate-scale:"),
    # arrivals stretched past float64 ms: every TTFT was 0 (1e-300) and --json a ValueError traceback (1e-306)
    (("--rate-scale", "1e-306"), "error: --rate-scale: at 1e-306 the trace's 20 s of arrivals span inf s"),
    (("--rate-scale", "1e-8", "--json", "-"), "error: --rate-scale: at 1e-08 the trace's 20 s of arrivals span 2e+09 s"),
    (("--time-limit", "-1"), "error: --time-limit:"),
    (("--slo-quantile", "0.9"), "error: --slo-quantile: needs --slo-ttft-ms"),
    (("--slo-ttft-ms", "100", "--slo-quantile", "1.5"), "error: --slo-quantile: must be in (0, 1]"),
    (("--slo-tpot-ms", "-3"), "error: --slo-tpot-ms:"),
    (("--max-num-seqs", "0"), "error: --max-num-seqs:"),
    (("--stack", "tpu"), "error: --stack:"),
    (("--shapes-format", "list"), "error: --shapes-format: list compiles lengths"),
    (("--ctx-batch-size", "2"), "error: --ctx-batch-size:"),
])
def test_bad_flags_exit_2_with_one_line(example, extra, start):
    done = run(example, *extra)
    assert done.returncode == 2 and done.stderr.startswith(start), done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_bad_profiles_name_their_line(example):
    (example / "profile.toml").write_text(PROFILE_TOML.replace("max_num_seqs = 4", "max_num_seqs = 0"))
    done = run(example)
    assert done.returncode == 2 and done.stderr.startswith("error: profile.toml:9: field 'server.max_num_seqs':")
    (example / "profile.toml").write_text(PROFILE_TOML.split("[server]")[0])
    done = run(example)
    assert done.returncode == 2 and "field 'server.stack': missing" in done.stderr and "--stack" in done.stderr
    assert run(example, "--stack", "nxdi", "--max-num-seqs", "4", "--max-num-batched-tokens", "1024",
               graphs="nxdi.json").returncode == 0
    (example / "profile.toml").write_text(PROFILE_TOML.replace("kv_capacity_tokens = 2048\n", ""))
    done = run(example)
    assert done.returncode == 2 and "kv_capacity_tokens" in done.stderr


def test_prompt_graphs_over_the_token_budget_are_named_in_a_warning(example):
    (example / "big.json").write_text('{"prompt": [[1, 256], [1, 1024], [2, 1024]], "decode": [[4, 16]]}')
    done = run(example, graphs="big.json")
    assert done.returncode == 0 and "warning: 1 prompt graphs have B*S above" in done.stderr and "(2, 1024)" in \
        done.stderr


def test_ctrl_c_exits_130_and_writes_nothing(example, monkeypatch):
    (example / "keep.json").write_text("old\n")

    def interrupted(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)
        raise AssertionError("the signal should have stopped the replay")

    monkeypatch.setattr(replay_run, "replay", interrupted)  # model.replay imports it inside main()
    done = run(example, "--json", "keep.json", "--report", "pictures")
    assert done.returncode == 130 and "interrupted by SIGINT" in done.stderr
    assert (example / "keep.json").read_text() == "old\n" and not (example / "pictures").exists()


def test_a_replay_past_its_time_limit_exits_4_and_writes_nothing(example):
    rows = [(f"r{k}", 100, 3, k * 1.0) for k in range(3000)]  # three loop rounds a request: past the first tick
    (example / "many.jsonl").write_text(jsonl(rows))
    done = run(example, "--time-limit", "1e-9", "--json", "out.json", requests="many.jsonl")
    assert done.returncode == 4 and "did not finish within --time-limit" in done.stderr, done.stderr
    assert not (example / "out.json").exists()


def test_the_report_pictures_count_against_the_time_limit(example, monkeypatch):
    """Drawing the pictures takes as long as the replay (in the serving audit, 2/3 of the run) and was outside
    --time-limit: a run whose pictures end past it now exits 4 and writes nothing."""
    import time

    from model.report import serving_plots

    def slow(result, summary):
        time.sleep(0.4)
        return {name: b"png" for name in replay_cli.REPORT_FILES}

    monkeypatch.setattr(serving_plots, "report_files", slow)
    done = run(example, "--time-limit", "0.3", "--json", "out.json", "--report", "pictures")
    assert done.returncode == 4 and "did not finish within --time-limit 0.3 s" in done.stderr, done.stderr
    assert not (example / "out.json").exists() and not (example / "pictures").exists()


def test_a_trace_from_csv_with_a_named_time_column(example):
    (example / "t.csv").write_text("id,p,g,when\n" + "".join(f"{i},{p},{g},{a}\n" for i, p, g, a in REQUESTS))
    done = cli("model.replay", "t.csv", "--columns", "p,g,id", "--time-column", "when", "--device-profile",
               "profile.toml", "--graphs", "gaudi.json", "--json", "-", cwd=example)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["busy_ms"] == pytest.approx(10338.57248, rel=1e-9)


def test_the_slo_quantile_is_exact():
    assert replay_cli.parse_slo(replay_cli.parser().parse_args(
        ["r", "--device-profile", "p", "--graphs", "g", "--slo-ttft-ms", "1", "--slo-quantile", "0.999"])).quantile \
        == Fraction(999, 1000)


@pytest.mark.parametrize("extra, message", [
    # int() refuses 4,300 digits and more: a ValueError traceback, and the flag's text in full on one line
    (("--replicas", "9" * 5000), "--replicas: must be an integer from 1 to 65536 or 'auto', got '9999"),
    (("--max-num-seqs", "9" * 5000), "--max-num-seqs: expected an integer of at most 4000 digits, got '9999"),
    # Fraction("1e-99999999") computes 10**99999999: the run never ended
    (("--slo-ttft-ms", "1", "--slo-quantile", "1e-99999999"), "--slo-quantile: must be in (0, 1], got '1e-99999999'"),
    (("--slo-ttft-ms", "1", "--slo-quantile", "0." + "9" * 5000), "--slo-quantile: expected at most 100 characters"),
])
def test_hostile_numbers_in_flags_are_one_short_line(extra, message):
    with pytest.raises(InputError) as caught:
        replay_cli.parse_capacity(replay_cli.parser().parse_args(["r", "--device-profile", "p", "--graphs", "g",
                                                                  *extra]))
    assert str(caught.value).startswith(message) and len(str(caught.value)) < 200


def test_the_command_lines_spell_the_shared_names_as_their_modules_do():
    """model.replay and model.calibrate name the [server] keys, graph formats and report files without importing
    their modules before run_main (see model.cli_common): the copies must agree."""
    from model import calibrate
    from model.domain.server import SERVER_KEYS
    from model.report.serving_plots import REPORT_FILES
    from model.serving.replay_graphs import GRAPH_FORMATS

    assert replay_cli.SERVER_KEYS == calibrate.SERVER_KEYS == SERVER_KEYS
    assert (replay_cli.GRAPH_FORMATS, replay_cli.REPORT_FILES) == (GRAPH_FORMATS, REPORT_FILES)


def test_the_serving_example_of_the_readme_runs(tmp_path):
    """data/examples/serving: the gaudi bucket file under its profile's [server] table, as README shows it."""
    example = Path(__file__).resolve().parents[1] / "data" / "examples" / "serving"
    done = cli("model.replay", str(example / "trace.csv"), "--device-profile", str(example / "profile.toml"),
               "--graphs", str(example / "gaudi-buckets.txt"), "--shapes-format", "gaudi-file", "--replicas", "4",
               "--slo-ttft-ms", "2000", "--slo-tpot-ms", "100", "--json", "-", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert (doc["requests"], doc["graphs"]["count"], doc["runtime_compiles"]["count"]) == (2000, 48, 0)
    assert "warning" not in done.stderr  # the file's "# setting:" lines agree with the profile's [server] table
    nxdi = cli("model.replay", str(example / "trace.csv"), "--device-profile", str(example / "profile.toml"),
               "--graphs", str(example / "nxdi.json"), "--shapes-format", "nxdi", "--stack", "nxdi", "--max-num-seqs",
               "32", cwd=tmp_path)
    assert nxdi.returncode == 2 and "32 disagrees with tkg_batch_size (batch_size) 64" in nxdi.stderr


def test_graphs_the_stack_drops_are_named(example):
    (example / "b.txt").write_text("([1, 2], [256, 1024], 0)\n(4, 1, [8, 12])\n")
    done = run(example, "--shapes-format", "gaudi-file", "--server-settings", "max_model_len=2048",
               "--max-prefill-seqs", "1", graphs="b.txt")
    assert done.returncode == 0, done.stderr
    assert "warning: b.txt: the stack drops prompt (2, 256, 0): batch 2 over VLLM_PROMPT_BS_BUCKET_MAX 1" in done.stderr
