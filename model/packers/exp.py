"""exp: K exponentially spaced prompt buckets, batches cut by power-of-two gen classes.

The vLLM Gaudi (HPU) default "exponential bucketing": bucket i of n = K is
``min * (max/min) ** (i / (n-1))`` for i = 0..n-1, rounded up to a multiple of 64,
where min / max are the smallest / largest aligned prompt over ALL buckets (so the
ladder is shared and never exceeds K shapes; rounding may merge rungs, leaving
fewer).  Each request runs on the smallest rung that fits its aligned prompt, and
within a rung requests are cut into batches by the same power-of-two gen classes
as ``pow2`` (``grouping.gen_bucket``).
"""

from __future__ import annotations

import numpy as np

from model.cost.common import align
from model.domain.schema import Batching, Problem
from model.packers.grouping import gen_bucket, packed
from model.packers.shapecap import cap_shapes, round_up


def ladder(lo: int, hi: int, n: int) -> np.ndarray:
    """The distinct rungs of ``lo * (hi/lo) ** (i/(n-1))`` aligned up to 64, ending exactly at hi.

    The top rung is pinned to ``hi`` because ``lo * (hi/lo) ** 1.0`` can land a hair
    above hi in floating point and would then round up to a useless extra 64 tokens.
    """
    if n <= 1 or lo == hi:
        return np.array([hi], dtype=np.int64)
    rungs = lo * (hi / lo) ** (np.arange(n) / (n - 1))
    return np.unique(np.minimum(align(np.ceil(rungs).astype(np.int64)), hi))


def pack(problem: Problem) -> tuple[Batching, ...]:
    """One batch per (exponential prompt rung, power-of-two gen class)."""
    aligned = [align(b.prompt_len) for b in problem.buckets]
    every = np.concatenate(aligned)
    rungs = ladder(int(every.min()), int(every.max()), problem.max_shapes) if every.size else every
    shapes = cap_shapes(problem, [round_up(a, rungs) for a in aligned])
    return tuple(packed(problem, b, s, (gen_bucket(b.gen_len),))
                 for b, s in zip(problem.buckets, shapes, strict=True))
