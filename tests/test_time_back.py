"""Time worth spending (issue 22 item 3): a MIP that finds nothing better for a while gives its time back, and
the report says which method found the plan, which gave the bound, why the run ended and whether more time
could help -- apart from the status, which says "time limit" only when the clock stopped the search."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from test_backends import arrays, market_split

from model.base.runtime import Deadline
from model.planning.contract import Candidates, how_it_ended, plan_method, select
from solvers.backends import get_backend
from solvers.backends.highs import Stall, stalled_result
from solvers.backends.result import Feature, SolveOptions, Status


@dataclass(frozen=True)
class Plan:
    """A judged candidate as ``select`` sees it."""

    name: str
    cost: float
    notes: tuple[str, ...] = ()


def test_a_mip_no_cheaper_than_its_start_is_named_by_the_start():
    assert plan_method(Plan("mip", 100.0), ("exact-runs start", 100.0)).startswith("exact-runs start")
    assert plan_method(Plan("mip", 99.0), ("exact-runs start", 100.0)) == "mip"
    assert plan_method(Plan("dpfill", 100.0), ("exact-runs start", 100.0)) == "dpfill"
    assert plan_method(Plan("mip", 100.0), None) == "mip"


def found(status: Status, stalled: bool, deadline: Deadline, bound: float = 90.0) -> Candidates:
    return Candidates((Plan("mip", 100.0),), bound, "highs", "1", time.perf_counter(), deadline, status,
                      bound_by="LP-price bound", stalled=stalled, start=("exact-runs start", 100.0))


def test_a_stalled_search_is_feasible_not_a_time_limit_and_says_more_time_is_unlikely_to_help():
    _, rep = select(found(Status.FEASIBLE, True, Deadline.after(60)))
    assert rep.status is Status.FEASIBLE
    assert rep.plan_by.startswith("exact-runs start") and rep.bound_by == "LP-price bound"
    assert "stalled" in rep.termination and rep.more_time.startswith("unlikely")


def test_a_bound_search_stopped_unfinished_says_more_time_could_raise_the_bound():
    from dataclasses import replace

    stalled = replace(found(Status.FEASIBLE, True, Deadline.after(60)), bound_open=True)
    _, rep = select(stalled)
    assert rep.status is Status.FEASIBLE and "stalled" in rep.termination
    assert rep.more_time.startswith("for the bound, possibly") and "for the plan, unlikely" in rep.more_time
    _, rep = select(replace(found(Status.FEASIBLE, False, Deadline.after(60)), bound_open=True))
    assert rep.termination.startswith("the search finished") and rep.more_time.startswith("for the bound, possibly")
    _, rep = select(replace(stalled, bound=100.0))  # at gap 0 nothing is open
    assert rep.more_time.startswith("no")


def test_only_the_clock_makes_a_time_limit_and_then_more_time_might_help():
    _, rep = select(found(Status.TIME_LIMIT_FEASIBLE, False, Deadline(0.0)))
    assert rep.status is Status.TIME_LIMIT_FEASIBLE
    assert rep.more_time.startswith("possibly")
    ended, more = how_it_ended(0.0, found(Status.TIME_LIMIT_FEASIBLE, False, Deadline(0.0), bound=100.0))
    assert more.startswith("no")  # at gap 0 the clock does not matter


def test_the_stall_clock_restarts_only_on_a_better_incumbent():
    stall = Stall(1e6, time.perf_counter())
    assert not stall.due()
    stall = Stall(0.0, time.perf_counter() - 1.0)
    assert stall.due() and stall.hit
    stall = Stall(30.0, time.perf_counter() - 60.0)
    stall.found(10.0)  # better than nothing: the clock restarts
    assert not stall.due()
    before = stall.improved
    stall.found(10.0)  # the same objective again is no progress
    assert stall.improved == before


def test_a_stalled_result_keeps_its_solution_as_feasible_and_marks_it():
    model = arrays([1.0, 1.0], [0, 0], [1, 1], [({0: 1.0, 1: 1.0}, 1.0, 2.0)])
    got = stalled_result(model, np.array([1.0, 0.0]), time.perf_counter(), 2.0)
    assert got.status is Status.FEASIBLE and got.stalled and got.objective == 1.0
    none = stalled_result(model, None, time.perf_counter(), 2.0)
    assert none.status is Status.TIME_LIMIT_NO_SOLUTION and none.stalled and none.x is None


def test_highs_gives_back_the_time_of_a_mip_that_finds_nothing():
    """Market split is hopeless for branch and bound: with a stall of 0.2 s the call ends stalled, long before
    its 60 s limit would (the test waits for the answer, it does not time it)."""
    highs = get_backend("highs")
    assert Feature.STALL in highs.features
    got = highs.solve(market_split(), SolveOptions(time_limit=60.0, stall_s=0.2))
    assert got.stalled and got.status in (Status.TIME_LIMIT_NO_SOLUTION, Status.FEASIBLE)


HIGHS_ORPHAN = """
import logging, os, sys, threading, time
sys.path.insert(0, sys.argv[1])
from test_backends import market_split
from solvers.backends.highs import solve_in_child
from solvers.backends.result import SolveOptions

class Pid(logging.Handler):
    def emit(self, record):
        if "in its own process" in record.getMessage():
            print(record.args[0], flush=True)
            # once the model is sent and HiGHS runs, the planner dies without stopping its solver
            threading.Timer(1.5, os._exit, (0,)).start()

logging.getLogger("shapeplan").addHandler(Pid())
logging.getLogger("shapeplan").setLevel(logging.INFO)
solve_in_child(market_split(), SolveOptions(time_limit=120.0))  # the child process whatever the model's size
"""


def test_a_highs_process_dies_with_a_killed_planner():
    """A SIGKILLed planner cannot stop its HiGHS process; the kernel must (the child asks it to at its start)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from test_beside import running

    repo = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(repo), os.environ.get("PYTHONPATH", "")) if p))
    done = subprocess.run([sys.executable, "-c", HIGHS_ORPHAN, str(repo / "tests")], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, timeout=120)
    pid = int(done.stdout.split()[0])
    end = time.monotonic() + 10
    while time.monotonic() < end and running(pid):
        time.sleep(0.05)
    alive = running(pid)
    if alive:
        os.kill(pid, 9)
    assert not alive, "the HiGHS process outlived its planner"
