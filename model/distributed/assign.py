"""Batches back to the partitions: quotas per (cell, batch), cut at prefix sums over the partitions.

The planner numbers requests in partition order (partition 0's rows, then partition 1's, ...),
exactly as if the partitions were one file.  Its batching is written as runs: within each cell
(S, G), requests in that order go to a batch, the next ones to another, and so on.  Partition p
holds ranks ``off[p, c] .. off[p, c] + count[p, c]`` of cell c, where ``off`` is the prefix sum
of the cell's counts over the partitions before p (from the group-by histogram), so the runs cut
at those offsets give each partition its quotas: "your first k requests of cell c (in your row
order) ride in batch b, the next j in batch b'".  A partition turns its quotas into a batch per
row by itself (``apply_quotas``): deterministic, and no request row moves between workers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from model.cost.common import align
from model.distributed.read import PartHistogram, cell_key
from model.planning.cell_runs import merge_cuts


@dataclass(frozen=True, eq=False)
class Quotas:
    """One partition's quotas, in (cell, rank) order: the next ``count`` rows of cell ``key`` go to ``batch``."""

    key: np.ndarray
    count: np.ndarray
    batch: np.ndarray

    def __len__(self) -> int:
        return int(self.key.shape[0])


def quotas(prompt_len: np.ndarray, gen_len: np.ndarray, batch_of: np.ndarray, hist: PartHistogram) -> list[Quotas]:
    """Each partition's quotas for the batching ``batch_of`` (one batch code per request, partition order)."""
    key = cell_key(_aligned(prompt_len), gen_len)
    order = np.argsort(key, kind="stable")  # by cell, partition order within: the planner's dealing order
    k_sorted, b_sorted = key[order], np.asarray(batch_of, dtype=np.int64)[order]
    # runs: maximal stretches of one cell and one batch in that order
    run_start = np.flatnonzero(np.r_[True, (k_sorted[1:] != k_sorted[:-1]) | (b_sorted[1:] != b_sorted[:-1])])
    return run_quotas(k_sorted[run_start], b_sorted[run_start], np.diff(np.r_[run_start, len(key)]), hist)


def run_quotas(run_key: np.ndarray, run_batch: np.ndarray, run_count: np.ndarray, hist: PartHistogram
               ) -> list[Quotas]:
    """Each partition's quotas for a batching given as runs (``count`` requests of cell ``key`` in ``batch``),
    runs in dealing order: cells ascending, and within a cell the order its requests fill them."""
    run_key, run_batch = np.asarray(run_key, dtype=np.int64), np.asarray(run_batch, dtype=np.int64)
    run_count = np.asarray(run_count, dtype=np.int64)
    n = int(run_count.sum())
    run_start = np.r_[0, np.cumsum(run_count)[:-1]].astype(np.int64)
    # blocks: partition p's requests of cell c, at cell_start[c] + off[p, c] in the same order
    h_key = cell_key(hist.S, hist.G)  # sorted by (cell, partition)
    if not (np.diff(h_key) >= 0).all():
        raise RuntimeError("histogram not sorted by cell")
    block_start = np.cumsum(np.r_[0, hist.count[:-1]])
    if block_start[-1] + hist.count[-1] != n:
        raise RuntimeError("the partitions' histogram does not match the requests the planner saw")
    # segments of runs cut by blocks: sizes of cells and batches, never one entry per request (10^8)
    run, block, seg_len = merge_cuts(run_start, block_start, n)
    if (run_key[run] != h_key[block]).any():
        raise RuntimeError("the partitions' histogram does not match the requests the planner saw")
    seg_part = hist.part[block]
    out = []
    for p in range(len(hist.sizes)):
        mine = np.flatnonzero(seg_part == p)  # already in (cell, rank) order
        out.append(Quotas(run_key[run[mine]], seg_len[mine], run_batch[run[mine]]))
    return out


def holder(key: int, rank: int, hist: PartHistogram) -> tuple[int, int]:
    """(partition, rank within that partition's requests of the cell) of a cell's request of rank ``rank`` in
    partition order (what a partition needs to find the row: its ``rank``-th row of cell ``key``)."""
    h_key = cell_key(hist.S, hist.G)
    lo, hi = np.searchsorted(h_key, key, side="left"), np.searchsorted(h_key, key, side="right")
    cum = np.cumsum(hist.count[lo:hi])
    i = int(np.searchsorted(cum, rank, side="right"))
    return int(hist.part[lo + i]), int(rank - (cum[i - 1] if i else 0))


def row_of_rank(prompt_len: np.ndarray, gen_len: np.ndarray, key: np.ndarray, rank: np.ndarray) -> np.ndarray:
    """A partition's rows holding its ``rank``-th request of cell ``key`` (ranks in row order), per pair."""
    keys = cell_key(_aligned(prompt_len), gen_len)
    order = np.argsort(keys, kind="stable")
    start = np.searchsorted(keys[order], np.asarray(key, dtype=np.int64), side="left")
    return order[start + np.asarray(rank, dtype=np.int64)]


def apply_quotas(prompt_len: np.ndarray, gen_len: np.ndarray, q: Quotas) -> np.ndarray:
    """The batch code of each of a partition's rows (row order) from its quotas; a mismatch is a bug, raised."""
    key = cell_key(_aligned(prompt_len), gen_len)
    order = np.argsort(key, kind="stable")
    if int(q.count.sum()) != len(key) or (np.repeat(q.key, q.count) != key[order]).any():
        raise RuntimeError("quotas do not match the partition's requests")
    out = np.empty(len(key), dtype=np.int64)
    out[order] = np.repeat(q.batch, q.count)
    return out


def _aligned(prompt_len: np.ndarray) -> np.ndarray:
    return align(np.asarray(prompt_len, dtype=np.int64))
