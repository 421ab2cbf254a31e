"""Turning "requests with equal keys ride together" into a Batching, honouring max_batch_size.

Every fixed-rule packer is a choice of grouping key; this is the one place that
numbers the batches, splits oversized groups and checks nothing rides at a shape
smaller than its prompt.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from model.cost.common import GRANULARITY, align
from model.schema import Batching, Bucket


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


def group_batching(bucket: Bucket, shape: np.ndarray, keys: Sequence[np.ndarray] = (),
                   max_batch_size: int | None = None) -> Batching:
    """One batch per distinct (shape, *keys) of the bucket's requests, declared at ``shape``.

    Batches are numbered in (shape, *keys) order.  A group larger than
    ``max_batch_size`` is cut into consecutive chunks after sorting its members by
    (aligned prompt, gen_len, file position), so each chunk holds similar requests
    and pads little.
    """
    shape = np.asarray(shape, dtype=np.int64)
    if (shape < align(bucket.prompt_len)).any() or (shape % 64).any():
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
