"""Input hardening beyond the one-line error table: all-zero coefficients plan, interrupts end cleanly,
the sweep validates before it works, and K is capped at what the input can use.

Everything runs in-process through ``run_main`` (what ``python -m`` calls), on inputs of a few requests.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from model import evaluate, solve, sweep
from model.cli_common import run_main
from model.cost.analytic import CostParams
from model.sweeping.runner import gap_of

GOOD = ('{"request_id": "a", "prompt_len": 10, "gen_len": 5}\n'
        '{"request_id": "b", "prompt_len": 100, "gen_len": 7}\n'
        '{"request_id": "c", "prompt_len": 300, "gen_len": 9}\n')
ZERO = "".join(f"{name} = 0\n" for name in CostParams.__dataclass_fields__ if name != "hidden")


def exit_of(main, argv: list[str], capsys) -> tuple[int, str, str]:
    """Exit status, stdout and stderr of an entry point run as ``python -m`` runs it."""
    with pytest.raises(SystemExit) as stop:
        run_main(lambda: main(argv))
    out, err = capsys.readouterr()
    return stop.value.code, out, err


@pytest.fixture
def inputs(tmp_path: Path, monkeypatch) -> Path:
    (tmp_path / "req.jsonl").write_text(GOOD)
    (tmp_path / "zero.toml").write_text(ZERO)
    monkeypatch.chdir(tmp_path)
    return tmp_path


# -------------------------------------------------------------- all-zero coefficients: every plan costs 0


@pytest.mark.parametrize("solver", ["mip", "greedy"])
def test_all_zero_coefficients_plan_at_cost_zero(inputs: Path, capsys, solver: str):
    status, out, err = exit_of(solve.main, ["req.jsonl", "--cost-params", "zero.toml", "--solver", solver,
                                            "--out", "out", "--quiet"], capsys)
    assert (status, err) == (0, ""), out
    assert "total: cost 0" in out and (inputs / "out" / "plan_req.jsonl").is_file()
    status, out, err = exit_of(evaluate.main, ["req.jsonl", "out/plan_req.jsonl", "--cost-params", "zero.toml"], capsys)
    assert (status, err) == (0, "")


def test_all_zero_coefficients_sweep_and_report(inputs: Path, capsys):
    status, out, err = exit_of(sweep.main, ["req.jsonl", "--cost-params", "zero.toml", "--k", "1-2", "--solvers",
                                            "mip,greedy", "--report", "rep", "--quiet"], capsys)
    assert (status, err) == (0, ""), out
    assert "gap 0.00%" in out and (inputs / "rep" / "report.html").is_file()


def test_gap_of_zero_cost():
    assert gap_of(0.0, 0.0) == 0.0
    assert gap_of(10.0, 9.0) == pytest.approx(0.1)
    assert gap_of(None, 1.0) is None


# -------------------------------------------------------------- Ctrl-C outside the MIP: exit 130, one line


def tree(root: Path) -> dict[str, tuple[bytes, int]]:
    """Every file below root with its bytes and mtime."""
    return {str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))
            if p.is_file()}


def interrupt(*_args, **_kwargs):
    raise KeyboardInterrupt


TWO_BUCKETS = 'max_shapes = 8\n[[bucket]]\nname = "a"\nrequests = "req.jsonl"\n[[bucket]]\nname = "b"\nrequests = "req.jsonl"\n'


@pytest.mark.parametrize("where", ["load", "write", "second-rename", "sweep"])
def test_ctrl_c_outside_the_solver_is_one_line_and_exit_130(inputs: Path, capsys, monkeypatch, where: str):
    from model.load import outputs, plans, requests
    from model.sweeping import runner as engine

    (inputs / "s.toml").write_text(TWO_BUCKETS)
    (inputs / "out").mkdir()
    (inputs / "out" / "plan_a.jsonl").write_text("old a\n")
    (inputs / "out" / "plan_b.jsonl").write_text("old b\n")
    before = tree(inputs)
    main, argv = solve.main, ["--scenario", "s.toml", "--solver", "greedy", "--out", "out", "--quiet"]
    if where == "load":
        monkeypatch.setattr(requests, "_read_bytes", interrupt)
    elif where == "write":
        monkeypatch.setattr(outputs, "_stage", interrupt)
    elif where == "second-rename":
        real, calls = plans.os.replace, []

        def replace_once(src, dst):  # the first plan lands, then Ctrl-C: it must be rolled back
            calls.append(dst)
            if len(calls) == 2:
                raise KeyboardInterrupt
            real(src, dst)

        monkeypatch.setattr(plans.os, "replace", replace_once)
    else:
        monkeypatch.setattr(engine, "run_sweep", interrupt)  # the sweep imports it when it runs
        main, argv = sweep.main, ["--scenario", "s.toml", "--k", "1", "--solvers", "greedy", "--out", "out/sweep.csv", "--quiet"]
    status, _, err = exit_of(main, argv, capsys)
    assert (status, err) == (130, "interrupted by SIGINT; nothing written\n")
    assert {k: v[0] for k, v in tree(inputs).items()} == {k: v[0] for k, v in before.items()}


# -------------------------------------------------------------- the sweep caps K at what the input can use


def test_sweep_caps_k_at_the_distinct_aligned_prompts_and_says_so(inputs: Path, capsys):
    status, out, err = exit_of(sweep.main, ["req.jsonl", "--k", "2-40", "--solvers", "greedy", "--out", "s.csv",
                                            "--quiet"], capsys)
    assert status == 0, out + err
    assert err == ("note: K capped at 3: the input has 3 distinct aligned prompt lengths, so no plan can use "
                   "more shapes (K = 4..40 not swept)\n")
    ks = {line.split(",")[0] for line in (inputs / "s.csv").read_text().splitlines()[1:]}
    assert ks == {"2", "3"}


def test_useful_ks():
    from model.sweeping.grid import useful_ks

    assert useful_ks((1, 2, 3), 5) == ((1, 2, 3), None)
    kept, note = useful_ks((2, 8, 16), 4)
    assert kept == (2, 4) and note.endswith("(K = 8, 16 not swept)")


# -------------------------------------------------------------- integral numbers as written are lengths


def test_integral_lengths_in_decimal_notation_are_accepted(tmp_path: Path):
    from model.load.requests import load_requests

    (tmp_path / "a.csv").write_text("request_id,prompt_len,gen_len\na,12,5\nb,\"13\",6.0\nc,007,7\n")
    (tmp_path / "a.jsonl").write_text('{"request_id": "a", "prompt_len": 12, "gen_len": 5.0}\n')
    csv_bucket = load_requests(tmp_path / "a.csv")
    assert csv_bucket.prompt_len.tolist() == [12, 13, 7] and csv_bucket.gen_len.tolist() == [5, 6, 7]
    assert load_requests(tmp_path / "a.jsonl").gen_len.tolist() == [5]
