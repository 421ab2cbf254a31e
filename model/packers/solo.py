"""solo: every request alone in its own batch (no batching at all).

What a naive eager server does (one request at a time, e.g. HF ``generate`` without
continuous batching): no padding beyond the 64-token alignment and the lowest
possible latency per request, but 1e7 overhead per request and the longest
sequential time.  Each request declares its own aligned prompt, rounded up to the
shared K representatives when there are more than K distinct ones.  It is the
reference point the workloads' sequential-time limits are set against.
"""

from __future__ import annotations

import numpy as np

from model.cost.common import align
from model.domain.schema import Batching, Problem
from model.packers.grouping import packed
from model.packers.shapecap import cap_shapes


def pack(problem: Problem) -> tuple[Batching, ...]:
    """One batch per request, at its capped aligned prompt."""
    shapes = cap_shapes(problem, [align(b.prompt_len) for b in problem.buckets])
    return tuple(packed(problem, b, s, (np.arange(len(b)),)) for b, s in zip(problem.buckets, shapes, strict=True))
