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
from model.sweeping.engine import gap_of

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
