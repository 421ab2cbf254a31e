"""What a set of plans runs, per shape: the batch sizes declared at it and, with requests, their contexts.

A plan's batch of n requests at shape s runs the graph (n, s) -- or, on a stack that
compiles batch buckets, (B, s) with B the smallest bucket >= n (``model.cost.device.graph_batch``);
its decode reaches s plus the longest generation among its members.  The export writes one graph per
distinct (n, s) the plans run, so it keeps, per shape, the batch sizes and the
longest context of each (model.serving.spec.ShapeUse).
"""

from __future__ import annotations

import numpy as np

from model.base.errors import InputError
from model.cost.device import graph_batch
from model.cost.metrics import batch_index
from model.domain.schema import Bucket, Plan
from model.evaluation.validate import plan_rows
from model.serving.spec import ShapeUse


def plan_batches(plan: Plan, bucket: Bucket | None) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(shape, size, context or None) of every batch of one plan.

    A batch declaring two shapes is an error naming its line; with requests, the plan
    must cover them exactly once (model.validate's rule) so every generation is known.
    """
    codes, ids = batch_index(plan.batch_ids)
    first = np.unique(codes, return_index=True)[1]
    shape = plan.seq_align[first]
    mixed = plan.seq_align != shape[codes]
    if mixed.any():
        k = int(mixed.argmax())
        line = int(plan.lines[k]) if plan.lines is not None else None
        raise InputError(plan.source, line, "shape.seq_align",
                         f"batch {ids[codes[k]]!r} declares two shapes, {int(shape[codes[k]])} and "
                         f"{int(plan.seq_align[k])}")
    size = np.bincount(codes, minlength=len(ids))
    if bucket is None:
        return shape, size, None
    rows, problems = plan_rows(bucket, plan)
    if problems:
        raise InputError(plan.source, None, "request_id", f"plan and requests {bucket.source} disagree: "
                         f"{problems[0].message}")
    g_max = np.zeros(len(ids), dtype=np.int64)
    np.maximum.at(g_max, codes, bucket.gen_len[rows])
    return shape, size, shape + g_max


def shape_uses(plans: list[Plan] | tuple[Plan, ...], buckets: list[Bucket | None] | tuple[Bucket | None, ...],
               batch_buckets: tuple[int, ...] | None = None) -> tuple[ShapeUse, ...]:
    """Per shape across all plans: the batch sizes of the graphs run at it (with ``batch_buckets`` each batch's
    bucket, else its size), the longest context of each, and the shape's.  A batch above the largest bucket
    fits no graph: an InputError naming its plan."""
    context: dict[tuple[int, int], int] = {}
    sizes: dict[int, set[int]] = {}
    known = all(b is not None for b in buckets)
    for plan, bucket in zip(plans, buckets, strict=True):
        shape, size, ctx = plan_batches(plan, bucket)
        if batch_buckets is not None:
            if len(size) and int(size.max()) > batch_buckets[-1]:
                raise InputError(plan.source, None, "batch_id", f"a batch of {int(size.max())} requests is larger "
                                 f"than every batch bucket (largest {batch_buckets[-1]})")
            size = graph_batch(size, batch_buckets)
        for k, s in enumerate(shape.tolist()):
            n = int(size[k])
            sizes.setdefault(s, set()).add(n)
            if ctx is not None:
                context[(s, n)] = max(context.get((s, n), 0), int(ctx[k]))
    out = []
    for s in sorted(sizes):
        ns = tuple(sorted(sizes[s]))
        per = tuple(context[(s, n)] for n in ns) if known else ()
        out.append(ShapeUse(s, ns, max(per) if known else None, per))
    return tuple(out)
