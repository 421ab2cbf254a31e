"""Independent work items (windows, or chunks of them) on several processes where that pays.

The work's shared data (the problem, the window pools) is put in a module global before
the worker processes are forked, so workers inherit it instead of unpickling it per
task; only the items and the results cross process boundaries.  Small jobs, a single
core, or a platform without ``fork`` run in this process: a fork costs tens of
milliseconds, more than a few small windows take.

Workers ignore SIGINT and keep the default SIGTERM: the parent alone handles a signal
(its handler raises ``Interrupted`` in ``run_items``), and the pool is then terminated,
so no worker outlives the run.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from collections.abc import Callable, Sequence
from typing import Any

_SHARED: Any = None


def shared() -> Any:
    """The data ``run_items`` shares with its workers (set for the duration of one call)."""
    return _SHARED


def workers_available() -> int:
    """Cores this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def run_items(fn: Callable[[Any], Any], items: Sequence[Any], data: Any, parallel: bool) -> list[Any]:
    """``[fn(item) for item in items]``, with ``data`` reachable through ``shared()``; on up to as many
    processes as there are cores when ``parallel`` (and more than one item and core)."""
    global _SHARED
    _SHARED = data
    try:
        n = min(workers_available(), len(items))
        if not parallel or n < 2 or "fork" not in multiprocessing.get_all_start_methods():
            return [fn(item) for item in items]
        with multiprocessing.get_context("fork").Pool(n, initializer=_worker_signals) as pool:
            # leaving the block terminates the workers, on any exit
            results = pool.map(_guarded, [(fn, item) for item in items], chunksize=1)
        for ok, value in results:
            if not ok:
                raise RuntimeError(f"a window worker failed: {value}")
        return [value for _, value in results]
    finally:
        _SHARED = None


def _guarded(task: tuple[Callable[[Any], Any], Any]) -> tuple[bool, Any]:
    """(True, fn(item)), or (False, the error as text): an exception whose class cannot be rebuilt from its
    pickle would otherwise stop the pool's result thread and leave the parent waiting for ever."""
    fn, item = task
    try:
        return True, fn(item)
    except Exception as exc:  # reported to the parent, which raises
        return False, f"{type(exc).__name__}: {exc}"


def _worker_signals() -> None:
    """A worker leaves signals to the parent: Ctrl-C (sent to the whole group) is ignored, SIGTERM kills it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def chunks(n: int, parts: int) -> list[range]:
    """0..n-1 cut into at most ``parts`` contiguous ranges of near-equal size (none empty)."""
    parts = max(1, min(parts, n))
    edges = [round(i * n / parts) for i in range(parts + 1)]
    return [range(a, b) for a, b in zip(edges[:-1], edges[1:], strict=True) if b > a]
