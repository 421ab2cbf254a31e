"""The Dask engine (``--engine dask``): plan and judge request sets kept as partitions on a Dask cluster.

Request rows stay on the workers that read them.  The client sees only what the planner needs:
a group-by histogram per partition, and each request's two lengths (16 bytes a request, in
partition order) -- the existing planner runs on those, so its batching is the in-memory
engine's.  Its answer goes back to the partitions as quotas per (cell, batch) cut at prefix
sums over the partitions (``assign``), each partition writes its own plan records
(``write``), and the evaluator judges a plan dataset partition by partition with exact global
metrics (``judge``).

Dask is optional: nothing outside this package imports it, and this package imports it only
when the engine runs (``require_dask``).
"""

from __future__ import annotations

from model.base.errors import InputError

INSTALL_HINT = "pip install -e '.[dask]'"


def require_dask() -> None:
    """Dask and distributed importable, or exit 2 with the one line that says how to get them."""
    try:
        import dask.dataframe  # noqa: F401
        import distributed  # noqa: F401
    except ImportError as exc:
        raise InputError("--engine", None, None,
                         f"the dask engine needs dask[dataframe] and distributed ({exc.name} is missing): "
                         f"{INSTALL_HINT}") from None
