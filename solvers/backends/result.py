"""The typed contract between the planner and its backends: features, statuses, options, results.

A backend (see ``solvers.backends.Backend``) says what it can do as a set of
``Feature`` values, and reports every run as one ``Status``: each backend maps its
native statuses onto these through one module-level table (``HIGHS_STATUS``,
``CPSAT_STATUS``, ``PULP_STATUS``), so the planner never reads a solver's own words.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

__all__ = ["BackendResult", "Feature", "SolveOptions", "Status", "mapped"]


class Status(enum.StrEnum):
    """How a solve ended; ``value`` is the text tables and the sweep CSV show."""

    OPTIMAL = "optimal"  # proven optimal (within the MIP gap)
    FEASIBLE = "feasible"  # a solution, stopped for another reason than the clock
    TIME_LIMIT_FEASIBLE = "time_limit"  # the time limit, with a solution
    TIME_LIMIT_NO_SOLUTION = "time_limit_no_solution"  # the time limit, no solution: nothing proven
    INFEASIBLE = "infeasible"  # proven: no solution exists
    INTERRUPTED = "interrupted"  # a signal stopped it
    ERROR = "error"  # the solver failed: nothing proven
    HEURISTIC = "heuristic"  # a packer's plan (reports only; no backend returns it)

    @property
    def text(self) -> str:
        """Words for a message ("time limit, no solution")."""
        return _TEXT[self]

    @property
    def proven_infeasible(self) -> bool:
        return self is Status.INFEASIBLE


_TEXT = {
    Status.OPTIMAL: "optimal",
    Status.FEASIBLE: "feasible",
    Status.TIME_LIMIT_FEASIBLE: "time limit, with a solution",
    Status.TIME_LIMIT_NO_SOLUTION: "time limit, no solution",
    Status.INFEASIBLE: "infeasible",
    Status.INTERRUPTED: "interrupted",
    Status.ERROR: "solver error",
    Status.HEURISTIC: "heuristic",
}


class Feature(enum.Enum):
    """What a backend can do; the planner asks before it relies on one."""

    LP = "lp"  # solves the LP relaxation (SolveOptions.relax)
    MIP = "mip"  # solves the integer model
    LP_DUALS = "lp_duals"  # returns row duals of an LP (column generation needs them)
    LOWER_BOUND = "lower_bound"  # returns a valid dual bound of a MIP it did not finish
    WARM_START = "warm_start"  # accepts a feasible start vector
    TIME_LIMIT = "time_limit"  # honours SolveOptions.time_limit
    INTERRUPT = "interrupt"  # stops promptly on a signal (returns Status.INTERRUPTED)
    PROGRESS = "progress"  # reports improving incumbents through SolveOptions.on_progress
    STALL = "stall"  # ends a MIP that stalls (SolveOptions.stall_s) and says so


@dataclass(frozen=True)
class SolveOptions:
    """What the caller asks of a backend; the caller asks only for what the backend's features hold."""

    time_limit: float = 60.0
    relax: bool = False  # solve the LP relaxation (needs Feature.LP)
    mip_gap: float = 1e-4
    warm_start: np.ndarray | None = None  # a feasible column vector (Feature.WARM_START)
    threads: int = 2
    seed: int = 0
    on_progress: Callable[[float, float | None], None] | None = None  # (incumbent, bound), unscaled
    # give the time back once this many seconds pass without a better incumbent (counted from the call's start,
    # so a MIP that never beats its start ends too): the result is FEASIBLE, not a time limit (Feature.STALL)
    stall_s: float | None = None


@dataclass(frozen=True, eq=False)
class BackendResult:
    """A backend's answer, read from its API: never from its log.

    ``objective`` and ``bound`` are in the model's original units (scale and offset
    undone); ``bound`` is None unless the backend has Feature.LOWER_BOUND (or the LP
    was solved to optimality).  ``native`` is the solver's own status, for messages.
    """

    status: Status
    x: np.ndarray | None
    row_duals: np.ndarray | None
    objective: float | None
    bound: float | None
    time_s: float
    backend: str
    version: str
    native: str = ""
    stalled: bool = False  # ended by SolveOptions.stall_s: no better incumbent for that long, time given back

    @property
    def has_solution(self) -> bool:
        return self.x is not None


def mapped(table: dict, native, has_solution: bool) -> Status:
    """A native status through a backend's table: (with a solution, without one); unknown -> ERROR."""
    pair = table.get(native)
    if pair is None:
        return Status.ERROR
    return pair[0] if has_solution else pair[1]
