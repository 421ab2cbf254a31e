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


# -------------------------------------------------------------- arrival times: one parser, and a window-count check


def timed(path: Path, times: list) -> None:
    """Three requests with the given arrival times in column ``t``, as JSONL (Python values as JSON)."""
    import json

    path.write_text("".join(json.dumps({"request_id": i, "prompt_len": 10 + 50 * i, "gen_len": 5, "t": t}) + "\n"
                            for i, t in enumerate(times)))


WINDOWED = ["--time-column", "t", "--window", "60", "--solver", "greedy", "--out", "out", "--quiet"]
FAR = "must lie within 9223372036 s of 1970-01-01 (the years 1677 to 2262; seconds, not milliseconds), got"


@pytest.mark.parametrize("times, line, got", [
    ([0, 10**30, 5], 2, str(10**30)),  # was exit 0 with a batch id ending -w-9223372036854775808
    ([0, 5, 1e300], 3, "1e+300"),                             # was a traceback in the devices table
    ([0, "3000-01-01T00:00:00", 5], 2, "'3000-01-01T00:00:00'"),  # was OutOfBoundsDatetime
    ([0, "0001-01-01T00:00:00", 5], 2, "'0001-01-01T00:00:00'"),
    ([-1e10, 0, 5], 1, "-10000000000.0"),
])
def test_arrival_times_beyond_the_time_library_are_one_line(inputs: Path, capsys, times, line, got):
    timed(inputs / "t.jsonl", times)
    status, _, err = exit_of(solve.main, ["t.jsonl", *WINDOWED], capsys)
    assert (status, err) == (2, f"error: t.jsonl:{line}: field 't': {FAR} {got}\n")
    assert not (inputs / "out").exists()


def test_a_typed_parquet_time_in_the_year_3000_is_one_line(inputs: Path, capsys):
    import datetime as dt

    import pyarrow as pa
    import pyarrow.parquet as pq

    stamps = pa.array([dt.datetime(2024, 1, 1), dt.datetime(3000, 1, 1), dt.datetime(2024, 1, 2)], pa.timestamp("s"))
    pq.write_table(pa.table({"request_id": ["a", "b", "c"], "prompt_len": [10, 20, 30], "gen_len": [5, 5, 5],
                             "t": stamps}), inputs / "t.parquet")
    status, _, err = exit_of(solve.main, ["t.parquet", *WINDOWED], capsys)
    assert (status, err) == (2, f"error: t.parquet:2: field 't': {FAR} 32503680000.0\n")


def test_typed_times_are_seconds_in_any_unit(tmp_path: Path):
    import datetime as dt

    import pyarrow as pa
    import pyarrow.parquet as pq

    from model.load.requests import load_requests

    cols = {"request_id": ["a", "b"], "prompt_len": [10, 20], "gen_len": [5, 5]}
    for name, values in {"ms": pa.array([dt.datetime(2024, 1, 1), dt.datetime(2024, 1, 1, 0, 0, 1)], pa.timestamp("ms",
                                                                                                                  "UTC")),
                         "date": pa.array([dt.date(1970, 1, 2), dt.date(1970, 1, 3)], pa.date32()),
                         "elapsed": pa.array([1500, 2500], pa.duration("ms"))}.items():
        pq.write_table(pa.table({**cols, "t": values}), tmp_path / f"{name}.parquet")
        arrival = load_requests(tmp_path / f"{name}.parquet", time_column="t").arrival_s
        assert arrival.tolist() == {"ms": [1704067200.0, 1704067201.0], "date": [86400.0, 172800.0],
                                    "elapsed": [1.5, 2.5]}[name]


@pytest.mark.parametrize("text, got", [("1_0", "'1_0'"),
                                       ("1" + "0" * 400, "'1" + "0" * 55 + "..."),  # was OverflowError (hostile pass)
                                       ("x" * 500, "'" + "x" * 56 + "...")])       # a message stays short
def test_text_times_follow_the_number_grammar(inputs: Path, capsys, text: str, got: str):
    timed(inputs / "t.jsonl", [0, text, 5])
    status, _, err = exit_of(solve.main, ["t.jsonl", *WINDOWED], capsys)
    assert (status, err) == (2, "error: t.jsonl:2: field 't': expected a time in seconds or an ISO 8601 timestamp, "
                                f"got {got}\n")


@pytest.mark.parametrize("times, window, count", [
    ([0, 50, 100], "1e-9", "1e+11"),         # a nanosecond window on a 100 s trace: the per-window tables would not fit
    ([0, 5, 9e9], "60", "1.5e+08"),          # two arrivals 285 years apart
    ([0, 50, 100], "5e-324", "inf"),         # the index itself would overflow int64
])
def test_an_absurd_window_count_is_refused_naming_the_flag_and_numbers(inputs: Path, capsys, times, window, count):
    timed(inputs / "t.jsonl", times)
    argv = ["t.jsonl", *WINDOWED]
    argv[argv.index("60")] = window
    status, _, err = exit_of(solve.main, argv, capsys)
    span = f"{times[-1] - times[0]:g}"
    assert (status, err) == (2, f"error: --window: windows of {float(window):g} s from the first arrival to the last "
                                f"({span} s later) make {count} windows; at most 1000000 are allowed: give a longer "
                                "window\n")


def test_the_sweep_checks_every_window_length_before_sweeping_any(inputs: Path, capsys, monkeypatch):
    from model import sweep
    from model.sweeping import runner

    timed(inputs / "t.jsonl", [0, 50, 100])
    calls = []
    monkeypatch.setattr(runner, "run_sweep", lambda *a, **k: calls.append(a))
    status, _, err = exit_of(sweep.main, ["t.jsonl", "--time-column", "t", "--windows", "60,1e-9", "--k", "1",
                                          "--solvers", "greedy", "--quiet"], capsys)
    assert status == 2 and err.startswith("error: --windows: windows of 1e-09 s") and calls == []


# -------------------------------------------------------------- one result, written all or nothing


def tree(root: Path) -> dict[str, bytes]:
    """Every file below root with its bytes (hidden temporaries included)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def old_report(inputs: Path) -> Path:
    """A report folder holding an earlier sweep's files."""
    rep = inputs / "rep"
    rep.mkdir()
    for name in ("sweep.csv", "report.md", "report.html", "heatmap.png"):
        (rep / name).write_text(f"old {name}\n")
    return rep


SWEEP = ["req.jsonl", "--k", "1-2", "--solvers", "greedy,pow2", "--report", "rep", "--quiet"]


def test_a_sweep_report_file_that_cannot_be_written_leaves_every_old_file(inputs: Path, old_report: Path, capsys,
                                                                          monkeypatch):
    """One target of the report fails at its rename: the CSV and the files renamed before it go back."""
    from model import sweep

    before = tree(inputs)
    real = os.replace

    def failing(src, dst):
        if Path(dst).name == "heatmap.png":
            raise OSError(28, "No space left on device")
        real(src, dst)

    monkeypatch.setattr(os, "replace", failing)
    status, _, err = exit_of(sweep.main, SWEEP, capsys)
    assert (status, err) == (2, f"error: {Path('rep') / 'heatmap.png'}: cannot write: No space left on device\n")
    assert tree(inputs) == before


def test_ctrl_c_while_the_pictures_are_drawn_leaves_the_old_sweep(inputs: Path, old_report: Path, capsys,
                                                                 monkeypatch):
    """"nothing written" is true: the CSV is not replaced before the pictures exist."""
    from model import sweep
    from model.sweeping import sweep_report

    def interrupt(*_args, **_kwargs):
        raise KeyboardInterrupt

    before = tree(inputs)
    monkeypatch.setattr(sweep_report, "plot_breakdown", interrupt)
    status, _, err = exit_of(sweep.main, SWEEP, capsys)
    assert (status, err) == (130, "interrupted by SIGINT; nothing written\n")
    assert tree(inputs) == before


WINDOWED_DEVICE = ["t.jsonl", "--time-column", "t", "--window", "60", "--device-profile", "p.toml", "--solver",
                   "dpfill", "--quiet", "--report", "rep"]


def test_solve_writes_the_devices_report_with_its_plans_or_not_at_all(inputs: Path, old_report: Path, capsys,
                                                                      monkeypatch):
    (inputs / "p.toml").write_text(PROFILE)
    timed(inputs / "t.jsonl", [0, 5, 70])
    (inputs / "out").write_text("a file where the plans' folder must go\n")
    before = tree(inputs)
    status, _, err = exit_of(solve.main, [*WINDOWED_DEVICE, "--out", "out"], capsys)
    assert (status, err) == (2, "error: --out: out is a file; give a folder for plan_<bucket>.jsonl\n")
    assert tree(inputs) == before  # was: the report replaced, then the plans failed
    (inputs / "out").unlink()
    before = tree(inputs)
    real = os.replace

    def failing(src, dst):  # the plan is the last file put down: the report renamed before it goes back
        if Path(dst).name == "plan_t.jsonl":
            raise OSError(28, "No space left on device")
        real(src, dst)

    monkeypatch.setattr(os, "replace", failing)
    status, _, err = exit_of(solve.main, [*WINDOWED_DEVICE, "--out", "plans"], capsys)
    assert (status, err) == (2, f"error: {Path('plans') / 'plan_t.jsonl'}: cannot write: No space left on device\n")
    assert tree(inputs) == before and not (inputs / "plans").exists()
    monkeypatch.setattr(os, "replace", real)
    status, out, err = exit_of(solve.main, [*WINDOWED_DEVICE, "--out", "plans"], capsys)
    assert (status, err) == (0, "")
    assert out.endswith("wrote rep/report.md, rep/report.html, rep/devices.png, rep/devices.csv\n"
                        "wrote plans/plan_t.jsonl\n")
    assert sorted(p.name for p in old_report.iterdir()) == ["devices.csv", "devices.png", "heatmap.png", "report.html",
                                                           "report.md", "sweep.csv"]


# -------------------------------------------------------------- no output may overwrite an input


def test_sweep_out_naming_its_requests_is_refused_before_any_work(inputs: Path, capsys):
    from model import sweep

    before = tree(inputs)
    status, _, err = exit_of(sweep.main, ["req.jsonl", "--k", "1", "--solvers", "greedy", "--out", "req.jsonl",
                                          "--quiet"], capsys)
    assert (status, err) == (2, f"error: --out: req.jsonl is an input of this run ({inputs / 'req.jsonl'}): writing "
                                "it would destroy it; choose another path\n")
    assert tree(inputs) == before


def test_a_symlink_to_an_input_is_that_input(inputs: Path, capsys):
    (inputs / "m.csv").write_text(MEASUREMENTS)
    (inputs / "link.toml").symlink_to(inputs / "m.csv")
    before = tree(inputs)
    status, _, err = exit_of(calibrate.main, ["m.csv", "--out", "link.toml"], capsys)
    assert (status, err) == (2, f"error: --out: link.toml is an input of this run ({inputs / 'm.csv'}): writing it "
                                "would destroy it; choose another path\n")
    assert tree(inputs) == before


def test_calibrate_out_naming_its_measurements_is_refused(inputs: Path, capsys):
    (inputs / "m.csv").write_text(MEASUREMENTS)
    status, _, err = exit_of(calibrate.main, ["m.csv", "--out", "m.csv"], capsys)
    assert status == 2 and err.startswith("error: --out: m.csv is an input of this run")
    assert (inputs / "m.csv").read_text() == MEASUREMENTS


def test_export_out_naming_a_plan_it_reads_is_refused(inputs: Path, capsys):
    from model import export

    (inputs / "plans").mkdir()
    (inputs / "plans" / "plan_x.jsonl").write_text(PLAN)
    status, _, err = exit_of(export.main, ["--plans", "plans", "--format", "json", "--out", "plans/plan_x.jsonl"],
                             capsys)
    assert (status, err) == (2, f"error: --out: plans/plan_x.jsonl is an input of this run "
                                f"({inputs / 'plans' / 'plan_x.jsonl'}): writing it would destroy it; choose another "
                                "path\n")
    assert (inputs / "plans" / "plan_x.jsonl").read_text() == PLAN
    status, _, err = exit_of(export.main, ["--plans", "plans", "--format", "json", "--out", "plans/shapes.json"],
                             capsys)
    assert status == 0, err  # beside the plans is fine: only what is read is protected


def test_a_plan_that_would_replace_a_file_the_scenario_names_is_refused_before_planning(inputs: Path, capsys,
                                                                                      monkeypatch):
    """The scenario's request file is only known once the scenario is read: checked before anything is planned."""
    from model import pipeline

    (inputs / "out").mkdir()
    (inputs / "out" / "plan_a.jsonl").write_text(GOOD)
    (inputs / "s.toml").write_text(SCENARIO.replace('"req.jsonl"', '"out/plan_a.jsonl"'))
    monkeypatch.setattr(pipeline, "run", lambda *a, **k: pytest.fail("planned before the outputs were checked"))
    status, _, err = exit_of(solve.main, ["--scenario", "s.toml", "--out", "out", "--quiet"], capsys)
    assert (status, err) == (2, f"error: --out: out/plan_a.jsonl is an input of this run "
                                f"({inputs / 'out' / 'plan_a.jsonl'}): writing it would destroy it; choose another "
                                "path\n")
    assert (inputs / "out" / "plan_a.jsonl").read_text() == GOOD


def test_the_guard_itself(tmp_path: Path):
    from model.base.errors import InputError
    from model.load.outputs import Target, check_targets

    folder = tmp_path / "parts"
    folder.mkdir()
    (folder / "p0.parquet").write_bytes(b"x")
    with pytest.raises(InputError, match="p0.parquet is not a folder"):  # below a file: the kind check says so
        check_targets([Target("--out", folder / "p0.parquet" / "x")], [folder / "p0.parquet"])
    with pytest.raises(InputError, match="lies inside the input"):
        check_targets([Target("--out", folder / "new.csv")], [folder])
    with pytest.raises(InputError, match="holds the input .*replacing it would destroy it"):
        check_targets([Target("--out", folder, "dataset")], [folder / "p0.parquet"])
    check_targets([Target("--out", folder, "folder")], [folder / "p0.parquet"])  # files written into it are checked
    with pytest.raises(InputError, match=r"is also the output of --out"):
        check_targets([Target("--out", tmp_path / "a.toml"), Target("--report", tmp_path / "." / "a.toml")])
    # replay --json R --report R: the file where the folder goes failed only when written, after the replay
    with pytest.raises(InputError, match=r"--json: .*r is also where --report writes"):
        check_targets([Target("--json", tmp_path / "r"), Target("--report", tmp_path / "r", "folder"),
                       Target("--report", tmp_path / "r" / "timeline.png")])
    with pytest.raises(InputError, match=r"is also where --report writes"):
        check_targets([Target("--json", tmp_path / "r"), Target("--report", tmp_path / "r" / "x" / "t.png")])
    check_targets([Target("--json", tmp_path / "r" / "x.json"), Target("--report", tmp_path / "r", "folder")])


def test_every_file_of_a_result_is_renamed_under_its_folders_lock(tmp_path: Path, monkeypatch):
    """Two runs writing one --out folder at once renamed their files in turn (one run's audit.json beside the
    other's today-graphs.json): each rename now happens while the writer holds the folder's flock, so another
    writer's renames wait for all of this one's."""
    import fcntl

    from model.load import outputs

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    held: list[bool] = []
    replace = os.replace

    def checked(src, dst):
        fd = os.open(Path(dst).parent, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            held.append(False)  # nobody held it
        except BlockingIOError:
            held.append(True)
        finally:
            os.close(fd)
        replace(src, dst)

    monkeypatch.setattr(outputs.os, "replace", checked)
    outputs.write_together({tmp_path / "b" / "x.json": [b"1"], tmp_path / "a" / "y.json": [b"2"],
                            tmp_path / "a" / "z.json": [b"3"]})
    assert held == [True, True, True] and (tmp_path / "a" / "z.json").read_bytes() == b"3"
    fd = os.open(tmp_path / "a", os.O_RDONLY)  # and released after
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.close(fd)


# -------------------------------------------------------------- every output path checked before any work


def test_audit_report_file_is_refused_before_any_work(inputs: Path, capsys, monkeypatch):
    from model import audit, pipeline

    (inputs / "shapes.txt").write_text("320\n")
    (inputs / "rep.txt").write_text("a file\n")
    monkeypatch.setattr(pipeline, "run", lambda *a, **k: pytest.fail("planned before the outputs were checked"))
    status, _, err = exit_of(audit.main, ["req.jsonl", "--shapes-from", "shapes.txt", "--report", "rep.txt",
                                          "--quiet"], capsys)
    assert (status, err) == (2, "error: --report: rep.txt is a file; give a folder for report.md, report.html and "
                                "heatmap.png\n")


def test_calibrate_report_file_is_refused_before_any_work(inputs: Path, capsys, monkeypatch):
    from model.calibration import fit

    (inputs / "m.csv").write_text(MEASUREMENTS)
    (inputs / "rep.txt").write_text("a file\n")
    monkeypatch.setattr(fit, "fit_rows", lambda *a, **k: pytest.fail("fitted before the outputs were checked"))
    status, _, err = exit_of(calibrate.main, ["m.csv", "--out", "p.toml", "--report", "rep.txt"], capsys)
    assert (status, err) == (2, "error: --report: rep.txt is a file; give a folder for prefill.png and decode.png\n")
    assert not (inputs / "p.toml").exists()


# -------------------------------------------------------------- Ctrl-C during start-up: exit 130, one line


BLOCKED_START = '''
import runpy, sys, time

class HoldNumpy:
    """Holds the first import of numpy (the first heavy module of every command line) until a signal."""

    def find_spec(self, name, path=None, target=None):
        if name == "numpy":
            sys.meta_path.remove(self)
            sys.stderr.write("importing numpy\\n")
            sys.stderr.flush()
            while True:
                time.sleep(60)  # a signal handler that raises ends this; the default SIGTERM kills the process
        return None

sys.meta_path.insert(0, HoldNumpy())
sys.argv = [sys.argv[1], *sys.argv[2:]]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
'''


@pytest.mark.skipif(os.name != "posix", reason="needs POSIX signals")
@pytest.mark.parametrize("module, sig", [("model.solve", "SIGINT"), ("model.solve", "SIGTERM"),
                                         ("model.evaluate", "SIGINT"), ("model.sweep", "SIGINT"),
                                         ("model.audit", "SIGINT"), ("model.export", "SIGINT"),
                                         ("model.calibrate", "SIGTERM"), ("model.replay", "SIGINT")])
def test_a_signal_during_start_up_is_exit_130_or_143_with_one_line(tmp_path: Path, module: str, sig: str):
    """The signal lands while the first heavy module is being imported -- held there by an import hook, so the
    test waits on that event, not on the clock: the entry point's handler must already be in place."""
    import signal
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(repo), os.environ.get("PYTHONPATH", "")) if p))
    proc = subprocess.Popen([sys.executable, "-c", BLOCKED_START, module, "--help"], cwd=tmp_path, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr.readline() == "importing numpy\n"
        proc.send_signal(getattr(signal, sig))
        err = proc.stderr.read()
        code = proc.wait(timeout=120)
    finally:
        proc.kill()
    want = 130 if sig == "SIGINT" else 143
    assert (code, err) == (want, f"interrupted by {sig}; nothing written\n")


@pytest.mark.parametrize("module", ["solve", "evaluate", "sweep", "audit", "export", "calibrate", "replay"])
def test_command_line_modules_import_nothing_heavy_before_their_entry_point(module: str):
    """What the signal test relies on, checked directly: importing a command line loads no numpy, pandas,
    pyarrow or solver, so entry() runs (and installs its handlers) within a blink of the start."""
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(repo), os.environ.get("PYTHONPATH", "")) if p))
    heavy = ("numpy", "pandas", "pyarrow", "matplotlib", "highspy", "ortools", "pulp", "model.pipeline")
    done = subprocess.run([sys.executable, "-c", f"import sys, model.{module}; "
                           f"print(sorted(m for m in {heavy!r} if m in sys.modules))"], env=env, capture_output=True,
                          text=True, timeout=120)
    assert (done.returncode, done.stdout) == (0, "[]\n"), done.stderr


# -------------------------------------------------------------- a hold-out with nothing to compare is bad input


LONG_LAST = "".join(f'{{"request_id": "r{i}", "prompt_len": {p}, "gen_len": 5}}\n'
                    for i, p in enumerate((10, 20, 30, 1000)))  # the held-out last quarter: one prompt no shape fits
NOTHING = ("error: --holdout: every held-out request of bucket long (1) is longer than the largest shape chosen on "
           "the first part (64): nothing to compare; hold out a smaller fraction\n")


@pytest.mark.parametrize("cli", ["solve", "sweep", "audit"])
def test_a_hold_out_with_nothing_to_compare_is_exit_2_everywhere(inputs: Path, capsys, cli: str):
    """Was exit 1 from solve ("a plan breaks a rule or limit"), 0 from the sweep and 3 from the audit."""
    from model import audit, sweep

    (inputs / "long.jsonl").write_text(LONG_LAST)
    (inputs / "shapes.txt").write_text("1024\n")
    main, extra = {"solve": (solve.main, ["--solver", "greedy"]),
                   "sweep": (sweep.main, ["--k", "1", "--solvers", "mip", "--time-limit", "5", "--out", "s.csv"]),
                   "audit": (audit.main, ["--shapes-from", "shapes.txt", "--solver", "greedy"])}[cli]
    before = tree(inputs)
    status, _, err = exit_of(main, ["long.jsonl", "--holdout", "0.25", "--quiet", *extra], capsys)
    assert (status, err) == (2, NOTHING)
    assert tree(inputs) == before


def test_a_held_out_part_proven_unplannable_under_the_chosen_shapes_is_exit_3_as_in_the_audit(inputs: Path, capsys):
    """Not exit 1: no plan breaks a limit, the limits are proven unmeetable (the audit already said so, exit 3)."""
    (inputs / "pad.jsonl").write_text("".join(f'{{"request_id": "r{i}", "prompt_len": {p}, "gen_len": 5}}\n'
                                              for i, p in enumerate((64, 64, 64, 10))))
    status, out, err = exit_of(solve.main, ["pad.jsonl", "--holdout", "0.25", "--max-pad-ratio", "0.1", "--quiet",
                                            "--time-limit", "5"], capsys)
    assert status == 3 and err.count("\n") == 1
    assert err.startswith("infeasible: hold-out: the shapes chosen on the first part cannot plan the held-out part: ")
    assert "Out of sample (K = 8)" in out and "no plans written" not in out


@pytest.mark.parametrize("flag", ["--out", "--report"])
@pytest.mark.parametrize("name, message", [("a\x00b", "'a\\x00b' holds a NUL byte; no file can have that name"),
                                           ("n" * 300, f"cannot write {'n' * 300}: File name too long")])
def test_an_output_no_file_can_have_is_one_line(inputs: Path, capsys, flag: str, name: str, message: str):
    """Found by the hostile pass: os.stat raised ValueError / ENAMETOOLONG out of the output check."""
    from model import sweep

    status, _, err = exit_of(sweep.main, ["req.jsonl", "--k", "1", "--solvers", "greedy", "--quiet", flag, name],
                             capsys)
    assert (status, err) == (2, f"error: {flag}: {message}\n")


def test_an_input_no_file_can_have_is_one_line(inputs: Path, capsys):
    from model import export

    for main, argv in ((solve.main, ["req.jsonl", "--device-profile", "p" * 300, "--solver", "greedy", "--quiet"]),
                       (export.main, ["--plans", "p" * 300, "--format", "json", "--out", "e.json"]),
                       (calibrate.main, ["m" * 300, "--out", "c.toml"])):
        status, _, err = exit_of(main, argv, capsys)
        assert status == 2 and err.count("\n") == 1 and err.endswith("File name too long\n"), err
