"""Heuristic packers: the fixed rules serving stacks use today, which the optimiser must beat.

Each packer is ``pack(problem) -> tuple[Batching, ...]`` (one per bucket), returns a
plan within the shape cap (per bucket and across buckets) or raises InfeasibleError
saying why it cannot.
"""

from model.packers.registry import PACKERS

__all__ = ["PACKERS"]
