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
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeVar

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


class DeadlineExceeded(Exception):
    """A phase ran out of time; whoever catches it keeps what the phase had completed."""

    def __init__(self, phase: str):
        self.phase = phase
        super().__init__(f"{phase}: time limit reached")


_state = {"signal": None, "shield": 0}
_last_progress = [0.0]


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
            log.info("%s: " + (progress or "working") + " (%.1f s left)", phase, *args, self.left())


def progress_logged() -> None:
    """Another log line just said where the run is: the next progress line may wait PROGRESS_S."""
    _last_progress[0] = time.perf_counter()


def run_native(call: Callable[[], T], stop: Callable[[], None], until: float = math.inf,
               grace_s: float = 2.0) -> tuple[T | None, bool]:
    """Run a blocking native call in a helper thread; the main thread waits where signals reach it.

    ``stop()`` is called once when a signal comes or ``until`` passes (the solver should
    then return soon with what it has).  Returns (the call's result, interrupted).  If
    the call does not return within ``grace_s`` of an interrupt it is abandoned (a
    daemon thread) and (None, True) returned, so an uninterruptible native phase cannot
    hold the exit back.  An exception raised by the call is raised here.
    """
    box: dict[str, object] = {}

    def body() -> None:
        try:
            box["result"] = call()
        except BaseException as exc:  # handed to the main thread
            box["error"] = exc

    worker = threading.Thread(target=body, name="shapeplan-solver", daemon=True)
    stopped_at = None
    with shielded():
        worker.start()
        while worker.is_alive():
            worker.join(0.05)
            if stopped_at is None and (interrupt_signal() is not None or time.perf_counter() >= until):
                stopped_at = time.perf_counter()
                stop()
            if (stopped_at is not None and interrupt_signal() is not None
                    and time.perf_counter() - stopped_at > grace_s):
                log.info("the solver did not stop within %.0f s of the interrupt; leaving it behind", grace_s)
                return None, True
    if "error" in box:
        raise box["error"]
    return box.get("result"), interrupt_signal() is not None
