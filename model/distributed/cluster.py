"""The Dask client: an existing cluster (``--scheduler ADDRESS``) or a local one for the run."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Iterator

from model.base.errors import InputError
from model.distributed import require_dask

CONNECT_TIMEOUT_S = 3.0  # an unreachable scheduler is bad input within this long


@contextlib.contextmanager
def connect(address: str | None, timeout_s: float | None = None) -> Iterator:
    """A ``distributed.Client`` for the run, closed afterwards (with its local cluster, if one was started).

    Without an address a ``LocalCluster`` of worker processes (one thread each, at most 4) is started.
    """
    require_dask()
    from distributed import Client, LocalCluster

    timeout_s = CONNECT_TIMEOUT_S if timeout_s is None else timeout_s

    logging.getLogger("distributed").setLevel(logging.CRITICAL)  # errors come back as our own
    if address:
        try:
            probe(address, timeout_s)
            client = _client_class()(address, timeout=timeout_s, set_as_default=False)
            client.opened = True
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
    # the HTTP servers on free ports (":0"): with the default 8787, a second run at once found the port
    # taken and printed a warning about it
    with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=":0",
                      worker_dashboard_address=":0", silence_logs=logging.CRITICAL) as cluster, \
            Client(cluster, set_as_default=False) as client:
        yield client


def probe(address: str, timeout_s: float) -> None:
    """Ask whatever listens at a TCP address who it is, all within ``timeout_s``: a malformed address, nothing
    listening, or something that is no Dask scheduler fails here, before a Client is built.  (A Client pointed
    at a server that answers junk can wait far past its own timeout; one that fails to connect is left to the
    garbage collector, whose clean-up prints a traceback.)"""
    from distributed.comm.addressing import parse_address

    scheme, _ = parse_address(address)
    if scheme != "tcp":  # inproc (this process), tls (needs the cluster's security settings), ...: the Client's own
        return
    reply = asyncio.run(asyncio.wait_for(_identity(address, timeout_s), timeout_s))
    if not isinstance(reply, dict) or reply.get("type") != "Scheduler":
        raise ConnectionError("what answers there is not a Dask scheduler")


async def _identity(address: str, timeout_s: float):
    from distributed.comm import connect as comm_connect

    comm = await comm_connect(address, timeout=timeout_s)
    try:
        await comm.write({"op": "identity", "reply": True})
        return await comm.read()
    finally:
        comm.abort()


def _client_class():
    """``distributed.Client`` whose clean-up at garbage collection runs only if it ever connected: one that failed to
    connect (what answered was no scheduler) would print a traceback and wait seconds for a close that cannot
    happen, after the one-line error."""
    from distributed import Client

    class _Client(Client):
        opened = False

        def __del__(self):
            if self.opened:
                super().__del__()

    return _Client
