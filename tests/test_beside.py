"""The search over shape sets forked beside the planner (``model.planning.beside``): what it hands back is the
same bound the search finds in the planner's own process, never above the brute-force optimum, valid when it
is stopped at any moment, and the child never outlives ``collect`` (nor, by the kernel, its parent)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import brute_force
from test_limit_bound import instance as limited

from model.base.runtime import Deadline
from model.planning import beside
from model.planning.limit_bound import priced_buckets, searched

pytestmark = pytest.mark.skipif(not beside.can_fork(), reason="needs fork and a second core")
REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("seed", [0, 2, 4, 6, 8, 10])
def test_the_forked_search_finds_what_the_planners_own_finds_and_stays_below_the_optimum(seed):
    prob = limited(seed)
    priced = priced_buckets(prob, Deadline.never())
    if not priced.searches:
        pytest.skip("nothing to search")
    first = searched(priced, Deadline(0.0))  # cut before anything: every search left to the child
    assert set(first.unfinished) == {s.bucket for s in priced.searches}
    run = beside.start(priced, first, Deadline.after(60), "by")
    run.process.join(60)
    late, ended = run.collect()
    whole = searched(priced, Deadline.never())
    assert ended and not whole.unfinished
    assert late == pytest.approx(whole.bound, rel=1e-12, abs=1e-9)
    assert first.bound * (1 - 1e-12) - 1e-9 <= late <= brute_force(prob).cost * (1 + 1e-9) + 1e-9


def test_nothing_is_forked_where_every_search_ended():
    prob = limited(0)
    priced = priced_buckets(prob, Deadline.never())
    assert beside.start(priced, searched(priced, Deadline.never()), Deadline.after(60), "by") is None


def test_collect_stops_the_child_at_once_and_what_it_wrote_is_a_bound():
    """The embedded default's chat search runs for seconds: stopped after 0.3 s, the child is gone and the value
    lies between the planner's brief search and the plan's cost."""
    from model import pipeline

    prob, _ = pipeline.load_problem(pipeline.InputSpec(scenario=pipeline.DEFAULT_SCENARIO, max_shapes=8))
    priced = priced_buckets(prob, Deadline.never())
    first = searched(priced, Deadline.after(0.05))
    run = beside.start(priced, first, Deadline.after(60), "by")
    assert run is not None
    time.sleep(0.3)
    late, ended = run.collect()
    assert not run.process.is_alive() and not ended
    assert np.isfinite(late) and first.bound <= late < 455_719.6
    assert beside.raised(first.bound, "mine", None, True) == (first.bound, "mine", True)


DIE_SCRIPT = textwrap.dedent('''
    import os, sys, time
    from model import pipeline
    from model.base.runtime import Deadline
    from model.planning import beside
    from model.planning.limit_bound import priced_buckets, searched

    prob, _ = pipeline.load_problem(pipeline.InputSpec(scenario=pipeline.DEFAULT_SCENARIO, max_shapes=8))
    priced = priced_buckets(prob, Deadline.never())
    first = searched(priced, Deadline(0.0))
    beside.searched = lambda *args: time.sleep(600)  # a search that would outlive the test
    run = beside.start(priced, first, Deadline.after(600), "by")
    print(run.process.pid, flush=True)
    os._exit(0)  # the parent dies without stopping its child
''')


def test_the_child_dies_with_its_parent():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p))
    done = subprocess.run([sys.executable, "-c", DIE_SCRIPT], env=env, capture_output=True, text=True, timeout=120)
    pid = int(done.stdout.split()[0])
    end = time.monotonic() + 10
    while time.monotonic() < end and running(pid):
        time.sleep(0.05)
    assert not running(pid), "the search beside outlived its parent"


def running(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z"


def worker_can_fork(_: int) -> bool:
    return beside.can_fork()


def test_a_pools_worker_never_forks_a_search():
    """A daemonic pool worker may not have children (and its siblings hold the other cores)."""
    import multiprocessing

    with multiprocessing.get_context("fork").Pool(1) as pool:
        assert pool.map(worker_can_fork, [0]) == [False]


def test_a_bucket_too_large_for_the_planner_is_searched_beside_it_up_to_its_own_limit(monkeypatch):
    prob = limited(0)
    priced = priced_buckets(prob, Deadline.never())
    first = searched(priced, Deadline.never(), max_work=1)  # the planner's own search: every bucket too large
    assert priced.searches and not first.unfinished and set(first.too_large) == {s.bucket for s in priced.searches}
    run = beside.start(priced, first, Deadline.after(60), "by")
    run.process.join(60)
    late, ended = run.collect()
    assert ended and late == pytest.approx(searched(priced, Deadline.never()).bound, rel=1e-12, abs=1e-9)
    monkeypatch.setattr(beside, "BESIDE_MAX_WORK", 1)  # too large beside it as well: nothing is forked
    assert beside.start(priced, first, Deadline.after(60), "by") is None
