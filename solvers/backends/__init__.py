"""MIP backends: each translates ``model.formulation.MipArrays`` and returns a BackendResult.

Every backend module has NAME, FEATURES (a frozenset naming what it can do: "lp",
"mip", "duals", "bound", "warm_start", "time_limit", "progress") and
``solve(model, options)``.
"""

from __future__ import annotations

from types import ModuleType

from model.errors import InputError

BACKEND_MODULES = {"highs": "solvers.backends.highs", "cpsat": "solvers.backends.cpsat",
                   "pulp": "solvers.backends.pulp_cbc"}


def get_backend(name: str) -> ModuleType:
    """The backend module by name (imported on demand: each pulls in its own solver)."""
    import importlib

    if name not in BACKEND_MODULES:
        raise InputError("--backend", None, None, f"unknown backend {name!r} ({', '.join(BACKEND_MODULES)})")
    return importlib.import_module(BACKEND_MODULES[name])
