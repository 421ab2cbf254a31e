"""The command lines as a new user meets them: one-line usage errors with "did you mean", --version, the program
named as invoked, help and an example for every flag, hints on the inputs people get wrong, and one --time-limit
for the whole run.  All in process and on a frozen fake clock: no subprocess, no sleeping, no timing asserts."""

from __future__ import annotations

import argparse
import importlib
import json
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import FakeClock, bucket, problem
from sweep_helpers import tiny_problem

from model import pipeline
from model.base.errors import InputError, closest, unknown_name
from model.base.numbers import counted
from model.base.runtime import MIN_RUN_S, Deadline, RunBudget, running_text
from model.cli_common import program_name, run_main
from model.load.requests import column_guess, load_requests
from model.serving.formats import read_shapes
from model.serving.sniff import looks_like

COMMANDS = ("solve", "evaluate", "sweep", "calibrate", "export", "audit", "replay")
# a misspelt flag of each command and the flag it should be taken for
TYPOS = {"solve": ("--limt-shapes", "--limit-shapes"), "evaluate": ("--limt-shapes", "--limit-shapes"),
         "sweep": ("--tolerence", "--tolerance"), "calibrate": ("--complie-ms", "--compile-ms"),
         "export": ("--formt", "--format"), "audit": ("--shapes-frm", "--shapes-from"),
         "replay": ("--replcas", "--replicas")}


def command(name: str):
    return importlib.import_module(f"model.{name}")


def parser_of(name: str) -> argparse.ArgumentParser:
    mod = command(name)
    return (getattr(mod, "build_parser", None) or mod.parser)()


def run(name: str, argv: list[str], capsys) -> tuple[int, str, str]:
    """A command's main in this process: exit status, stdout, stderr."""
    code = 0
    try:
        run_main(lambda: command(name).main(argv))
    except SystemExit as stop:
        code = stop.code
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("name", COMMANDS)
def test_a_misspelt_flag_is_one_line_naming_the_flag_meant(name, capsys):
    typo, meant = TYPOS[name]
    code, out, err = run(name, [typo, "3"], capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "usage:" not in err, err
    assert f"unknown flag {typo}; did you mean {meant}?" in err and "--help" in err


@pytest.mark.parametrize("name", COMMANDS)
def test_version_comes_from_the_package_metadata(name, capsys):
    from importlib.metadata import version

    code, out, _ = run(name, ["--version"], capsys)
    assert code == 0 and out.strip().endswith(version("shapeplan"))


@pytest.mark.parametrize("name", COMMANDS)
def test_the_console_script_is_named_as_invoked(name, capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", [f"/somewhere/.venv/bin/shapeplan-{name}", "--no-such-flag"])
    with pytest.raises(SystemExit) as stop:
        command(name).entry()
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.startswith(f"shapeplan-{name}: error: unknown flag --no-such-flag")
    monkeypatch.setattr(sys, "argv", [f"/somewhere/.venv/bin/shapeplan-{name}", "--help"])
    with pytest.raises(SystemExit):
        command(name).entry()
    text = capsys.readouterr().out
    assert text.startswith(f"usage: shapeplan-{name} ") and "python -m model." not in text
    examples = text.split("examples:\n", 1)[1].split("\n\n")[0].splitlines()
    assert sum(line.lstrip().startswith(f"shapeplan-{name} ") for line in examples) >= 2, examples


def test_run_as_a_module_the_program_is_python_m():
    assert program_name("model.solve", "/repo/model/solve.py") == "python -m model.solve"
    assert program_name("model.solve", "/x/bin/shapeplan-solve") == "shapeplan-solve"
    assert program_name("model.solve", "/x/bin/shapeplan-sweep") == "python -m model.solve"


@pytest.mark.parametrize("name", COMMANDS)
def test_every_flag_has_help_and_an_example(name):
    for action in parser_of(name)._actions:
        if isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
            continue
        label = action.option_strings[0] if action.option_strings else action.dest
        assert action.help, f"{name} {label}: no help"
        assert action.nargs == 0 or "e.g." in action.help, f"{name} {label}: no example in {action.help!r}"


def test_a_misspelt_choice_names_the_closest(capsys):
    code, _, err = run("solve", ["--cost-model", "devce"], capsys)
    assert code == 2 and err.count("\n") == 1
    assert "invalid choice 'devce'; did you mean 'device'?" in err
    code, _, err = run("sweep", ["--sweep-limit", "max_pad_ratoi"], capsys)
    assert code == 2 and "did you mean 'max_pad_ratio'?" in err


def test_names_checked_after_parsing_say_did_you_mean_too(tmp_path, capsys):
    code, _, err = run("export", ["--plans", str(tmp_path), "--format", "nxid", "--out", str(tmp_path / "x")], capsys)
    assert code == 2 and "unknown format 'nxid'; did you mean 'nxdi'?" in err
    assert "did you mean 'greedy'?" in unknown_name("solver", "greedi", pipeline.solver_names())
    assert closest("zzzz", ["highs", "cpsat"]) is None  # nothing close: no wild guess


def test_a_missing_required_flag_does_not_hide_the_typo(capsys):
    code, _, err = run("audit", ["r.jsonl", "--shapes-frm", "x.txt"], capsys)
    assert code == 2 and "did you mean --shapes-from?" in err and "required" not in err


# ---------------------------------------------------------------- hints on inputs (issue 23, item 6)

def test_a_csv_without_the_default_columns_names_its_columns_and_the_flag(tmp_path):
    path = tmp_path / "r.csv"
    path.write_text("rid,input_len,output_len\n1,100,20\n")
    with pytest.raises(InputError) as exc:
        load_requests(path)
    text = str(exc.value)
    assert text.startswith(f"{path}:1: field 'request_id': no such column (the file has: rid, input_len, output_len)")
    assert "--columns input_len,output_len,rid" in text
    assert len(load_requests(path, columns=load_columns("input_len,output_len,rid"))) == 1  # the example works


def load_columns(spec: str):
    from model.load.requests import Columns

    return Columns.parse(spec)


def test_parquet_and_jsonl_name_their_columns_too(tmp_path):
    pq.write_table(pa.table({"id": ["a"], "p": [10], "g": [3]}), tmp_path / "r.parquet")
    with pytest.raises(InputError, match=r"no such column \(the file has: id, p, g\).*--columns p,g,id"):
        load_requests(tmp_path / "r.parquet")
    (tmp_path / "r.jsonl").write_text(json.dumps({"id": "a", "tokens_in": 10, "tokens_out": 3}) + "\n")
    with pytest.raises(InputError, match=r"no such key in any line .*--columns tokens_in,tokens_out,id"):
        load_requests(tmp_path / "r.jsonl")


def test_column_guess_reads_what_the_names_say():
    assert column_guess(["id", "p", "g"]) == "p,g,id"
    assert column_guess(["output_tokens", "input_tokens"]) == "input_tokens,output_tokens"
    assert column_guess(["x"]) == "input_tokens,output_tokens,id"


def test_a_folder_given_as_requests_says_so(tmp_path):
    with pytest.raises(InputError, match="is a folder, not a request file; name the files in it"):
        load_requests(tmp_path)


NXDI = json.dumps({"neuron_config": {"batch_size": 4, "context_encoding_buckets": [512, 1024]}})


@pytest.mark.parametrize("text, fmt", [
    (NXDI, "nxdi"),
    (json.dumps({"neuron_config": {"num_batched_tokens_buckets": [512]}}), "vllm-neuron"),
    (json.dumps({"prompt": [[1, 128]], "decode": [[1, 2]]}), "json"),
    ("# a comment\nVLLM_PROMPT_BS_BUCKET_MAX=4\n", "gaudi-env"),
    ("MIN_TOKEN_BUCKET=16\nMAX_NUM_BATCHED_TOKENS=512\n", "vllm-tpu"),
    ("(1, 128, 0)\n(1, 1, 4)\n", "gaudi-file"),
    ("128\n256\n", None),
    ("{not json", None),
])
def test_the_content_suggests_the_format(text, fmt):
    assert looks_like(text) == fmt


def test_shapes_from_a_json_file_without_its_format_suggests_it(tmp_path):
    from model.deploy.flags import import_config

    path = tmp_path / "neuron.json"
    path.write_text(NXDI)
    with pytest.raises(InputError) as exc:
        import_config(path, None)
    assert "(read as list, the default; the file looks like nxdi: --shapes-format nxdi)" in str(exc.value)
    assert str(exc.value).count("\n") == 0
    assert import_config(path, "nxdi").shapes  # the suggestion reads it


LIN_VALUES = ("VLLM_PROMPT_BS_BUCKET_MIN=1\nVLLM_PROMPT_BS_BUCKET_STEP=1\nVLLM_PROMPT_BS_BUCKET_MAX=4\n"
              "VLLM_PROMPT_SEQ_BUCKET_MIN=128\nVLLM_PROMPT_SEQ_BUCKET_STEP=128\nVLLM_PROMPT_SEQ_BUCKET_MAX=1024\n"
              "VLLM_DECODE_BS_BUCKET_MAX=8\nMAX_NUM_BATCHED_TOKENS=4096\n")


def test_a_gaudi_env_with_lin_values_and_no_strategy_says_which_line_is_missing(tmp_path):
    path = tmp_path / "g.env"
    path.write_text(LIN_VALUES)
    with pytest.raises(InputError) as exc:
        read_shapes(path, "gaudi-env")
    text = str(exc.value)
    assert "max_model_len" in text  # what exp needs, as before ...
    assert "no VLLM_BUCKETING_STRATEGY is set" in text and "add VLLM_BUCKETING_STRATEGY=lin" in text  # ... and why
    path.write_text(LIN_VALUES + "VLLM_BUCKETING_STRATEGY=lin\nMAX_MODEL_LEN=2048\n")
    assert read_shapes(path, "gaudi-env").shapes[-1] == 1024


def test_evaluate_says_it_judges_by_the_reference_model_when_none_is_given(tmp_path, capsys):
    reqs = tmp_path / "r.jsonl"
    reqs.write_text("".join(json.dumps({"request_id": f"q{i}", "prompt_len": p, "gen_len": 5}) + "\n"
                            for i, p in enumerate((100, 300, 60))))
    code, _, _ = run("solve", [str(reqs), "--solver", "dpfill", "--out", str(tmp_path / "out"), "--quiet"], capsys)
    assert code == 0
    plan = tmp_path / "out" / "plan_r.jsonl"
    code, out, _ = run("evaluate", [str(reqs), str(plan)], capsys)
    assert code == 0 and "note: judged by the reference cost model (no --cost-model or --device-profile given)" in out
    code, out, _ = run("evaluate", [str(reqs), str(plan), "--cost-model", "reference"], capsys)
    assert code == 0 and "judged by" not in out


# ---------------------------------------------------------------- one --time-limit for the whole run

def test_the_budget_shares_what_is_left_among_the_runs_to_come(monkeypatch):
    clock = FakeClock(monkeypatch, frozen=True)
    budget = RunBudget(Deadline.after(12.0), 3)
    assert budget.next_limit() == pytest.approx(4.0)
    clock.jump(1.0)  # the first run ended early: its time goes to the next ones
    assert budget.next_limit() == pytest.approx(5.5)
    assert budget.next_limit(mip=False) == pytest.approx(11.0)  # a packer may use what is left, and counts nothing
    clock.jump(5.5)
    assert budget.next_limit() == pytest.approx(5.5)
    clock.jump(10.0)
    assert budget.next_limit() == MIN_RUN_S  # past the deadline: a positive limit that returns at once


def uses_its_whole_limit(clock, granted):
    """pipeline.run as a MIP that takes all the time it is given, with a real (packer) plan at once."""
    real = pipeline.run

    def fake(prob, solver="mip", backend="highs", time_limit=60.0):
        granted.append((solver, time_limit))
        if solver == pipeline.MIP:
            clock.jump(time_limit)
        return real(prob, "dpfill")

    return fake


def test_a_sweep_keeps_every_mip_within_one_time_limit(monkeypatch):
    from model.sweeping import runner
    from model.sweeping.grid import sweep_points

    clock = FakeClock(monkeypatch, frozen=True)
    granted: list[tuple[str, float]] = []
    monkeypatch.setattr(runner.pipeline, "run", uses_its_whole_limit(clock, granted))
    points = sweep_points((1, 2, 3, 4), "", (1.0,))
    start = clock.now()
    runner.run_sweep(tiny_problem(), points, ("mip", "greedy"), time_limit=20.0,
                     budget=RunBudget(Deadline.after(8.0), len(points)))
    mips = [t for s, t in granted if s == pipeline.MIP]
    assert len(mips) == 4 and mips == pytest.approx([2.0, 2.0, 2.0, 2.0])  # not 20 s each
    assert clock.now() - start <= 8.0 * (1 + 1e-9)


def test_an_audit_shares_its_time_limit(monkeypatch):
    from model.deploy import auditing, holdout

    clock = FakeClock(monkeypatch, frozen=True)
    granted: list[tuple[str, float]] = []
    fake = uses_its_whole_limit(clock, granted)
    monkeypatch.setattr(auditing.pipeline, "run", fake)
    monkeypatch.setattr(holdout.pipeline, "run", fake)
    prob = problem(bucket([64, 130, 200, 260, 64, 300, 140, 70] * 3, [5, 9, 3, 7, 2, 8, 4, 6] * 3), k=2)
    start = clock.now()
    auditing.audit(prob, (128, 320), time_limit=6.0)
    assert [t for _, t in granted] == pytest.approx([3.0, 3.0]) and clock.now() - start <= 6.0 * (1 + 1e-9)
    granted.clear()
    start = clock.now()
    auditing.audit(prob, (128, 320), time_limit=8.0, holdout_fraction=0.3)
    mips = [t for s, t in granted if s == pipeline.MIP]
    assert len(mips) == 4 and clock.now() - start <= 8.0 * (1 + 1e-9), granted


def test_the_sweep_counts_every_mip_run_of_the_whole_run():
    from model.sweep import sweep_budget

    assert sweep_budget(100.0, 16, ("mip", "greedy"), 0).mip_runs_left == 16
    assert sweep_budget(100.0, 16, ("mip",), 16).mip_runs_left == 48  # two MIP runs per hold-out check
    assert sweep_budget(100.0, 16, ("greedy",), 16).mip_runs_left == 0


def test_progress_says_elapsed_of_the_limit_and_never_inf():
    assert running_text(12.2, 60.0, 20.4) == "still running (12 s of 60 s, about 20 s to go)"
    assert running_text(7.0) == "still running (7 s)"
    assert Deadline.never().left_text() == ""
    assert "inf" not in running_text(3.0, float("inf"), float("inf"))


def test_counts_agree_with_their_nouns():
    assert counted(1, "bucket") == "1 bucket" and counted(2, "bucket") == "2 buckets"
    assert counted(1, "batch", "batches") == "1 batch" and counted(0, "batch", "batches") == "0 batches"
    assert counted(int(np.int64(1)), "shape") == "1 shape"


def test_evaluate_has_one_time_limit_for_the_whole_run(tmp_path, capsys, monkeypatch):
    """model.evaluate --time-limit: a run past it exits 4 and writes no --json file; within it, judged as before.
    The clock is frozen past the deadline after loading (no sleeping, no host-speed dependence)."""
    import model.evaluate as evaluate_cli

    (tmp_path / "r.jsonl").write_text('{"request_id": "a", "prompt_len": 100, "gen_len": 5}\n')
    (tmp_path / "p.jsonl").write_text('{"request_id": "a", "batch_id": "b0", "shape": {"seq_align": 128, "heads_align": 32, "hidden_align": 4096}}\n')
    monkeypatch.chdir(tmp_path)
    argv = ["r.jsonl", "p.jsonl", "--cost-model", "strict", "--json", "e.json"]
    assert run("evaluate", [*argv, "--time-limit", "600"], capsys)[0] == 0 and (tmp_path / "e.json").exists()
    (tmp_path / "e.json").unlink()
    clock = FakeClock(monkeypatch, frozen=True)
    real_run = evaluate_cli.evaluate_in_memory

    def late(args, sink, tick):
        clock.offset += 601.0  # the loading "took" past the limit: the next tick must stop the run
        return real_run(args, sink, tick)

    monkeypatch.setattr(evaluate_cli, "evaluate_in_memory", late)
    code, _, err = run("evaluate", [*argv, "--time-limit", "600"], capsys)
    assert code == 4 and "did not finish within --time-limit 600 s; nothing written" in err
    assert not (tmp_path / "e.json").exists()


@pytest.mark.parametrize("name, argv", [
    ("evaluate", ["r.jsonl", "p.jsonl", "--json", "made/"]),
    ("calibrate", ["m.csv", "--out", "made/"]),
    ("export", ["--plans", ".", "--format", "list", "--out", "made/"]),
])
def test_a_file_output_ending_in_a_separator_is_refused_not_made_a_file(name, argv, tmp_path, capsys, monkeypatch):
    """``Path("made/")`` is ``made``: the file would be written under the name the user meant as a folder."""
    monkeypatch.chdir(tmp_path)
    code, _, err = run(name, argv, capsys)
    assert code == 2 and "made/ ends with a separator, so it names a folder" in err and err.count("\n") == 1
    assert not (tmp_path / "made").exists()
