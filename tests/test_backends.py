"""The backend contract: every backend is a ``Backend`` with its features, maps every native status through one
table, keeps both sides of a ranged row, agrees on LP duals, and stops on an interrupt without leaving a solver
process or a temporary file behind.

Models here are built by hand as ``MipArrays`` (a few columns), so each test pins one behaviour of the
translation rather than of the planner.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from pathlib import Path

import highspy
import numpy as np
import pulp
import pytest
from ortools.sat.python import cp_model_helper

from model.base.errors import InputError
from model.base.runtime import clear_interrupt, request_interrupt
from solvers.backends import BACKEND_MODULES, Backend, get_backend
from solvers.backends import cpsat as cpsat_module
from solvers.backends import highs as highs_module
from solvers.backends import pulp_cbc as pulp_module
from solvers.backends.milp import MipArrays
from solvers.backends.result import Feature, SolveOptions, Status, mapped

pytestmark = pytest.mark.filterwarnings("ignore:.*PuLP 4.0:DeprecationWarning")
BACKENDS = tuple(BACKEND_MODULES)


def arrays(c, lb, ub, rows: list[tuple[dict[int, float], float, float]], integer=True) -> MipArrays:
    """A model from dense-ish pieces: each row is ({column: coefficient}, row_lo, row_hi)."""
    r, k, v = [], [], []
    for i, (coefs, _, _) in enumerate(rows):
        for col, val in coefs.items():
            r.append(i)
            k.append(col)
            v.append(val)
    n = len(c)
    return MipArrays(np.asarray(c, float), np.asarray(lb, float), np.asarray(ub, float), np.full(n, integer),
                     np.asarray(r, np.int64), np.asarray(k, np.int64), np.asarray(v, float),
                     np.asarray([lo for _, lo, _ in rows], float), np.asarray([hi for _, _, hi in rows], float),
                     (), ())


# ---------------------------------------------------------------- the contract


@pytest.mark.parametrize("name", BACKENDS)
def test_get_backend_returns_one_object_that_is_a_backend(name):
    backend = get_backend(name)
    assert isinstance(backend, Backend) and backend is get_backend(name)
    assert backend.name == name and backend.version()
    assert isinstance(backend.features, frozenset) and backend.features <= set(Feature)
    assert {Feature.MIP, Feature.TIME_LIMIT, Feature.INTERRUPT, Feature.WARM_START} <= backend.features


def test_features_say_what_each_backend_lacks():
    assert Feature.LP_DUALS not in get_backend("cpsat").features and Feature.LP not in get_backend("cpsat").features
    assert Feature.LOWER_BOUND not in get_backend("pulp").features
    assert {Feature.LP_DUALS, Feature.LOWER_BOUND} <= get_backend("highs").features


def test_an_unknown_backend_is_bad_input():
    with pytest.raises(InputError, match="unknown backend 'gurobi'"):
        get_backend("gurobi")


# ---------------------------------------------------------------- status tables


def test_highs_table_maps_every_model_status():
    assert set(highs_module.HIGHS_STATUS) == set(highspy.HighsModelStatus.__members__.values())


def test_cpsat_table_maps_every_solver_status():
    assert set(cpsat_module.CPSAT_STATUS) == set(cp_model_helper.CpSolverStatus.__members__.values())


@pytest.mark.parametrize("table", [highs_module.HIGHS_STATUS, cpsat_module.CPSAT_STATUS, pulp_module.PULP_STATUS],
                         ids=["highs", "cpsat", "pulp"])
def test_no_status_claims_a_solution_that_did_not_come_back(table):
    claims = {Status.FEASIBLE, Status.TIME_LIMIT_FEASIBLE}
    assert all(without not in claims for _, without in table.values())
    assert all(isinstance(s, Status) for pair in table.values() for s in pair)


@pytest.mark.parametrize("line, values, expected", [
    ("Optimal - objective value 12.00000000", True, Status.OPTIMAL),
    ("Stopped on time - objective value 12.00000000", True, Status.TIME_LIMIT_FEASIBLE),
    ("Stopped on ctrl-c - objective value 12.00000000", True, Status.TIME_LIMIT_FEASIBLE),
    ("Stopped on time (no integer solution - continuous used) - objective value 3.5", True,
     Status.TIME_LIMIT_NO_SOLUTION),
    ("Infeasible - objective value 0.00000000", False, Status.INFEASIBLE),
    ("Integer infeasible - objective value 0.00000000", False, Status.INFEASIBLE),
    ("Unbounded - objective value 0.00000000", False, Status.ERROR),
    ("Optimal - objective value 12.00000000", False, Status.ERROR),
    ("Something else entirely", True, Status.ERROR),
])
def test_cbc_status_lines_through_pulp_and_the_table(tmp_path, line, values, expected):
    """CBC's first solution-file line, read by PuLP's own reader, then mapped by the backend's one table."""
    sol = tmp_path / "x.sol"
    sol.write_text(line + "\n")
    native = pulp.COIN_CMD.get_status(None, str(sol))
    assert mapped(pulp_module.PULP_STATUS, native, values) is expected


@pytest.mark.parametrize("native, has, expected", [
    (highspy.HighsModelStatus.kTimeLimit, True, Status.TIME_LIMIT_FEASIBLE),
    (highspy.HighsModelStatus.kTimeLimit, False, Status.TIME_LIMIT_NO_SOLUTION),
    (highspy.HighsModelStatus.kInterrupt, False, Status.TIME_LIMIT_NO_SOLUTION),
    (highspy.HighsModelStatus.kInfeasible, False, Status.INFEASIBLE),
    (highspy.HighsModelStatus.kSolveError, False, Status.ERROR),
    (highspy.HighsModelStatus.kOptimal, False, Status.ERROR),
])
def test_highs_statuses(native, has, expected):
    assert mapped(highs_module.HIGHS_STATUS, native, has) is expected


def test_status_text_for_messages():
    assert Status.TIME_LIMIT_NO_SOLUTION.text == "time limit, no solution"
    assert Status.TIME_LIMIT_FEASIBLE.value == "time_limit" and str(Status.OPTIMAL) == "optimal"


# ---------------------------------------------------------------- translation


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("cost, best", [(1.0, 2.0), (-1.0, 5.0)], ids=["lower side binds", "upper side binds"])
def test_a_ranged_row_keeps_both_sides(name, cost, best):
    """2 <= x <= 5 for x in 0..10: dropping the lower side makes min x = 0, dropping the upper makes min -x = -10."""
    model = arrays([cost], [0.0], [10.0], [({0: 1.0}, 2.0, 5.0)])
    out = get_backend(name).solve(model, SolveOptions(time_limit=10))
    assert out.status is Status.OPTIMAL and out.x[0] == pytest.approx(best), (out.status, out.x)


@pytest.mark.parametrize("name", BACKENDS)
def test_free_and_equality_rows(name):
    """A row free on both sides constrains nothing; an equality row holds exactly."""
    model = arrays([1.0, 1.0], [0.0, 0.0], [9.0, 9.0],
                   [({0: 1.0, 1: 1.0}, -np.inf, np.inf), ({0: 1.0, 1: 2.0}, 7.0, 7.0)])
    out = get_backend(name).solve(model, SolveOptions(time_limit=10))
    assert out.status is Status.OPTIMAL and out.objective == pytest.approx(4.0), (out.status, out.x)


@pytest.mark.parametrize("name", BACKENDS)
def test_a_proven_infeasible_model(name):
    model = arrays([1.0], [0.0], [3.0], [({0: 1.0}, 5.0, np.inf)])
    out = get_backend(name).solve(model, SolveOptions(time_limit=10))
    assert out.status is Status.INFEASIBLE and not out.has_solution


def test_cpsat_infeasible_on_rounded_rows_is_no_proof():
    """0.5 x <= 0.7 with x >= 2 is infeasible, but CP-SAT saw rounded coefficients: it may not call that a proof."""
    model = arrays([1.0], [2.0], [3.0], [({0: 0.5}, -np.inf, 0.7)])
    out = get_backend("cpsat").solve(model, SolveOptions(time_limit=10))
    assert out.status is Status.ERROR and "rounded" in out.native


@pytest.mark.parametrize("name", ["highs", "pulp"])
def test_lp_duals_agree_between_backends(name):
    """min 2x + 3y, x + y >= 4 (ranged, lower side binds), x <= 3: duals 3 and -1 in HiGHS's convention."""
    model = arrays([2.0, 3.0], [0.0, 0.0], [np.inf, np.inf], [({0: 1.0, 1: 1.0}, 4.0, 100.0),
                                                              ({0: 1.0}, -np.inf, 3.0)], integer=False)
    out = get_backend(name).solve(model, SolveOptions(time_limit=10, relax=True))
    assert out.status is Status.OPTIMAL and out.objective == pytest.approx(9.0)
    assert out.row_duals == pytest.approx([3.0, -1.0]), out.row_duals


# ---------------------------------------------------------------- interrupts


def market_split(m: int = 4, n: int = 40, seed: int = 1) -> MipArrays:
    """Cornuejols-Dawande market split: equality rows over binaries, hopeless for branch and bound in seconds."""
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 100, (m, n))
    rows = [({j: float(a[i, j]) for j in range(n)}, float(a[i].sum() // 2), float(a[i].sum() // 2))
            for i in range(m)]
    return arrays(np.zeros(n), np.zeros(n), np.ones(n), rows)


def solver_processes(marker: str, exclude: tuple[int, ...] = ()) -> list[int]:
    """Pids of other live processes whose command line or environment mentions ``marker`` (a private
    temporary folder: CBC's files live there, and every child process inherits TMPDIR)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) not in (os.getpid(), *exclude):
            try:
                seen = (entry / "cmdline").read_bytes() + b"\0" + (entry / "environ").read_bytes()
            except OSError:
                continue
            if marker.encode() in seen and b"State:\tZ" not in (entry / "status").read_bytes():
                found.append(int(entry.name))
    return found


@pytest.fixture
def private_tmp(tmp_path, monkeypatch):
    """A temporary folder of the test's own for everything tempfile hands out."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    monkeypatch.setenv("TMPDIR", str(folder))
    yield folder
    clear_interrupt()


# a MIP above highs.CHILD_MIN_COLS columns runs in a child process of its own
CASES = [*((name, 40) for name in BACKENDS), ("highs", highs_module.CHILD_MIN_COLS + 1000)]
CASE_IDS = [*BACKENDS, "highs-child-process"]


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="needs /proc to look for solver processes")
@pytest.mark.parametrize("name, n", CASES, ids=CASE_IDS)
def test_an_interrupt_stops_the_solver_and_leaves_nothing_behind(name, n, private_tmp):
    """The signal handler's flag, set 0.5 s into a hopeless MIP: INTERRUPTED within a second or two, no solver
    process (CBC, HiGHS's child) and no file left in the temporary folder."""
    timer = threading.Timer(0.5, request_interrupt)
    timer.start()
    t0 = time.perf_counter()
    try:
        out = get_backend(name).solve(market_split(n=n), SolveOptions(time_limit=30))
    finally:
        timer.cancel()
        clear_interrupt()
    assert out.status is Status.INTERRUPTED, out
    assert time.perf_counter() - t0 < 3.0
    assert not solver_processes(str(private_tmp))
    assert not list(private_tmp.iterdir())


@pytest.mark.parametrize("name, n", CASES, ids=CASE_IDS)
def test_the_time_limit_holds_without_a_solution(name, n, private_tmp):
    """A hopeless MIP with a 1 s limit ends as TIME_LIMIT_NO_SOLUTION (not infeasible, not an error) in time."""
    t0 = time.perf_counter()
    out = get_backend(name).solve(market_split(n=n), SolveOptions(time_limit=1.0))
    assert out.status is Status.TIME_LIMIT_NO_SOLUTION, out
    assert time.perf_counter() - t0 < 2.5
    assert not list(private_tmp.iterdir())
    assert not solver_processes(str(private_tmp))


def test_a_big_mip_with_no_time_to_start_a_child_returns_its_warm_start_at_once(monkeypatch):
    """Starting HiGHS's child process costs about a second on a big model; with less time left than that the
    call returns the warm start (or no solution) without starting one, instead of overrunning its deadline."""
    n = highs_module.CHILD_MIN_COLS + 1000
    model = arrays(np.arange(n, dtype=float), np.zeros(n), np.ones(n), [({j: 1.0 for j in range(n)}, 1.0, np.inf)])
    started = []
    monkeypatch.setattr(highs_module, "solve_in_child", lambda *a: started.append(a))
    start = np.zeros(n)
    start[5] = 1.0
    limit = highs_module.child_start_s(model) * 0.9
    out = get_backend("highs").solve(model, SolveOptions(time_limit=limit, warm_start=start))
    assert out.status is Status.TIME_LIMIT_FEASIBLE and out.objective == pytest.approx(5.0) and not started
    out = get_backend("highs").solve(model, SolveOptions(time_limit=limit))
    assert out.status is Status.TIME_LIMIT_NO_SOLUTION and out.x is None and not started
    get_backend("highs").solve(model, SolveOptions(time_limit=limit / 0.8))
    assert len(started) == 1


def test_the_cbc_runner_cleans_up_when_cbc_fails(private_tmp, monkeypatch):
    """A CBC that exits with an error is an ERROR result and leaves no file behind."""
    monkeypatch.setattr(pulp.PULP_CBC_CMD, "pulp_cbc_path", "/bin/false")
    out = get_backend("pulp").solve(arrays([1.0], [0.0], [1.0], [({0: 1.0}, 0.0, 1.0)]), SolveOptions(time_limit=5))
    assert out.status is Status.ERROR and "exit status" in out.native
    assert not list(private_tmp.iterdir())
    assert os.path.isdir(private_tmp)
