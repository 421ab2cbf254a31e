"""The typed record every backend returns, and the options every backend accepts."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SolveOptions:
    """What the caller asks of a backend; a backend ignores what its FEATURES lack."""

    time_limit: float = 60.0
    relax: bool = False  # solve the LP relaxation (needs "lp" in FEATURES)
    mip_gap: float = 1e-4
    warm_start: np.ndarray | None = None  # a feasible column vector
    threads: int = 2
    seed: int = 0
    on_progress: Callable[[float, float], None] | None = None  # (incumbent, bound), unscaled


@dataclass(frozen=True, eq=False)
class BackendResult:
    """A backend's answer, read from its API: never from its log.

    ``objective`` and ``bound`` are in the model's original units (scale and offset
    undone).  ``status``: optimal | feasible | time_limit | infeasible | error.
    """

    status: str
    x: np.ndarray | None
    row_duals: np.ndarray | None
    objective: float | None
    bound: float | None
    time_s: float
    backend: str
    version: str

    @property
    def has_solution(self) -> bool:
        return self.x is not None
