"""Device mode: the search over shape sets (``limit_bound.searched``) on a second core while the plan is made.

Why.  On the embedded default the search proves the chat bucket's bound over every shape set exact after
about 1,400 node pricings, some 4 s on one core, while the planner's own phases after the bound's tables
(the flow MIP, the exact re-batching, the chain's shape moves) keep the first core busy for about as long;
inside the bound's share of the deadline the search would get about 1 s.  So the planner searches briefly
in its own process (enough for small buckets to end exact), and where a search is left unfinished and a
second core is free, it forks a process that searches on, from the same tables, until the planner is about
to report (``Beside.collect``) or the run's deadline.

Why a value read at any instant is valid.  The frontier's least is a bound at every moment of the search, so
the child writes each higher bound as it finds it, one aligned 8-byte store into shared memory (a torn read
cannot happen), and the planner reads the last one after stopping the child.  The child ignores SIGINT (the
planner alone handles a signal and stops it), is killed by the kernel if the planner dies (Linux), and ends
by itself at the deadline.  Forking copies the tables (nothing is pickled); without ``fork`` or a second
core nothing is forked and the planner's own brief search is what it reports.
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import os
import signal
from dataclasses import replace

import numpy as np

from model.base.runtime import Deadline, die_with_parent
from model.planning.limit_bound import LimitBound, Priced, searched
from model.planning.parallel import workers_available
from model.planning.prefix_bound import BESIDE_MAX_WORK

log = logging.getLogger("shapeplan")



class Beside:
    """A running search beside the planner: ``collect`` stops it and returns the highest bound it wrote."""

    def __init__(self, process: multiprocessing.process.BaseProcess, shared: ctypes.Array, bound_by: str):
        self.process, self.shared, self.bound_by = process, shared, bound_by

    def stop(self) -> None:
        """Stop the child now (idempotent; a child that ended by itself is only reaped)."""
        if self.process.is_alive():
            self.process.kill()
        self.process.join()

    def collect(self, until: Deadline = Deadline(0.0), above: float = np.inf) -> tuple[float, bool]:
        """The highest bound the child wrote and whether its search ended (every bucket exact), the child
        stopped first; while it still runs and its bound is below ``above``, it is waited for until ``until``."""
        while self.process.is_alive() and self.shared[0] < above and not until.expired():
            self.process.join(min(0.05, until.left()))
        self.stop()
        return float(self.shared[0]), self.shared[1] > 0.5


def can_fork() -> bool:
    """A second core, the ``fork`` start method (the child inherits the tables instead of unpickling them), and
    not a pool's worker (a daemonic process may not have children; its siblings hold the other cores)."""
    return workers_available() >= 2 and "fork" in multiprocessing.get_all_start_methods() \
        and not multiprocessing.current_process().daemon


def start(priced: Priced, first: LimitBound, deadline: Deadline, bound_by: str) -> Beside | None:
    """Fork the search on over the buckets ``first`` (the planner's own brief search) left unfinished or found too
    large for itself (up to ``prefix_bound.BESIDE_MAX_WORK``), from its own bounds; None where nothing is left,
    the deadline has passed or no second core can take it."""
    left = {*first.unfinished, *(b for b in first.too_large
                                 if next(t for t in priced.searches if t.bucket == b).work <= BESIDE_MAX_WORK)}
    if not left or deadline.expired() or not can_fork():
        return None
    rest = replace(priced, owns=first.bucket_bounds, searches=tuple(s for s in priced.searches if s.bucket in left))
    context = multiprocessing.get_context("fork")
    shared = context.Array(ctypes.c_double, [first.bound, 0.0], lock=False)  # the bound, whether it ended
    process = context.Process(target=child, args=(rest, deadline, shared, os.getpid()), daemon=True)
    process.start()
    log.info("the search over shape sets goes on beside the planner (process %d, buckets %s)", process.pid,
             ", ".join(rest.one.buckets[b].name for b in sorted(left)))
    return Beside(process, shared, bound_by)


def child(rest: Priced, deadline: Deadline, shared: ctypes.Array, parent: int) -> None:
    """The forked search: every higher bound into ``shared[0]``; any failure ends it silently (what it wrote
    stays valid, and the planner never depends on it)."""
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        die_with_parent(parent)

        def write(bound: LimitBound) -> None:
            if bound.bound > shared[0]:
                shared[0] = bound.bound

        last = searched(rest, deadline, write, BESIDE_MAX_WORK)
        write(last)
        shared[1] = 0.0 if last.unfinished or last.too_large else 1.0
    except BaseException:  # noqa: BLE001 -- the child's only duty is to leave a valid bound behind
        os._exit(1)
    os._exit(0)


def raised(bound: float, by: str, beside: Beside | None, open_: bool, until: Deadline = Deadline(0.0),
           above: float = np.inf) -> tuple[float, str, bool]:
    """The bound, its source and whether its search over shape sets was left unfinished (``open_``: by the
    planner's own), after the search beside the planner (waited for until ``until`` while its bound is below
    ``above``): whichever bound is higher (both are bounds)."""
    if beside is None:
        return bound, by, open_
    late, ended = beside.collect(until, above)
    if np.isfinite(late) and late > bound:
        return late, beside.bound_by, not ended
    return bound, by, not ended
