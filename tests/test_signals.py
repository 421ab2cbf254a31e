"""Ctrl-C and SIGTERM end ``python -m model.solve`` cleanly: real subprocesses, signalled mid-run.

Each run gets its own TMPDIR and an ``--out`` folder holding old plans.  After the signal: exit 130 (SIGINT) or
143 (SIGTERM), the old plans byte-identical, no other file in ``--out`` (no hidden ``.plan_*.tmp``), no solver
process left (CBC runs as a child process under PuLP), and the private TMPDIR empty (PuLP's .mps/.sol files).
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from test_backends import solver_processes
from test_solve_cli import binding_limits, synthetic, write_scenario

pytestmark = pytest.mark.skipif(not Path("/proc/self/cmdline").exists() or os.name != "posix",
                                reason="needs POSIX signals and /proc")
REPO = Path(__file__).resolve().parents[1]
OLD = {"plan_chat.jsonl": b'{"old": "chat plan that must survive"}\n',
       "plan_short.jsonl": b'{"old": "short plan that must survive"}\n'}


@pytest.fixture(scope="module")
def scenario(tmp_path_factory) -> Path:
    """2 x 1000 synthetic requests with binding limits: the polish MIP runs for seconds on every backend."""
    buckets = synthetic(1000, seed=5)
    return write_scenario(tmp_path_factory.mktemp("signals"), buckets, binding_limits(buckets))


def prepared(tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    """(--out holding the old plans, a private TMPDIR, the environment that points the run at both)."""
    out, tmp = tmp_path / "out", tmp_path / "tmp"
    out.mkdir()
    tmp.mkdir()
    for name, data in OLD.items():
        (out / name).write_bytes(data)
    env = dict(os.environ, TMPDIR=str(tmp), PYTHONPATH=os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p))
    return out, tmp, env


def start(tmp_path: Path, scenario: Path | None, *extra: str) -> tuple[subprocess.Popen, Path, Path]:
    """The solve CLI on ``scenario`` (None: the embedded default) with old plans in its --out."""
    out, tmp, env = prepared(tmp_path)
    where = ["--scenario", str(scenario)] if scenario is not None else []
    proc = subprocess.Popen([sys.executable, "-m", "model.solve", *where, "--out", str(out),
                             "--time-limit", "60", *extra], cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    return proc, out, tmp


def wait_for_line(proc: subprocess.Popen, needle: str, timeout: float = 30.0) -> list[str]:
    """Read the child's log (stderr) until a line holds ``needle``; the lines read so far."""
    seen: list[str] = []
    sel = selectors.DefaultSelector()
    sel.register(proc.stderr, selectors.EVENT_READ)
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if sel.select(timeout=0.1):
            line = proc.stderr.readline()
            if not line:
                break
            seen.append(line)
            if needle in line:
                return seen
    proc.kill()
    pytest.fail(f"no log line with {needle!r}; saw:\n{''.join(seen)}")


def wait_for_process(marker: str, parent: int, timeout: float = 30.0) -> None:
    """Wait until a process other than ``parent`` (a solver it started) carries ``marker``."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if solver_processes(marker, exclude=(parent,)):
            return
        time.sleep(0.02)
    pytest.fail("CBC never started")


def assert_clean_exit(proc: subprocess.Popen, sig: int, out: Path, tmp: Path) -> None:
    try:
        code = proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("the run did not end within 15 s of the signal")
    err = proc.stderr.read()
    assert code == 128 + sig, f"exit {code}\n{err[-2000:]}"
    assert f"interrupted by {signal.Signals(sig).name}; nothing written" in err
    assert sorted(p.name for p in out.iterdir()) == sorted(OLD), list(out.iterdir())
    assert all((out / name).read_bytes() == data for name, data in OLD.items())
    time.sleep(0.2)  # a solver process we failed to stop would still be there now
    assert not solver_processes(str(tmp)), "a solver process outlived the run"
    assert not list(tmp.iterdir()), f"files left in TMPDIR: {list(tmp.iterdir())}"


@pytest.mark.parametrize("backend, sig, line", [
    ("highs", signal.SIGINT, "HiGHS MIP in its own process"),  # the polish MIP, in a child process
    pytest.param("highs", signal.SIGTERM, "MIP (highs) over", marks=pytest.mark.slow),
    pytest.param("cpsat", signal.SIGTERM, "MIP (cpsat) over", marks=pytest.mark.slow),
])
def test_a_signal_mid_mip_exits_cleanly(scenario, tmp_path, backend, sig, line):
    proc, out, tmp = start(tmp_path, scenario, "--backend", backend)
    wait_for_line(proc, line)
    time.sleep(0.3)
    proc.send_signal(sig)
    assert_clean_exit(proc, sig, out, tmp)


@pytest.mark.parametrize("sig", [signal.SIGINT, pytest.param(signal.SIGTERM, marks=pytest.mark.slow)])
def test_a_signal_while_the_search_runs_beside_leaves_no_process(tmp_path, sig):
    """The main job forks its search over shape sets onto a second core: a signal then still ends the run cleanly
    and the forked search with it (it carries the run's TMPDIR, which ``assert_clean_exit`` looks for)."""
    from model.planning.beside import can_fork

    if not can_fork():
        pytest.skip("needs fork and a second core")
    out, tmp, env = prepared(tmp_path)
    script = tmp_path / "endless.py"
    script.write_text(ENDLESS_SCRIPT)
    proc = subprocess.Popen([sys.executable, str(script), "--limit-shapes", "8", "--out", str(out)], cwd=tmp_path,
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wait_for_line(proc, "goes on beside the planner")
    proc.send_signal(sig)
    assert_clean_exit(proc, sig, out, tmp)


ENDLESS_SCRIPT = textwrap.dedent('''
    import sys, time
    from model import solve
    from model.cli_common import run_main
    from model.planning import beside

    beside.searched = lambda *args: time.sleep(600)  # the forked search would outlive the test unless stopped
    run_main(lambda: solve.main(sys.argv[1:]))
''')


@pytest.mark.parametrize("sig", [signal.SIGINT, pytest.param(signal.SIGTERM, marks=pytest.mark.slow)])
def test_a_signal_while_cbc_runs_leaves_no_cbc_and_no_files(scenario, tmp_path, sig):
    """PuLP: the signal lands while a CBC process (column generation's LP or the MIP) is running."""
    proc, out, tmp = start(tmp_path, scenario, "--backend", "pulp")
    wait_for_process(str(tmp), proc.pid)
    proc.send_signal(sig)
    assert_clean_exit(proc, sig, out, tmp)


WRITE_SCRIPT = textwrap.dedent('''
    import os, signal, sys
    from model import solve
    from model.cli_common import run_main
    from model.load import plans

    where = sys.argv[1]
    real_chunks, real_replace = plans.plan_chunks, os.replace
    staged = []

    def chunks(plan, size=plans.CHUNK_RECORDS):
        staged.append(plan)
        for i, chunk in enumerate(real_chunks(plan, size=16)):
            if where == "staging" and len(staged) == 2 and i == 3:
                os.kill(os.getpid(), signal.SIGTERM)  # mid-way through the second plan's temporary file
            yield chunk

    def replace(src, dst):
        real_replace(src, dst)
        if where == "renaming" and str(dst).endswith(".jsonl"):
            os.kill(os.getpid(), signal.SIGTERM)  # the first plan is in place, the second is not

    plans.plan_chunks = chunks
    plans.os.replace = replace
    run_main(lambda: solve.main(sys.argv[2:]))
''')


@pytest.mark.parametrize("where", ["staging", "renaming"])
def test_sigterm_during_the_plan_write_leaves_the_old_plans(scenario, tmp_path, where):
    """SIGTERM while the plans are written: the old plans come back, no hidden temporary file is left."""
    out, tmp, env = prepared(tmp_path)
    script = tmp_path / "write.py"
    script.write_text(WRITE_SCRIPT)
    done = subprocess.run([sys.executable, str(script), where, "--scenario", str(scenario), "--out", str(out),
                           "--solver", "greedy", "--quiet"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 143, f"exit {done.returncode}\n{done.stderr[-2000:]}"
    assert sorted(p.name for p in out.iterdir()) == sorted(OLD), list(out.iterdir())
    assert all((out / name).read_bytes() == data for name, data in OLD.items())
