"""dpfill: K shapes by an exact DP on prompt padding, then batches filled to capacity in gen order.

What a thoughtful engineer writes without an optimiser: choose the (at most K) shapes
that minimise the total prompt padding over all buckets -- an exact dynamic program
over the sorted distinct aligned prompts, since each request runs on the smallest
chosen shape that covers it -- then, per shape, sort its requests by gen_len and
fill batches to capacity: as many consecutive requests as the device's KV cache holds
(n * (shape + G_max) <= kv_capacity_tokens) and ``max_batch_size`` allows.  Sorting by
gen_len keeps each batch's members close to its longest one, so little decode is
wasted on padding.  Without any capacity (analytic modes, no batch-size cap) a
shape's requests form one batch.
"""

from __future__ import annotations

import numpy as np

from model.cost.common import align
from model.domain.schema import Batching, Problem
from model.domain.shapeset import round_up_to, usable
from model.packers.grouping import filled_batching
from model.packers.shapecap import check_fits


def pad_shapes(values: np.ndarray, counts: np.ndarray, k: int) -> np.ndarray:
    """At most k of the sorted ``values`` (largest included) minimising sum count * (shape - value).

    f[j] = least padding with the last chosen shape values[j] covering values[0..j];
    one more shape: f'[j] = min_i f[i] + pad(values[i+1..j] up to values[j]).  Exact,
    O(k T^2) with prefix sums, vectorised over j.
    """
    values = np.asarray(values, dtype=np.int64)
    counts = np.asarray(counts, dtype=np.float64)
    T = len(values)
    c = np.r_[0.0, np.cumsum(counts)]
    sv = np.r_[0.0, np.cumsum(counts * values)]

    def pad(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:  # values[lo..hi] rounded up to values[hi]
        return values[hi] * (c[hi + 1] - c[lo]) - (sv[hi + 1] - sv[lo])

    j = np.arange(T)
    f = pad(np.zeros(T, np.int64), j)
    backs = []
    for _ in range(1, min(k, T)):
        i = np.arange(T)[:, None]
        cand = np.where(i < j[None, :], f[:, None] + pad(np.minimum(i + 1, T - 1), np.broadcast_to(j, (T, T))),
                        np.inf)
        back = np.argmin(cand, axis=0)
        better = cand[back, j] < f
        backs.append(np.where(better, back, -1))
        f = np.where(better, cand[back, j], f)
    picks, hi = [T - 1], T - 1
    for back in reversed(backs):
        if back[hi] >= 0:
            hi = int(back[hi])
            picks.append(hi)
    return values[np.sort(np.asarray(picks))]


def pack(problem: Problem) -> tuple[Batching, ...]:
    """Shapes by the padding DP over all buckets jointly, then gen-ordered batches filled to capacity."""
    check_fits(problem)
    aligned = [align(b.prompt_len) for b in problem.buckets]
    every = np.concatenate(aligned)
    if problem.max_seq_len is not None:
        every = np.minimum(every, problem.max_seq_len)
    allowed = usable(problem)
    if allowed is not None:  # with a fixed set, the DP picks among the allowed shapes covering some prompt
        every = round_up_to(every, allowed)
    values, counts = np.unique(every, return_counts=True)
    shapes = pad_shapes(values, counts, problem.max_shapes)
    return tuple(filled_batching(b, s, s, problem) for b, s in
                 zip(problem.buckets, (shapes[np.searchsorted(shapes, a)] for a in aligned), strict=True))
