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
