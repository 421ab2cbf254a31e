"""Fixtures shared by test modules."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def scheduler():
    """An in-process Dask cluster for the test session (each xdist worker starts its own): the command lines
    join it with ``--scheduler``; no test stops or restarts it."""
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(processes=False, n_workers=1, threads_per_worker=2, dashboard_address=None) as c:
        yield c.scheduler_address


@pytest.fixture(autouse=True)
def no_solver_left_behind():
    """Every test starts with no native solver still running from an earlier one.

    A solve that does not stop within its grace period is left behind in its thread, and the next native call
    waits for it first, out of its own time (``model.base.runtime.run_native``).  Tests run many planners in one
    process: on a loaded host a MIP left behind by one test ate the next test's first LP, which then had no
    duals, so whether a test passed depended on the host's speed.  Waiting here, outside every test's clock,
    keeps each test's budget its own.
    """
    from model.base.runtime import settle_abandoned

    settle_abandoned(120.0)
    yield
