"""The robustness issue's classes, each at its one mechanism: inputs that are not regular files, outputs that are
inputs, results written all or nothing, arrival times and window counts, and the hold-out's exit status.

Everything runs in-process through ``run_main`` (what ``python -m`` calls) on a few requests; no test waits on
the clock (a FIFO's writer is a thread that the reader either drains or is refused by).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from model import calibrate, evaluate, solve
from model.cli_common import run_main

GOOD = ('{"request_id": "a", "prompt_len": 10, "gen_len": 5}\n'
        '{"request_id": "b", "prompt_len": 100, "gen_len": 7}\n'
        '{"request_id": "c", "prompt_len": 300, "gen_len": 9}\n')
PLAN = "".join(f'{{"request_id": "{r}", "batch_id": "b-{r}", "shape": {{"seq_align": 320, "heads_align": 32, '
               f'"hidden_align": 4096}}}}\n' for r in "abc")
PROFILE = "[device]\nprefill = [1.0, 0.1, 0.0]\ndecode = [1.0, 0.001, 0.01]\ncompile_ms = 100.0\n"
SCENARIO = 'max_shapes = 4\n[[bucket]]\nname = "a"\nrequests = "req.jsonl"\n'
MEASUREMENTS = "phase,batch_size,seq_len,ms\n" + "".join(
    f"prefill,{n},{s},{1 + 0.1 * n * s + 1e-5 * n * s * s}\n" for n in (1, 2, 4) for s in (128, 512, 1024)) + "".join(
    f"decode,{n},{c},{20 + 0.001 * n * c + 0.03 * n}\n" for n in (1, 4, 16) for c in (128, 512, 1024))


def exit_of(main, argv: list[str], capsys) -> tuple[int, str, str]:
    """Exit status, stdout and stderr of an entry point run as ``python -m`` runs it."""
    with pytest.raises(SystemExit) as stop:
        run_main(lambda: main(argv))
    out, err = capsys.readouterr()
    return stop.value.code, out, err


@pytest.fixture
def inputs(tmp_path: Path, monkeypatch) -> Path:
    (tmp_path / "req.jsonl").write_text(GOOD)
    monkeypatch.chdir(tmp_path)
    return tmp_path


# -------------------------------------------------------------- an input that is not a regular file is refused


class Feeder:
    """A FIFO with a writer thread that offers ``text`` once a reader opens it: the code that reads FIFOs reads
    the text (and goes on), the code that refuses them closes it unread; either way nothing waits forever."""

    def __init__(self, path: Path, text: str):
        self.path = path
        os.mkfifo(path)
        self.thread = threading.Thread(target=self.feed, args=(text.encode(),), daemon=True)
        self.thread.start()

    def feed(self, data: bytes) -> None:
        try:
            with open(self.path, "wb") as fh:  # blocks until a reader opens the FIFO
                fh.write(data)
        except OSError:  # the reader refused it and closed: a broken pipe
            pass

    def close(self) -> None:
        """Release a writer still waiting for a reader (the run refused the path before opening it)."""
        fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        self.thread.join(10)
        os.close(fd)


FIFO_CASES = {  # the FIFO's name, what it would hold, and the command that reads it
    "requests": ("fifo.jsonl", GOOD, solve.main, ["fifo.jsonl", "--solver", "greedy", "--out", "out", "--quiet"]),
    "shapes-from": ("shapes.txt", "128\n320\n", solve.main,
                    ["req.jsonl", "--shapes-from", "shapes.txt", "--solver", "greedy", "--out", "out", "--quiet"]),
    "device-profile": ("p.toml", PROFILE, solve.main,
                       ["req.jsonl", "--device-profile", "p.toml", "--solver", "greedy", "--out", "out", "--quiet"]),
    "cost-params": ("c.toml", "Kp_attn = 1.0\n", solve.main,
                    ["req.jsonl", "--cost-params", "c.toml", "--solver", "greedy", "--out", "out", "--quiet"]),
    "scenario": ("s.toml", SCENARIO, solve.main, ["--scenario", "s.toml", "--solver", "greedy", "--out", "out",
                                                  "--quiet"]),
    "plan": ("plan.jsonl", PLAN, evaluate.main, ["req.jsonl", "plan.jsonl"]),
    "measurements": ("m.csv", MEASUREMENTS, calibrate.main, ["m.csv", "--out", "prof.toml"]),
}


@pytest.mark.parametrize("case", list(FIFO_CASES))
def test_a_fifo_input_is_refused_in_one_line_not_waited_on(inputs: Path, capsys, case: str):
    name, text, main, argv = FIFO_CASES[case]
    feeder = Feeder(inputs / name, text)
    try:
        status, _, err = exit_of(main, argv, capsys)
    finally:
        feeder.close()
    assert (status, err) == (2, f"error: {name}: cannot read: a FIFO (named pipe), not a regular file\n")
    assert not (inputs / "out").exists() and not (inputs / "prof.toml").exists()


def test_a_device_file_is_refused_too(inputs: Path, capsys):
    status, _, err = exit_of(solve.main, ["/dev/null", "--format", "jsonl", "--solver", "greedy", "--out", "out"],
                             capsys)
    assert (status, err) == (2, "error: /dev/null: cannot read: a character device, not a regular file\n")
