"""cells: one batch per identical (aligned prompt, gen_len) cell.

What a server that only batches *identical* requests does (request de-duplication /
exact-shape batching, as in static-batch TGI or a Triton dynamic batcher with
exact shape matching): requests with the same aligned prompt and the same
generation length share a batch, so batching adds no padding at all.  The batch is
declared at the cell's aligned prompt rounded up to the shared K representatives.
It is also the starting point of ``greedy``.
"""

from __future__ import annotations

from model.cost.common import align
from model.domain.schema import Batching, Problem
from model.packers.grouping import packed
from model.packers.shapecap import cap_shapes


def pack(problem: Problem) -> tuple[Batching, ...]:
    """One batch per (capped shape, aligned prompt, gen_len) cell, split by max_batch_size."""
    aligned = [align(b.prompt_len) for b in problem.buckets]
    shapes = cap_shapes(problem, aligned)
    return tuple(packed(problem, b, s, (a, b.gen_len))
                 for b, s, a in zip(problem.buckets, shapes, aligned, strict=True))
