"""baseline: one batch per compiled shape, shapes from the aligned prompt only.

The classic weak baseline of a static-graph server (e.g. a fixed list of prompt
buckets in a TensorRT / early Neuron deployment): pick up to K shapes evenly spaced
over the sorted distinct aligned prompts (always including the largest), put every
request on the smallest shape that fits it, and run each shape as ONE batch
(split only by ``max_batch_size``).  Generation lengths are ignored, so a batch
decodes as long as its longest member: cheap on overhead, ruinous on padding and
latency.  It is here to show what ignoring gen_len costs.
"""

from __future__ import annotations

from model.cost.common import align
from model.domain.schema import Batching, Problem
from model.packers.grouping import packed
from model.packers.shapecap import cap_shapes


def pack(problem: Problem) -> tuple[Batching, ...]:
    """One batch per capped shape in each bucket."""
    shapes = cap_shapes(problem, [align(b.prompt_len) for b in problem.buckets])
    return tuple(packed(problem, b, s, ()) for b, s in zip(problem.buckets, shapes, strict=True))
