"""The Dask client: an existing cluster (``--scheduler ADDRESS``) or a local one for the run."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator

from model.distributed import require_dask
from model.errors import InputError

CONNECT_TIMEOUT_S = 3.0  # an unreachable scheduler is bad input within this long


@contextlib.contextmanager
def connect(address: str | None, timeout_s: float = CONNECT_TIMEOUT_S) -> Iterator:
    """A ``distributed.Client`` for the run, closed afterwards (with its local cluster, if one was started).

    Without an address a ``LocalCluster`` of worker processes (one thread each, at most 4) is started.
    """
    require_dask()
    from distributed import Client, LocalCluster

    logging.getLogger("distributed").setLevel(logging.CRITICAL)  # errors come back as our own
    if address:
        try:
            client = Client(address, timeout=timeout_s, set_as_default=False)
        except Exception as exc:  # OSError, TimeoutError, ValueError for a malformed address: all one line
            raise InputError("--scheduler", None, None,
                             f"cannot reach the Dask scheduler at {address!r} within {timeout_s:g} s: "
                             f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}".rstrip(": ")
                             ) from None
        try:
            yield client
        finally:
            client.close()
        return
    workers = max(1, min(4, os.cpu_count() or 1))
    with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None,
                      silence_logs=logging.CRITICAL) as cluster, \
            Client(cluster, set_as_default=False) as client:
        yield client
