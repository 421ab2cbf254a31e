"""``python -m model.solve`` end to end: real subprocesses on small scenarios written into tmp_path.

Each run starts in its own folder (not the repository), as a user would, and its written plans are judged
again by ``model.evaluate``: once as a subprocess, elsewhere in-process (same entry point, less start-up).
"""

from __future__ import annotations

import json
import re
import subprocess
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from helpers import cli, evaluated, plan_mip, problem

from model import evaluate, pipeline, solve
from model.cli_common import run_main
from model.domain.schema import Bucket, Limits, Problem
from model.load.synth import CHAT, SHORT, bucket_arrays, requests_jsonl
from model.packers import PACKERS
from solvers.backends import highs

OLD_PLAN = b'{"old": "plan that must survive"}\n'


def run(*argv: str, cwd: Path, module: str = "model.solve") -> subprocess.CompletedProcess:
    return cli(module, *argv, cwd=cwd)


def synthetic(n: int, seed: int) -> tuple[Bucket, Bucket]:
    """A chat and a short-form bucket of n requests each, as model.load.synth draws them."""
    rng = np.random.default_rng(seed)
    out = []
    for name, traffic in (("chat", CHAT), ("short", SHORT)):
        ids, p, g = bucket_arrays(rng, traffic, n)
        out.append(Bucket(name, name, ids, p, g, np.arange(1, n + 1)))
    return tuple(out)


def write_scenario(folder: Path, buckets: tuple[Bucket, ...], limits: tuple[Limits, ...], max_shapes: int = 8) -> Path:
    """scenario.toml and one <name>.jsonl per bucket; returns the scenario path."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = [f"max_shapes = {max_shapes}"]
    for b, lim in zip(buckets, limits, strict=True):
        (folder / f"{b.name}.jsonl").write_text(requests_jsonl(b.request_ids, b.prompt_len, b.gen_len))
        lines += ["", "[[bucket]]", f'name = "{b.name}"', f'requests = "{b.name}.jsonl"']
        lines += [f"max_{name} = {float(value)!r}" for name, value in lim.items()]
    path = folder / "scenario.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def binding_limits(buckets: tuple[Bucket, ...]) -> tuple[Limits, ...]:
    """Sequential time 5% below the cells plan's, the other limits 5% above the greedy plan that meets it."""
    free = Problem(buckets, tuple(Limits() for _ in buckets), 8)
    seq = tuple(Limits(max_sequential_ms=0.95 * r.metrics.sequential_ms)
                for r in evaluated(free, pipeline.plan(free, "cells")))
    greedy = Problem(buckets, seq, 8)
    return tuple(Limits(1.05 * r.metrics.cost, 1.05 * r.metrics.pad_ratio, 1.05 * r.metrics.p95_latency_ms,
                        lim.max_sequential_ms)
                 for r, lim in zip(evaluated(greedy, pipeline.plan(greedy, "greedy")), seq, strict=True))


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> Path:
    """Two buckets of 40 requests with four limits each (the sequential one binds)."""
    buckets = synthetic(40, seed=11)  # seeds 11 and 13 solve in a second; 12 takes 37 s with --max-batch-size 4
    return write_scenario(tmp_path_factory.mktemp("small"), buckets, binding_limits(buckets))


def plans_in(folder: Path) -> dict[str, list[dict]]:
    return {p.name: [json.loads(line) for line in p.read_text().splitlines()] for p in sorted(folder.glob("*.jsonl"))}


def evaluate_in_process(scenario: Path, plans: Path, *extra: str) -> int:
    return evaluate.main(["--scenario", str(scenario), "--plans", str(plans), *extra])


# ---------------------------------------------------------------- feasible runs


@pytest.mark.slow  # 2-7 s each on 2 cores: the default run's 90 s budget; cheaper siblings cover it by default
def test_feasible_scenario_writes_plans_that_evaluate_accepts(small, tmp_path):
    out = tmp_path / "out"
    # the MIP does not close its last 0.2% and would run the default 60 s
    done = run("--scenario", str(small), "--out", str(out), "--time-limit", "5", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert set(plans_in(out)) == {"plan_chat.jsonl", "plan_short.jsonl"}
    assert "OK: every plan is valid and meets every limit" in done.stdout
    assert re.search(r"total: cost \S+, lower bound \S+, gap \d", done.stdout)
    judged = run("--scenario", str(small), "--plans", str(out), cwd=tmp_path, module="model.evaluate")
    assert judged.returncode == 0, judged.stdout + judged.stderr


@pytest.mark.slow  # test_mip_known runs every backend through the planner by default
@pytest.mark.parametrize("backend", ["cpsat", "pulp"])
def test_other_backends(small, tmp_path, backend):
    out = tmp_path / "out"
    # CP-SAT cannot prove these optimal and would use the default 60 s: the limit keeps the suite fast
    done = run("--scenario", str(small), "--out", str(out), "--backend", backend, "--quiet", "--time-limit", "4",
               cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"solver: mip ({backend} " in done.stdout, re.findall(r".*(?:solver|note).*", done.stdout)
    assert evaluate_in_process(small, out) == 0


@pytest.mark.slow  # 2-7 s each on 2 cores: the default run's 90 s budget; cheaper siblings cover it by default
def test_compare_and_max_batch_size(small, tmp_path):
    out = tmp_path / "out"
    done = run("--scenario", str(small), "--out", str(out), "--compare", "--max-batch-size", "4", "--quiet",
               "--time-limit", "3", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    for bucket in ("chat", "short"):
        table = done.stdout.split(f"comparison, bucket {bucket}")[1].split("comparison, bucket")[0]
        assert "  mip (chosen)" in table
        for name in PACKERS:
            assert re.search(rf"^  {name} +(\d|cannot plan|invalid)", table, re.M), (name, table)
    plans = plans_in(out)
    assert plans and all(max(Counter(r["batch_id"] for r in records).values()) <= 4 for records in plans.values())
    assert max(Counter(r["batch_id"] for r in plans["plan_chat.jsonl"]).values()) == 4  # the cap binds
    assert evaluate_in_process(small, out) == 0


def test_strict_cost_model_on_request_files(small, tmp_path):
    """Request files instead of a scenario (no limits), judged again in strict mode."""
    files = [str(small.parent / "chat.jsonl"), str(small.parent / "short.jsonl")]
    done = run(*files, "--cost-model", "strict", "--out", "out", "--quiet", "--time-limit", "2", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "cost model strict" in done.stdout
    plans = [str(tmp_path / "out" / "plan_chat.jsonl"), str(tmp_path / "out" / "plan_short.jsonl")]
    assert evaluate.main([files[0], plans[0], files[1], plans[1], "--cost-model", "strict"]) == 0


def test_default_run_plans_the_embedded_scenario(tmp_path):
    done = run("--limit-shapes", "8", "--time-limit", "3", "--out", "tmp", "--quiet", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "data/default/scenario.toml" in done.stdout.replace("\\", "/")
    assert "cost model device" in done.stdout and "device-hours" in done.stdout
    chosen = re.search(r"chosen shapes \((\d+)\): ", done.stdout)
    assert chosen and int(chosen.group(1)) >= 2, done.stdout  # K at work: several shapes pay
    assert set(plans_in(tmp_path / "tmp")) == {"plan_chat.jsonl", "plan_short.jsonl"}
    assert evaluate_in_process(pipeline.DEFAULT_SCENARIO, tmp_path / "tmp") == 0


# ---------------------------------------------------------------- limits that cannot be met


def one_request_scenario(folder: Path, limit: str) -> None:
    """One request (64, 10): 2149.27 ms, 3649.27 with its compile spike; a plan already in out/."""
    (folder / "one.jsonl").write_text('{"request_id": "a", "prompt_len": 64, "gen_len": 10}\n')
    (folder / "scenario.toml").write_text(f'max_shapes = 8\n\n[[bucket]]\nname = "one"\nrequests = "one.jsonl"\n'
                                          f"{limit}\n")
    (folder / "out").mkdir()
    (folder / "out" / "plan_one.jsonl").write_bytes(OLD_PLAN)


def assert_nothing_written(folder: Path) -> None:
    assert sorted(p.name for p in (folder / "out").iterdir()) == ["plan_one.jsonl"]
    assert (folder / "out" / "plan_one.jsonl").read_bytes() == OLD_PLAN


def test_infeasible_limits_exit_3_and_write_nothing(tmp_path):
    one_request_scenario(tmp_path, "max_sequential_ms = 1000.0")
    done = run("--scenario", "scenario.toml", "--out", "out", "--quiet", cwd=tmp_path)
    assert done.returncode == 3, done.stdout + done.stderr
    assert "cannot all be met" in done.stderr and "sequential_ms <= 1000" in done.stderr
    assert_nothing_written(tmp_path)


@pytest.mark.parametrize("limit, said", [
    pytest.param("max_p95_latency_ms = 2249.27", "p95_latency_ms <= 2249.27", id="P95 only the spike breaks"),
    pytest.param("max_sequential_ms = 1000.0", "3649.27", id="the best sequential time is named"),
])
def test_unmeetable_limits_in_process(tmp_path, monkeypatch, capsys, limit, said):
    """The same entry point in this process (faster): exit 3, the message says ``said``, nothing written."""
    one_request_scenario(tmp_path, limit)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stop:
        run_main(lambda: solve.main(["--scenario", "scenario.toml", "--out", "out", "--quiet"]))
    err = capsys.readouterr().err
    assert_nothing_written(tmp_path)
    assert stop.value.code == 3 and said in err, err


# ---------------------------------------------------------------- the time limit


@pytest.fixture(scope="module")
def time_limited(tmp_path_factory) -> tuple[Path, Path, subprocess.CompletedProcess]:
    """2 x 1000 synthetic requests in strict mode, no limits, --time-limit 1: too big to close the gap in a second."""
    folder = tmp_path_factory.mktemp("timed")
    scenario = write_scenario(folder, synthetic(1000, seed=5), (Limits(), Limits()))
    done = run("--scenario", str(scenario), "--out", str(folder / "out"), "--time-limit", "1", "--cost-model",
               "strict", "--quiet", cwd=folder)
    return scenario, folder / "out", done


def test_time_limited_run_writes_valid_plans_and_states_its_gap(time_limited):
    scenario, out, done = time_limited
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"total: cost \S+, lower bound \S+, gap [\d.]+%", done.stdout), done.stdout
    assert evaluate_in_process(scenario, out, "--cost-model", "strict") == 0


def test_no_solver_call_may_run_past_the_deadline(monkeypatch):
    """Every LP/MIP call must be granted at most the time left before plan_mip's deadline.

    The spy makes each HiGHS call take 0.4 s, as a big instance would, so the budget really runs out.  The
    clock is a frozen fake that only the spy moves: what the planner does between two calls takes no time,
    so the check needs no margin for the host (it failed one run in three on a loaded 2-core machine, where
    the real milliseconds between granting a limit and recording the call exceeded its 50 ms allowance).
    """
    from helpers import FakeClock

    clock = FakeClock(monkeypatch, frozen=True)
    calls = []
    real = highs.BACKEND.solve

    def slow(model, options):
        calls.append((clock.now(), options.time_limit))
        clock.jump(0.4)
        # the real solve gets real time enough whatever the host's load (HiGHS keeps its own clock): only the
        # limits the planner grants are under test
        return real(model, replace(options, time_limit=60.0))

    monkeypatch.setattr(highs.BACKEND, "solve", slow)
    start = clock.now()
    plan_mip(problem(*synthetic(60, seed=3)), time_limit=1.0)
    late = [(round(t - start, 2), limit) for t, limit in calls if t + limit > start + 1.0 + 1e-9]
    assert len(calls) >= 2 and not late, f"(start s, granted s) of calls that may run past the 1 s deadline: {late}"
