"""The shape cap every packer shares: at most K distinct shapes, per bucket and jointly.

Serving stacks that cannot afford a compiled graph per prompt length keep a short
list of graphs and run each request on the smallest graph that fits it.  Every
packer here says which shape it *wants* for each request; this module turns those
wishes into declared shapes:

1. a wanted shape above ``problem.max_seq_len`` is clamped to it (the accelerator
   has no larger graph), which still covers the prompt because prompts never exceed
   the cap (a prompt that does makes the problem infeasible);
2. with a fixed set of allowed shapes (``Problem.allowed_shapes``), a wanted shape is
   rounded UP to the smallest allowed shape covering it (one above the largest allowed
   is first clamped to it, which still covers the prompt: ``model.domain.shapeset.check_fits``
   refuses a set too small for the longest prompt);
3. if the union of wanted shapes over *all* buckets has more than K values, K
   representatives are kept -- evenly spaced by rank over the sorted distinct values,
   always including the largest, so every request still has a graph that fits it --
   and every request is rounded UP to the smallest representative covering it.  The
   representatives are wanted values, so with an allowed set they are allowed shapes.

Taking the union (not each bucket alone) is what makes the cap hold across buckets:
a shape compiled for one bucket may serve another, but never more than K in total.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from model.base.errors import InfeasibleError
from model.cost.common import align
from model.domain.schema import Problem
from model.domain.shapeset import round_up_to, usable


def representatives(needed: np.ndarray, k: int) -> np.ndarray:
    """At most k of the sorted distinct ``needed`` values, evenly spaced by rank, max included.

    Rank ``ceil((j+1) m / k) - 1`` for j = 0..k-1 ends on the largest value (so nothing
    is left uncovered) and spreads the others like quantiles of the distinct shapes.
    """
    values = np.unique(np.asarray(needed, dtype=np.int64))
    m = len(values)
    if m <= k:
        return values
    ranks = -(-(np.arange(1, k + 1) * m) // k) - 1
    return values[ranks]


def round_up(values: np.ndarray, reps: np.ndarray) -> np.ndarray:
    """Each value replaced by the smallest representative >= it (reps sorted, max covers all)."""
    return reps[np.searchsorted(reps, values, side="left")]


def check_fits(problem: Problem) -> None:
    """Raise InfeasibleError if some prompt needs a shape larger than ``max_seq_len`` or every allowed shape."""
    allowed = usable(problem)
    if problem.max_seq_len is None and allowed is None:
        return
    # usable() keeps only allowed shapes within max_seq_len, so with a set its largest is the top
    top = problem.max_seq_len if allowed is None else (int(allowed[-1]) if len(allowed) else 0)
    what = "max_seq_len" if allowed is None else "the largest allowed shape"
    for bucket in problem.buckets:
        over = align(bucket.prompt_len) > top
        if over.any():
            k = int(np.argmax(over))
            raise InfeasibleError(f"bucket {bucket.name}: request {bucket.request_ids[k]!r} has prompt "
                                  f"{int(bucket.prompt_len[k])}, longer than {what} {top}")


def cap_shapes(problem: Problem, wanted: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
    """Declared shape of every request of every bucket: the wanted shapes, clamped and capped to K jointly.

    ``wanted[i][r]`` must be a multiple of 64 covering ``align(prompt_len)`` of request r
    of bucket i; the result keeps both properties and uses at most ``problem.max_shapes``
    distinct values over all buckets together.
    """
    check_fits(problem)
    if problem.max_shapes < 1:
        raise InfeasibleError(f"max_shapes is {problem.max_shapes}: no shape may be compiled")
    wanted = [np.asarray(w, dtype=np.int64) for w in wanted]
    if problem.max_seq_len is not None:
        wanted = [np.minimum(w, problem.max_seq_len) for w in wanted]
    allowed = usable(problem)
    if allowed is not None:
        wanted = [round_up_to(np.minimum(w, allowed[-1]), allowed) for w in wanted]
    reps = representatives(np.concatenate(wanted) if wanted else np.zeros(0, np.int64), problem.max_shapes)
    return tuple(round_up(w, reps) for w in wanted)
