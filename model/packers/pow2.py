"""pow2: power-of-two prompt buckets from 128, batches cut by power-of-two gen classes.

The AWS Neuron (transformers-neuronx / NxD "bucketing") and JetStream style: graphs
are compiled for prompt lengths 128, 256, 512, 1024, ... and a request runs on the
smallest one that fits its aligned prompt (clamped to ``max_seq_len``).  Within a
prompt bucket requests are cut into batches by generation length with the
documented rule of ``grouping.gen_bucket``: requests whose gen_len falls in the
same power-of-two class from 16 (<=16, 17-32, 33-64, ...) ride together.  If more
than K power-of-two shapes are needed across all buckets, they are capped to K
representatives by rounding up (``shapecap``), and the cut uses the capped shape.
"""

from __future__ import annotations

from model.cost.common import align
from model.domain.schema import Batching, Problem
from model.packers.grouping import gen_bucket, packed, pow2_ceil
from model.packers.shapecap import cap_shapes


def pack(problem: Problem) -> tuple[Batching, ...]:
    """One batch per (capped power-of-two prompt bucket, power-of-two gen class)."""
    shapes = cap_shapes(problem, [pow2_ceil(align(b.prompt_len), 128) for b in problem.buckets])
    return tuple(packed(problem, b, s, (gen_bucket(b.gen_len),))
                 for b, s in zip(problem.buckets, shapes, strict=True))
