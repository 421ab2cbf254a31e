"""The run's clock and its interrupt: one deadline handed to every long phase, one flag the signal handlers set.

Signals.  ``run_main`` installs ``signal_handlers()``: SIGINT or SIGTERM records the
signal and raises ``Interrupted`` where the main thread is -- except inside a
``shielded()`` region (a native solver call, a clean-up), where it is only recorded;
the code there polls ``interrupt_signal()`` and stops its solver itself.  The command
line turns ``Interrupted`` into exit status 128 + signal (130 SIGINT, 143 SIGTERM).

Deadlines.  ``Deadline`` is an absolute ``time.perf_counter()`` instant.  A long phase
calls ``deadline.tick(phase, ...)`` between chunks of work: it raises ``Interrupted``
when a signal came, ``DeadlineExceeded`` when the time is spent, and logs progress at
least every ``PROGRESS_S`` seconds.  The phase that catches ``DeadlineExceeded`` keeps
what it had completed (a bound from fewer rounds, say) and says so.

``run_native`` runs a blocking native call in a helper thread while the main thread
waits in Python, so a signal is seen at once (a C call in the main thread would hold
it back until the call returns) and the solver is told to stop.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import NoReturn, TypeVar

log = logging.getLogger("shapeplan")

PROGRESS_S = 5.0  # a long phase says where it is at least this often
SIGNALS = (signal.SIGINT, signal.SIGTERM)
T = TypeVar("T")


class Interrupted(BaseException):
    """The run was interrupted by a signal (a BaseException like KeyboardInterrupt: nothing swallows it)."""

    def __init__(self, signum: int = signal.SIGINT):
        self.signum = int(signum)
        super().__init__(f"interrupted by {signal.Signals(self.signum).name}")

    @property
    def exit_code(self) -> int:
        """The shell's convention: 128 + the signal number (130 for SIGINT, 143 for SIGTERM)."""
        return 128 + self.signum


PR_SET_PDEATHSIG = 1  # prctl option: the signal the kernel sends this process when its parent dies


def die_with_parent(parent: int) -> None:
    """In a child process: be killed by the kernel when ``parent`` (its pid, taken before the child started) dies
    (Linux; elsewhere the child's own time limit ends it), and end at once if it already has -- the child may
    have been reparented between its start and this call."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:
        os._exit(1)


class DeadlineExceeded(Exception):
    """A phase ran out of time; whoever catches it keeps what the phase had completed."""

    def __init__(self, phase: str):
        self.phase = phase
        super().__init__(f"{phase}: time limit reached")


_state = {"signal": None, "shield": 0}
_last_progress = [time.perf_counter()]


class _ProgressClock(logging.Filter):
    """Any line of the "shapeplan" log says where the run is: the next progress line may wait."""

    def filter(self, record: logging.LogRecord) -> bool:
        _last_progress[0] = time.perf_counter()
        return True


log.addFilter(_ProgressClock())


def interrupt_signal() -> int | None:
    """The signal that interrupted the run, or None."""
    return _state["signal"]


def request_interrupt(signum: int = signal.SIGINT) -> None:
    """Record an interrupt (what the signal handler does; tests call it directly)."""
    if _state["signal"] is None:
        _state["signal"] = int(signum)


def clear_interrupt() -> None:
    _state["signal"] = None


def interrupted() -> Interrupted:
    """The exception for the recorded interrupt (SIGINT if none was recorded: a backend saw it first)."""
    return Interrupted(_state["signal"] if _state["signal"] is not None else signal.SIGINT)


def check_interrupt() -> None:
    """Raise ``Interrupted`` if a signal came."""
    if _state["signal"] is not None:
        raise Interrupted(_state["signal"])


def _handler(signum, frame) -> None:
    request_interrupt(signum)
    if _state["shield"] == 0:
        raise Interrupted(signum)


@contextmanager
def signal_handlers() -> Iterator[None]:
    """SIGINT and SIGTERM interrupt the run (see module docstring); the old handlers come back after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    clear_interrupt()
    old = {s: signal.signal(s, _handler) for s in SIGNALS}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        clear_interrupt()


@contextmanager
def shielded() -> Iterator[None]:
    """A region a signal must not break into (a native call, a clean-up): it is only recorded here.

    The region polls ``interrupt_signal()`` itself; on leaving, nothing is raised, so
    the caller decides (a backend returns INTERRUPTED, a clean-up finishes first).
    """
    _state["shield"] += 1
    try:
        yield
    finally:
        _state["shield"] -= 1


@dataclass(frozen=True)
class Deadline:
    """An absolute instant on ``time.perf_counter()``; ``math.inf`` for none."""

    at: float

    @staticmethod
    def after(seconds: float) -> Deadline:
        return Deadline(time.perf_counter() + seconds)

    @staticmethod
    def never() -> Deadline:
        return Deadline(math.inf)

    def left(self) -> float:
        """Seconds left (0 once passed)."""
        return max(0.0, self.at - time.perf_counter())

    def expired(self) -> bool:
        return time.perf_counter() >= self.at

    def within(self, seconds: float) -> Deadline:
        """The earlier of this deadline and ``seconds`` from now."""
        return Deadline(min(self.at, time.perf_counter() + max(0.0, seconds)))

    def share(self, fraction: float) -> Deadline:
        """The earlier of this deadline and ``fraction`` of the time left from now."""
        return self.within(fraction * self.left())

    def tick(self, phase: str, progress: str = "", *args) -> None:
        """Between two chunks of a long phase: stop on a signal or at the deadline, say where we are."""
        check_interrupt()
        now = time.perf_counter()
        if now >= self.at:
            raise DeadlineExceeded(phase)
        if now - _last_progress[0] >= PROGRESS_S:
            _last_progress[0] = now
            log.info("%s: " + (progress or "working") + "%s", phase, *args, self.left_text())

    def left_text(self) -> str:
        """`` (12.5 s left)`` for a progress line, or nothing without a deadline (not "inf s left")."""
        return f" ({self.left():.1f} s left)" if math.isfinite(self.at) else ""


MIN_RUN_S = 1e-3  # a run is granted at least this (a positive limit); past the deadline it returns at once


class RunBudget:
    """One ``--time-limit`` for a whole run of many MIP solves (a sweep, its hold-out checks, an audit).

    Each MIP run gets an equal share of the time left among the MIP runs still to come, so one that ends early
    leaves its time to the next, and the last ends by the deadline; a packer (milliseconds) may use what is
    left.  Before, every sweep point's MIP had the whole limit (``--time-limit 20`` with K = 1-16: 320 s).
    Mutable on purpose: it counts the runs as they are handed out, in the one thread that runs them.
    """

    def __init__(self, deadline: Deadline, mip_runs: int) -> None:
        self.deadline, self.mip_runs_left = deadline, max(0, mip_runs)

    def next_limit(self, mip: bool = True) -> float:
        """The limit of the next planner run (a MIP run is counted off)."""
        left = self.deadline.left()
        if not mip:
            return max(MIN_RUN_S, left)
        share = left / max(1, self.mip_runs_left)
        self.mip_runs_left = max(0, self.mip_runs_left - 1)
        return max(MIN_RUN_S, share)


class BuildClock:
    """Paces a model build row by row: stops it (DeadlineExceeded) once it cannot end in time.

    ``then`` is the work that must follow the build, in build-times (PuLP writes its MPS
    file in about the build's time): at ``done`` of ``total`` rows the projected end is
    start + elapsed / done * total * (1 + then).  A build that cannot finish is stopped
    early, not at the deadline, so its time is not spent for nothing.
    """

    def __init__(self, what: str, total: int, until: float, then: float = 0.0):
        self.what, self.total, self.until, self.then = what, max(total, 1), until, then
        self.start = time.perf_counter()

    def row(self, done: int) -> None:
        now = time.perf_counter()
        projected = self.start + (now - self.start) / max(done, 1) * self.total * (1.0 + self.then)
        if now > self.until or (done >= self.total // 10 and projected > self.until):
            raise DeadlineExceeded(self.what)
        still_running(f"{self.what} ({done} of {self.total} rows)", self.start, self.until,
                      projected if done else None)


def still_running(what: str, since: float, until: float = math.inf, ends: float | None = None) -> None:
    """A progress line for a call that cannot tick itself (a native solve), at most every PROGRESS_S: how long it
    has run of the time it was given, and when it should end where that is known."""
    now = time.perf_counter()
    if now - _last_progress[0] >= PROGRESS_S:
        log.info("%s: %s", what, running_text(now - since, until - since, None if ends is None else ends - now))


def running_text(elapsed: float, limit: float = math.inf, eta: float | None = None) -> str:
    """``still running (12 s of 60 s, about 20 s to go)``: elapsed of the limit (when there is one) and the
    estimated time to the end (when one is known)."""
    parts = [f"{elapsed:.0f} s" + (f" of {limit:.0f} s" if math.isfinite(limit) else "")]
    if eta is not None and math.isfinite(eta):
        parts.append(f"about {max(0.0, eta):.0f} s to go")
    return f"still running ({', '.join(parts)})"


@dataclass(frozen=True)
class NativeRun:
    """How a native call ended: its result, whether a signal stopped it, whether it was left behind."""

    result: object
    interrupted: bool
    abandoned: bool  # it did not stop when told; its thread was left running (result is None)


_abandoned: list[threading.Thread] = []


def run_native(call: Callable[[], T], stop: Callable[[], None], until: float = math.inf,
               grace_s: float = 1.0, what: str = "solver") -> NativeRun:
    """Run a blocking native call in a helper thread; the main thread waits where signals reach it.

    ``stop()`` is called once when a signal comes or ``until`` passes; the solver should
    then return soon with what it has.  A solver that does not return within
    ``grace_s`` of being told (a phase that polls no callback: HiGHS's root LP inside
    a MIP ran seconds past its limit) is left behind in its daemon thread, so neither a
    deadline nor an exit waits for it; the next native call waits for it first (two
    solves of one library at once are not something to rely on), and if it is still
    running at ``until``, that call is not made (reported as left behind too).  An
    exception raised by the call is raised here.  A progress line says ``what`` runs at
    least every PROGRESS_S.
    """
    if not _drain_abandoned(until):
        return NativeRun(None, interrupt_signal() is not None, True)
    box: dict[str, object] = {}

    def body() -> None:
        try:
            box["result"] = call()
        except BaseException as exc:  # handed to the main thread
            box["error"] = exc

    worker = threading.Thread(target=body, name="shapeplan-solver", daemon=True)
    stopped_at = None
    started = time.perf_counter()
    with shielded():
        worker.start()
        while worker.is_alive():
            try:
                worker.join(0.05)
            except KeyboardInterrupt:  # no handler of ours installed (library use): the same as a signal
                request_interrupt(signal.SIGINT)
            still_running(what, started, until)
            if stopped_at is None and (interrupt_signal() is not None or time.perf_counter() >= until):
                stopped_at = time.perf_counter()
                stop()
            if stopped_at is not None and worker.is_alive() and time.perf_counter() - stopped_at > grace_s:
                log.info("%s did not stop within %.1f s of being told; leaving it behind", what, grace_s)
                _abandoned.append(worker)
                return NativeRun(None, interrupt_signal() is not None, True)
    if "error" in box:
        raise box["error"]
    return NativeRun(box.get("result"), interrupt_signal() is not None, False)


def settle_abandoned(timeout: float) -> bool:
    """Give solver threads left behind up to ``timeout`` seconds to end; True if none is left running.

    A left-behind solver still calls back into Python; doing that while the interpreter
    shuts down can abort the process, so an exit with one still running skips the
    shutdown (see ``model.cli_common.run_main``).
    """
    end = time.perf_counter() + timeout
    with shielded():
        for worker in list(_abandoned):
            while worker.is_alive() and time.perf_counter() < end and interrupt_signal() is None:
                worker.join(0.05)
    _abandoned[:] = [w for w in _abandoned if w.is_alive()]
    return not _abandoned


def leave(code: int, wait_s: float) -> NoReturn:
    """End the process with ``code``; past a solver still left behind after ``wait_s``, without the shutdown.

    HiGHS left running in a daemon thread aborted the interpreter's shutdown ("terminate
    called without an active exception", exit 134) when it next called back into Python.
    """
    if not settle_abandoned(wait_s):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


def _drain_abandoned(until: float) -> bool:
    """Wait for solver threads left behind earlier, until ``until`` or a signal; True if none is left."""
    with shielded():
        for worker in list(_abandoned):
            while worker.is_alive() and interrupt_signal() is None and time.perf_counter() < until:
                worker.join(0.05)
    _abandoned[:] = [w for w in _abandoned if w.is_alive()]
    return not _abandoned
