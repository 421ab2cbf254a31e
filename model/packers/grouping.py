"""Turning "requests with equal keys ride together" into a Batching, honouring max_batch_size.

Every fixed-rule packer is a choice of grouping key; this is the one place that
numbers the batches, splits oversized groups and checks nothing rides at a shape
smaller than its prompt.  With arrival windows (``Problem.windowing``) the window is
one more key, so every packer batches within windows while its shapes stay the ones
its rule chose for the whole trace.  With compiled batch sizes (batch buckets) a batch holds
at most the largest bucket whose graph's KV fits, so no packer's batch exceeds the largest
bucket, and a run shorter than that rides in the smallest bucket holding it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from model.base.errors import InfeasibleError
from model.cost.common import GRANULARITY, align
from model.domain.schema import Batching, Bucket, Problem
from model.domain.windowing import windows_of


def pow2_ceil(x: np.ndarray, floor: int) -> np.ndarray:
    """Smallest power of two >= max(x, floor); ``floor`` must itself be a power of two.

    Power-of-two ladders are what Neuron / JetStream style servers compile, and the
    same ladder over gen_len is a cheap way to keep generation padding under 2x.
    """
    x = np.maximum(np.asarray(x, dtype=np.int64), floor)
    return np.left_shift(np.int64(1), np.ceil(np.log2(x)).astype(np.int64))


def gen_bucket(gen_len: np.ndarray) -> np.ndarray:
    """The gen-length class a request rides in: powers of two from 16 (16, 32, 64, ...).

    Requests of one prompt shape and one class share a batch, so a batch decodes at
    most twice as long as its shortest member needs (and any length <= 16 rides in 16).
    """
    return pow2_ceil(gen_len, 16)


def kv_capacity(problem: Problem) -> int | None:
    """The device's KV capacity in tokens (device mode with a capacity), else None."""
    return problem.cost.kv_capacity


def batch_capacity(shape: int, g: np.ndarray, max_batch_size: int | None, kv: int | None) -> np.ndarray:
    """Most members a batch at ``shape`` whose longest gen is g may hold: n*(shape+g) <= kv, n <= cap."""
    cap = np.full(np.shape(g), np.iinfo(np.int64).max // 4, dtype=np.int64)
    if max_batch_size is not None:
        cap = np.minimum(cap, max_batch_size)
    if kv is not None:
        cap = np.minimum(cap, kv // (shape + np.asarray(g, dtype=np.int64)))
    return cap


def bounded(problem: Problem) -> bool:
    """Whether the cost model caps a batch's size by its shape and gen (a KV capacity, or batch buckets)."""
    return problem.cost.kv_capacity is not None or problem.cost.batch_buckets is not None


def filled_batching(bucket: Bucket, shape: np.ndarray, group: np.ndarray, problem: Problem) -> Batching:
    """Requests of each group (one declared shape per group) in gen order, cut into the longest runs that fit.

    A run fits when its size is within the cost model's ``batch_cap`` at its longest gen
    (the KV capacity and the batch-size cap, and with batch buckets the largest bucket
    whose graph's KV fits); gens ascend along the run, so the capacity only shrinks and
    the first run that does not fit ends the batch.  Used by dpfill, and by every packer
    in device mode, where the KV cache (and the compiled batch sizes) bound a batch.
    """
    shape = np.asarray(shape, dtype=np.int64)
    if (shape < align(bucket.prompt_len)).any() or (shape % GRANULARITY).any():
        raise ValueError(f"bucket {bucket.name}: a declared shape does not cover its prompt")
    kv = kv_capacity(problem)
    cap_b = problem.max_batch_size
    n = len(bucket)
    if problem.windowing is not None and n:  # batches never span two windows
        group = np.unique(np.stack([np.asarray(group, dtype=np.int64), windows_of(problem, bucket)]), axis=1,
                          return_inverse=True)[1].reshape(-1)
    order = np.lexsort((np.arange(n), align(bucket.prompt_len), bucket.gen_len, shape, np.asarray(group)))
    keys = np.asarray(group)[order]
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]]) if n else np.zeros(0, np.int64)
    ends = np.r_[starts[1:], n].astype(np.int64)
    new_batch = np.zeros(n, dtype=bool)
    for start, end in zip(starts.tolist(), ends.tolist(), strict=True):
        s = int(shape[order[start]])
        gens = bucket.gen_len[order[start:end]]
        p = 0
        while p < end - start:
            window = int(min(end - start - p, problem.cost.batch_cap(s, gens[p:p + 1], cap_b)[0] + 1))
            fits = np.arange(1, window + 1) <= problem.cost.batch_cap(s, gens[p:p + window], cap_b)
            if not fits[0]:
                raise InfeasibleError(f"bucket {bucket.name}: request {bucket.request_ids[order[start + p]]!r} "
                                      f"does not fit one batch at shape {s} (KV capacity {kv} tokens)")
            new_batch[start + p] = True
            p += int(np.argmin(fits)) if not fits.all() else window
    batch_of = np.empty(n, dtype=np.int64)
    batch_of[order] = np.cumsum(new_batch) - 1
    return Batching(batch_of=batch_of, shape_of=shape[order][new_batch])


def group_batching(bucket: Bucket, shape: np.ndarray, keys: Sequence[np.ndarray] = (),
                   max_batch_size: int | None = None) -> Batching:
    """One batch per distinct (shape, *keys) of the bucket's requests, declared at ``shape``.

    Batches are numbered in (shape, *keys) order.  A group larger than
    ``max_batch_size`` is cut into consecutive chunks after sorting its members by
    (aligned prompt, gen_len, file position), so each chunk holds similar requests
    and pads little.
    """
    shape = np.asarray(shape, dtype=np.int64)
    if (shape < align(bucket.prompt_len)).any() or (shape % GRANULARITY).any():
        raise ValueError(f"bucket {bucket.name}: a declared shape does not cover its prompt")
    n = len(bucket)
    columns = [shape, *(np.asarray(k, dtype=np.int64) for k in keys)]
    tiebreak = [align(bucket.prompt_len), bucket.gen_len, np.arange(n)]
    order = np.lexsort(tuple(reversed(columns + tiebreak)))
    grouped = np.stack([c[order] for c in columns]) if n else np.zeros((len(columns), 0), np.int64)
    new_group = np.r_[True, (grouped[:, 1:] != grouped[:, :-1]).any(axis=0)] if n else np.zeros(0, bool)
    group_start = np.maximum.accumulate(np.where(new_group, np.arange(n), 0))
    chunk = (np.arange(n) - group_start) // max_batch_size if max_batch_size else np.zeros(n, np.int64)
    new_batch = new_group | np.r_[False, chunk[1:] != chunk[:-1]] if n else new_group
    batch_sorted = np.cumsum(new_batch) - 1
    batch_of = np.empty(n, dtype=np.int64)
    batch_of[order] = batch_sorted
    return Batching(batch_of=batch_of, shape_of=shape[order][new_batch])


def balanced_batching(bucket: Bucket, shape: np.ndarray, box_of: np.ndarray, batches_of_box: np.ndarray
                      ) -> Batching:
    """Each box's requests dealt into ``batches_of_box[box]`` batches of near-equal size.

    Members of a box are sorted by (gen_len, aligned prompt, file position) and cut into
    consecutive runs whose sizes differ by at most one, so every batch stays inside the
    size class [lo, hi] the optimiser chose for the box (lo*m <= n <= hi*m makes
    floor(n/m) >= lo and ceil(n/m) <= hi) and holds requests of similar length.
    """
    shape = np.asarray(shape, dtype=np.int64)
    if (shape < align(bucket.prompt_len)).any() or (shape % GRANULARITY).any():
        raise ValueError(f"bucket {bucket.name}: a declared shape does not cover its prompt")
    n = len(bucket)
    order = np.lexsort((np.arange(n), align(bucket.prompt_len), bucket.gen_len, box_of))
    boxes_sorted = box_of[order]
    new_box = np.r_[True, boxes_sorted[1:] != boxes_sorted[:-1]] if n else np.zeros(0, bool)
    start = np.maximum.accumulate(np.where(new_box, np.arange(n), 0))
    size = np.bincount(box_of, minlength=len(batches_of_box))[boxes_sorted]
    m = np.maximum(np.asarray(batches_of_box, dtype=np.int64)[boxes_sorted], 1)
    chunk = ((np.arange(n) - start) * m) // np.maximum(size, 1)
    new_batch = new_box | np.r_[False, chunk[1:] != chunk[:-1]] if n else new_box
    batch_sorted = np.cumsum(new_batch) - 1
    batch_of = np.empty(n, dtype=np.int64)
    batch_of[order] = batch_sorted
    return Batching(batch_of=batch_of, shape_of=shape[order][new_batch])


def packed(problem: Problem, bucket: Bucket, shape: np.ndarray, keys: Sequence[np.ndarray] = ()) -> Batching:
    """A packer's grouping rule as batches: one batch per (shape, *keys), split by the batch-size cap --
    and in device mode cut in gen order to what the KV cache (and the batch buckets) hold
    (``filled_batching``); with arrival windows the window is one more key."""
    if problem.windowing is not None:
        keys = (*keys, windows_of(problem, bucket))
    if not bounded(problem):
        return group_batching(bucket, shape, keys, problem.max_batch_size)
    columns = [np.asarray(shape, dtype=np.int64), *(np.asarray(k, dtype=np.int64) for k in keys)]
    group = np.unique(np.stack(columns), axis=1, return_inverse=True)[1].reshape(-1) if len(bucket) else \
        np.zeros(0, np.int64)
    return filled_batching(bucket, shape, group, problem)
