"""What every cost mode shares: the 64-token granularity, the run sums and the P95 rank."""

from __future__ import annotations

from typing import Literal

import numpy as np

Mode = Literal["reference", "strict", "device"]
MODES: tuple[str, ...] = ("reference", "strict", "device")

GRANULARITY = 64
HIDDEN = 4096
HEADS = 32


def align(x):
    """Round a length up to the 64-token granularity of compiled shapes (ints stay ints)."""
    if isinstance(x, (int, np.integer)):
        return -(-int(x) // GRANULARITY) * GRANULARITY
    return -(-np.asarray(x, dtype=np.int64) // GRANULARITY) * GRANULARITY


def sq(a, n):
    """Sum of squares of the run a, a+1, ..., a+n-1 (attention work of n decode steps)."""
    a = np.asarray(a, dtype=np.int64)
    n = np.asarray(n, dtype=np.int64)
    return n * a * a + a * n * (n - 1) + (n * (n - 1) * (2 * n - 1)) // 6


def lin(a, n):
    """Sum of the run a, ..., a+n-1 (MLP work of n decode steps)."""
    a = np.asarray(a, dtype=np.int64)
    n = np.asarray(n, dtype=np.int64)
    return n * a + (n * (n - 1)) // 2


def p95_rank(n: int) -> int:
    """0-based nearest-rank index of the P95 element among n sorted latencies.

    ``ceil(0.95 n) - 1`` computed in integers (identical to the float form for every n
    checked up to 200k, and immune to rounding).
    """
    return max(0, min(n - 1, (95 * n + 99) // 100 - 1))


def allowed_above(n: int) -> int:
    """How many of n latencies may exceed the P95 limit while the P95 still meets it."""
    return n - 1 - p95_rank(n)
