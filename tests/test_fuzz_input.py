"""Mutated input never crashes: random byte flips, insertions, deletions, truncation and duplicated lines in
request files (JSONL, CSV), scenarios (TOML) and plans (JSONL) end in a legitimate exit status only.

Each example runs the real entry point in-process through ``run_main`` (what ``python -m`` calls):

* ``model.solve --solver greedy`` on a mutated request file, no limits: 0 (planned and written) or 2 (bad
  input).  Without limits and with K = 8 the greedy packer always has a valid plan, so 1 and 3 would be bugs.
* ``model.solve --solver greedy --scenario`` on a mutated scenario: also 1 (a mutated limit that the greedy
  plan breaks: nothing written) and 3 (a limit the greedy packer says it cannot meet).
* ``model.evaluate`` on a mutated plan or request file: 0, 1 (the plan breaks a rule) or 2.

Never a traceback: exit 2 and 3 print exactly one line on stderr, 0 and 1 print nothing there.  On every
non-zero exit the output folder (holding old plans) is unchanged, bytes and mtimes.  Derandomized with a
fixed number of examples, so the run is the same every time and takes a few seconds.
"""

from __future__ import annotations

import contextlib
import io
import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from model import evaluate, solve
from model.cli_common import run_main

REQUESTS = "".join(f'{{"request_id": "r{i}", "prompt_len": {p}, "gen_len": {g}}}\n'
                   for i, (p, g) in enumerate([(10, 5), (100, 7), (300, 12), (64, 64), (700, 3), (129, 40)]))
CSV = "request_id,prompt_len,gen_len\n" + "".join(f"r{i},{p},{g}\n" for i, (p, g) in
                                                    enumerate([(10, 5), (100, 7), (300, 12), (64, 64), (700, 3)]))
SCENARIO = """max_shapes = 8
mode = "reference"

[[bucket]]
name = "b1"
requests = "req.jsonl"
max_cost = 1e12
max_pad_ratio = 5.0
max_p95_latency_ms = 1e9
max_sequential_ms = 1e10

[[bucket]]
name = "b2"
requests = "req.jsonl"
max_cost = 2e12
"""
PLAN = "".join(f'{{"request_id": "r{i}", "batch_id": "b{i % 2}", "shape": {{"seq_align": 704, "heads_align": 32, '
               f'"hidden_align": 4096}}}}\n' for i in range(6))
OLD = b'{"old": "plan that must survive a failed run"}\n'

INTERESTING = b'"{}[],:\n\r\t \\-+.eE0123456789\x00\xff\xc3=#'


@st.composite
def mutated(draw, text: str) -> bytes:
    """The text's bytes after one to four random edits."""
    data = bytearray(text.encode())
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "insert", "delete", "truncate", "dup-line", "replace"]))
        pos = draw(st.integers(0, max(len(data) - 1, 0)))
        if kind == "flip" and data:
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif kind == "insert":
            byte = draw(st.one_of(st.sampled_from(list(INTERESTING)), st.integers(0, 255)))
            data[pos:pos] = bytes([byte]) * draw(st.integers(1, 3))
        elif kind == "replace" and data:
            data[pos] = draw(st.sampled_from(list(INTERESTING)))
        elif kind == "delete":
            del data[pos:pos + draw(st.integers(1, 8))]
        elif kind == "truncate":
            del data[pos:]
        elif kind == "dup-line":
            lines = bytes(data).split(b"\n")
            k = draw(st.integers(0, len(lines) - 1))
            lines.insert(k, lines[k])
            data = bytearray(b"\n".join(lines))
    return bytes(data)


def snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(folder.iterdir())}


def run(main, argv: list[str], files: dict[str, bytes], out_names: tuple[str, ...]) -> tuple[int, str, dict, dict]:
    """Lay the files out in a fresh folder, run the entry point there; (status, stderr, out before, out after)."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for name, data in files.items():
            (root / name).write_bytes(data)
        (root / "out").mkdir()
        for name in out_names:
            (root / "out" / name).write_bytes(OLD)
        before = snapshot(root / "out")
        err = io.StringIO()
        cwd = os.getcwd()
        os.chdir(root)
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err), \
                    pytest.raises(SystemExit) as stop:
                run_main(lambda: main(argv))
        finally:
            os.chdir(cwd)
        return stop.value.code, err.getvalue(), before, snapshot(root / "out")


def check(status: int, err: str, before: dict, after: dict, allowed: set[int]) -> None:
    assert status in allowed, (status, err)
    assert "Traceback" not in err
    if status in (2, 3):
        assert err.count("\n") == 1 and err.endswith("\n"), err
        assert err.startswith("error: " if status == 2 else "infeasible: "), err
    else:
        assert err == "", err
    if status != 0:
        assert after == before


FUZZ = settings(max_examples=60, derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@FUZZ
@given(data=mutated(REQUESTS))
def test_mutated_jsonl_requests(data: bytes):
    status, err, before, after = run(solve.main, ["req.jsonl", "--solver", "greedy", "--out", "out", "--quiet"],
                                     {"req.jsonl": data}, ("plan_req.jsonl",))
    check(status, err, before, after, {0, 2})


@FUZZ
@given(data=mutated(CSV))
def test_mutated_csv_requests(data: bytes):
    status, err, before, after = run(solve.main, ["req.csv", "--solver", "greedy", "--out", "out", "--quiet"],
                                     {"req.csv": data}, ("plan_req.jsonl",))
    check(status, err, before, after, {0, 2})


@FUZZ
@given(data=mutated(SCENARIO))
def test_mutated_scenario(data: bytes):
    status, err, before, after = run(solve.main, ["--scenario", "s.toml", "--solver", "greedy", "--out", "out",
                                                  "--quiet"], {"s.toml": data, "req.jsonl": REQUESTS.encode()},
                                     ("plan_b1.jsonl", "plan_b2.jsonl"))
    check(status, err, before, after, {0, 1, 2, 3})


@FUZZ
@given(data=mutated(PLAN), which=st.sampled_from(["plan", "requests"]))
def test_mutated_plan_or_requests_evaluated(data: bytes, which: str):
    files = {"req.jsonl": data if which == "requests" else REQUESTS.encode(),
             "plan.jsonl": data if which == "plan" else PLAN.encode()}
    status, err, before, after = run(evaluate.main, ["req.jsonl", "plan.jsonl"], files, ("plan_req.jsonl",))
    check(status, err, before, after, {0, 1, 2})


def test_the_unmutated_inputs_pass():
    """The seeds themselves plan and judge cleanly, so the fuzzing starts from good input."""
    assert run(solve.main, ["req.jsonl", "--solver", "greedy", "--out", "out", "--quiet"],
               {"req.jsonl": REQUESTS.encode()}, ())[:2] == (0, "")
    assert run(solve.main, ["req.csv", "--solver", "greedy", "--out", "out", "--quiet"],
               {"req.csv": CSV.encode()}, ())[:2] == (0, "")
    assert run(solve.main, ["--scenario", "s.toml", "--solver", "greedy", "--out", "out", "--quiet"],
               {"s.toml": SCENARIO.encode(), "req.jsonl": REQUESTS.encode()}, ())[:2] == (0, "")
    assert run(evaluate.main, ["req.jsonl", "plan.jsonl"],
               {"req.jsonl": REQUESTS.encode(), "plan.jsonl": PLAN.encode()}, ())[:2] == (0, "")
