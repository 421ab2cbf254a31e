"""The deployment flags end to end: ``--shapes``, ``--shapes-from``, ``--holdout`` on solve, sweep and evaluate,
and ``python -m model.audit`` -- the command lines run in process (``helpers.cli``: exit status, stdout and
stderr as a user sees them), the many hostile values each exiting 2 with one line naming the flag, file or line."""

from __future__ import annotations

import csv
import os
from pathlib import Path

import numpy as np
import pytest
from helpers import REPO, cli

from model import audit, evaluate, solve, sweep
from model.cli_common import run_main
from model.cost.device import device_hours
from model.deploy.auditing import audit as audit_problem
from model.deploy.present import audit_blocks
from model.load.plans import read_plan
from model.load.profile import load_profile
from model.pipeline import InputSpec, load_problem
from model.report.document import to_text

pytestmark = pytest.mark.filterwarnings("ignore:.*PuLP 4.0:DeprecationWarning")

N = 40



@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """An Azure-style trace (TIMESTAMP, ContextTokens, GeneratedTokens) and three shape configs."""
    d = tmp_path_factory.mktemp("deploy")
    rng = np.random.default_rng(7)
    prompts = rng.integers(1, 1000, N)
    prompts[5] = 1000  # the longest: aligned 1024, on line 7
    gens = rng.integers(1, 100, N)
    with (d / "trace.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["TIMESTAMP", "ContextTokens", "GeneratedTokens"])
        for i, (p, g) in enumerate(zip(prompts, gens, strict=True)):
            w.writerow([f"2024-01-01 00:{i // 60:02d}:{i % 60:02d}.5", int(p), int(g)])
    (d / "today.txt").write_text("# what the server compiles today\n128\n256\n512\n1024\n")
    (d / "small.txt").write_text("128, 256\n")
    (d / "odd.txt").write_text("100\n1000\n")
    return d


def exit_code(main, argv: list[str], capsys) -> tuple[int, str]:
    with pytest.raises(SystemExit) as stop:
        run_main(lambda: main(argv))
    return stop.value.code, capsys.readouterr().err


# -- audit --------------------------------------------------------------------------------------------

@pytest.mark.slow  # 2-7 s each on 2 cores: the default run's 90 s budget; cheaper siblings cover it by default
def test_audit_prints_both_sides_and_writes_the_report(folder, tmp_path):
    rep = tmp_path / "rep"
    done = cli("model.audit", str(folder / "trace.csv"), "--columns", "azure", "--cost-model", "strict",
               "--shapes-from", str(folder / "today.txt"), "--time-limit", "2", "--report", str(rep), "--quiet",
               cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "today's shapes" in out and "optimised shapes" in out and "saving (today - optimised)" in out
    assert "at most K = 4 shapes on both sides" in out  # K = the config's size
    for name in ("report.md", "report.html", "heatmap.png"):
        assert (rep / name).stat().st_size > 0
    md = (rep / "report.md").read_text()
    assert "128 256 512 1024" in md and "![" in md
    assert "data:image/png;base64," in (rep / "report.html").read_text()


def test_audit_with_a_holdout_judges_both_sides_on_the_held_out_part(folder, tmp_path):
    done = cli("model.audit", str(folder / "trace.csv"), "--columns", "azure", "--shapes-from",
               str(folder / "today.txt"), "--holdout", "0.3", "--limit-shapes", "3", "--time-limit", "2", "--quiet",
               cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "shapes chosen on the first part" in done.stdout
    assert "by arrival time held out: shapes chosen on 28 requests, checked on 12" in done.stdout
    assert "Out of sample" in done.stdout and "at most K = 3" in done.stdout


def test_audit_config_too_small_names_the_request_and_writes_nothing(folder, tmp_path):
    rep = tmp_path / "rep"
    done = cli("model.audit", str(folder / "trace.csv"), "--columns", "azure", "--shapes-from",
               str(folder / "small.txt"), "--report", str(rep), cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.startswith(f"error: {folder / 'trace.csv'}:")
    assert "field 'prompt_len'" in done.stderr and "does not fit the largest allowed shape 256" in done.stderr
    assert not rep.exists()


def test_audit_report_is_all_or_nothing(folder, tmp_path, capsys, monkeypatch):
    rep = tmp_path / "rep"
    (rep / "report.html").mkdir(parents=True)  # a folder where a file must go: refused before any work
    argv = [str(folder / "trace.csv"), "--columns", "azure", "--shapes-from", str(folder / "today.txt"), "--solver",
            "greedy", "--report", str(rep), "--quiet"]
    code, err = exit_code(audit.main, argv, capsys)
    assert (code, err) == (2, f"error: --report: {rep / 'report.html'} is a folder; --report writes report.html "
                              "there\n")
    assert sorted(p.name for p in rep.iterdir()) == ["report.html"]
    (rep / "report.html").rmdir()
    (rep / "report.md").write_text("old report\n")
    real = os.replace

    def failing(src, dst):  # the second rename fails: the first file goes back as it was
        if Path(dst).name == "report.html":
            raise OSError(28, "No space left on device")
        real(src, dst)

    monkeypatch.setattr(os, "replace", failing)
    code, err = exit_code(audit.main, argv, capsys)
    assert (code, err) == (2, f"error: {rep / 'report.html'}: cannot write: No space left on device\n")
    assert sorted(p.name for p in rep.iterdir()) == ["report.md"] and (rep / "report.md").read_text() == "old report\n"


def test_audit_shows_device_hours_in_device_mode(folder):
    prob, _ = load_problem(InputSpec(files=(folder / "trace.csv",), columns="azure"))
    result = audit_problem(prob, (128, 256, 512, 1024), solver="greedy")
    assert "device-hours" not in to_text(audit_blocks(result, "t", "c"))
    assert result.saving == pytest.approx(result.sides[0].cost - result.sides[1].cost)
    device, _ = load_problem(InputSpec(files=(folder / "trace.csv",), columns="azure", mode="device",
                                       device=load_profile(REPO / "data" / "profiles" / "opt13b-a100-tp1.toml")))
    result = audit_problem(device, (128, 256, 512, 1024), solver="dpfill")
    text = to_text(audit_blocks(result, "t", "c"))
    assert "device-hours" in text
    today, optimised = result.sides
    assert set(today.shapes) <= {128, 256, 512, 1024} and today.n_shapes <= 4 and optimised.n_shapes <= 4
    hours = f"{abs(float(device_hours(result.saving))):.4g} device-hours"  # "would save" or "would cost" it
    assert hours in text


# -- solve, evaluate and sweep ------------------------------------------------------------------------

@pytest.mark.slow  # tests/test_holdout.py plans the held-out part three ways by default
def test_solve_holdout_checks_and_writes_nothing(folder, tmp_path):
    done = cli("model.solve", str(folder / "trace.csv"), "--columns", "azure", "--cost-model", "strict",
               "--limit-shapes", "3", "--holdout", "0.3", "--time-limit", "2", "--out", "out", "--quiet",
               cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "Out of sample (K = 3)" in done.stdout and "pow2 rule" in done.stdout
    assert "no plans written" in done.stdout and not (tmp_path / "out").exists()


def test_solve_with_imported_shapes_warns_and_plans_inside_them(folder, tmp_path):
    done = cli("model.solve", str(folder / "trace.csv"), "--columns", "azure", "--shapes-from",
               str(folder / "odd.txt"), "--time-limit", "2", "--out", "out", "--quiet", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "lengths that are not multiples of 64 rounded up: 100 -> 128, 1000 -> 1024" in done.stderr
    plan = read_plan(tmp_path / "out" / "plan_trace.jsonl")
    assert set(plan.seq_align.tolist()) <= {128, 1024}
    judged = cli("model.evaluate", str(folder / "trace.csv"), str(tmp_path / "out" / "plan_trace.jsonl"),
                 "--columns", "azure", "--shapes", "128,1024", cwd=tmp_path)
    assert judged.returncode == 0, judged.stdout
    outside = cli("model.evaluate", str(folder / "trace.csv"), str(tmp_path / "out" / "plan_trace.jsonl"),
                  "--columns", "azure", "--shapes", "2048", cwd=tmp_path)
    assert outside.returncode == 1 and "allowed-shapes" in outside.stdout


@pytest.mark.slow
def test_sweep_with_shapes_and_holdout(folder, tmp_path):
    done = cli("model.sweep", str(folder / "trace.csv"), "--columns", "azure", "--shapes", "128,256,512,1024,2048",
               "--k", "1-2", "--solvers", "mip,pow2", "--time-limit", "5", "--holdout", "0.25", "--report", "rep",
               "--quiet", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "the sweep runs on the first part" in done.stdout
    rows = list(csv.DictReader((tmp_path / "rep" / "sweep.csv").open()))
    assert {r["planner"] for r in rows} == {"mip", "pow2"}
    assert all(set(map(int, r["shapes"].split())) <= {128, 256, 512, 1024, 2048} for r in rows if r["shapes"])
    assert sum(1 for _ in rows) == 4  # two K, two planners, one bucket: the first part only
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "Out of sample, per shape cap" in md and "last 25% of each bucket by arrival time" in md


# -- hostile values: one line, exit 2 ------------------------------------------------------------------

MAINS = {"solve": solve.main, "sweep": sweep.main, "audit": audit.main}


def base_args(folder: Path, cli: str) -> list[str]:
    args = [str(folder / "trace.csv"), "--columns", "azure", "--quiet"]
    return args + (["--shapes-from", str(folder / "today.txt")] if cli == "audit" else [])


@pytest.mark.parametrize("cli", list(MAINS))
@pytest.mark.parametrize("value", ["0", "1", "-1", "nan", "abc", "inf", ""])
def test_bad_holdout_exits_2(folder, capsys, cli, value):
    code, err = exit_code(MAINS[cli], [*base_args(folder, cli), "--holdout", value], capsys)
    assert code == 2 and err.startswith("error: --holdout: ") and err.count("\n") == 1


@pytest.mark.parametrize("cli", ["solve", "sweep"])
@pytest.mark.parametrize("value", ["", "0", "65", "abc", "64,,128", "-128", "128;256"])
def test_bad_shapes_exit_2(folder, capsys, cli, value):
    code, err = exit_code(MAINS[cli], [*base_args(folder, cli), "--shapes", value], capsys)
    assert code == 2 and err.startswith("error: --shapes: ") and err.count("\n") == 1


@pytest.mark.parametrize("cli", list(MAINS))
def test_a_shapes_file_that_does_not_exist_exits_2(folder, capsys, cli):
    argv = [str(folder / "trace.csv"), "--columns", "azure", "--shapes-from", str(folder / "nope.txt")]
    code, err = exit_code(MAINS[cli], argv, capsys)
    assert code == 2 and err.startswith(f"error: {folder / 'nope.txt'}: cannot read")


@pytest.mark.parametrize("cli", ["solve", "sweep"])
def test_a_set_too_small_for_the_longest_prompt_exits_2(folder, capsys, cli):
    code, err = exit_code(MAINS[cli], [*base_args(folder, cli), "--shapes", "64,512"], capsys)
    assert code == 2
    assert err.startswith(f"error: {folder / 'trace.csv'}:") and "does not fit the largest allowed shape 512" in err


def test_conflicting_shape_flags_exit_2(folder, capsys):
    code, err = exit_code(solve.main, [*base_args(folder, "solve"), "--shapes", "1024", "--shapes-from",
                                       str(folder / "today.txt")], capsys)
    assert code == 2 and "not both" in err
    code, err = exit_code(evaluate.main, [str(folder / "trace.csv"), "plan.jsonl", "--shapes-format", "nxdi"], capsys)
    assert code == 2 and err.startswith("error: --shapes-format: needs --shapes-from")


def test_time_column_errors_exit_2(folder, tmp_path, capsys):
    f = tmp_path / "r.csv"
    f.write_text("request_id,prompt_len,gen_len,arrived\na,10,5,3\nb,20,6,soon\n")
    code, err = exit_code(solve.main, [str(f), "--time-column", "arrived", "--holdout", "0.5", "--quiet"], capsys)
    assert code == 2 and err.startswith(f"error: {f}:3: field 'arrived': expected a time")
    code, err = exit_code(solve.main, [str(f), "--time-column", "when", "--quiet"], capsys)
    assert code == 2 and err.startswith(f"error: {f}:2: field 'when': missing")
