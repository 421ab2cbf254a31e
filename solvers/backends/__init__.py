"""MIP backends: objects that translate ``model.formulation.MipArrays`` and return a BackendResult.

Every backend satisfies ``Backend``: a ``name``, its ``version()``, the ``features``
it has (``Feature``: LP, MIP, LP_DUALS, LOWER_BOUND, WARM_START, TIME_LIMIT,
INTERRUPT, PROGRESS) and ``solve(model, options)``.  The planner asks for a feature
before relying on it.  ``get_backend(name)`` returns the one instance of a backend.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from model.base.errors import InputError, unknown_name
from solvers.backends.result import BackendResult, Feature, SolveOptions

if TYPE_CHECKING:
    from solvers.backends.milp import MipArrays

BACKEND_MODULES = {"highs": "solvers.backends.highs", "cpsat": "solvers.backends.cpsat",
                   "pulp": "solvers.backends.pulp_cbc"}


@runtime_checkable
class Backend(Protocol):
    """What the planner needs of a solver."""

    name: str
    features: frozenset[Feature]

    def version(self) -> str:
        """The solver's version text (for reports)."""
        ...

    def solve(self, model: MipArrays, options: SolveOptions) -> BackendResult:
        """Solve the model (or its LP relaxation); never raises for a solver failure: Status.ERROR."""
        ...


def get_backend(name: str) -> Backend:
    """The backend by name (its module is imported on demand: each pulls in its own solver)."""
    if name not in BACKEND_MODULES:
        raise InputError("--backend", None, None, unknown_name("backend", name, BACKEND_MODULES))
    return importlib.import_module(BACKEND_MODULES[name]).BACKEND
