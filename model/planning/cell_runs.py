"""A solution given by cells (requests per cell and box) as batches of cells: runs, then requests.

The MIP says how many requests of each (coarse) cell ride in each box and how many
batches each box holds.  Two cuts turn that into batches without touching a request:

1. ``deal``: a coarse cell's exact cells, gens ascending, are laid along its arcs, boxes
   ascending (a coarse cell is a range of gens at one aligned prompt, every box it reaches
   covers the whole range, so any dealing is valid; this one sends the shortest gens to
   the smallest boxes);
2. ``box_runs``: each box's members, in (S, G) order -- (G, S) in device mode, so each
   batch decodes as little as it can -- are cut into batches: under a batch-size cap into
   consecutive chunks of the cap (``model.packers.grouping.group_batching``'s rule),
   in device mode into the box's m batches of near-equal size (``balanced_batching``'s).

Both cuts are merges of two sorted lists of cut points, so their size is cells + arcs +
batches.  ``batching_of_runs`` then deals each exact cell's requests, in file order, to
its runs: the in-memory engine's batching, request by request.
"""

from __future__ import annotations

import numpy as np

from model.cost.model import CostModel
from model.domain.schema import Batching, CellRuns
from model.histogram.cells import Histogram


def merge_cuts(starts_a: np.ndarray, starts_b: np.ndarray, total: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Segments of [0, total) cut at both lists of starts (each ascending, from 0): (index into a, index into b,
    length) per segment -- two partitions of one sequence laid over each other, without the sequence."""
    cuts = np.union1d(starts_a, starts_b)
    cuts = cuts[cuts < total]
    length = np.diff(np.r_[cuts, total])
    return (np.searchsorted(starts_a, cuts, side="right") - 1, np.searchsorted(starts_b, cuts, side="right") - 1,
            length.astype(np.int64))


def deal(fine: Histogram, coarse: Histogram, arc_cell: np.ndarray, arc_box: np.ndarray, count: np.ndarray
         ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Exact cells to boxes: (exact cell, box, requests) per segment, from requests per (coarse cell, box).

    ``coarse`` is ``fine`` itself or made from it by ``coarsen`` (its ``of_fine`` maps the
    exact cells).  Raises if the arcs do not plan every request exactly once.
    """
    of_fine = coarse.of_fine if coarse.of_fine is not None else np.arange(len(fine), dtype=np.int64)
    arc_cell, arc_box = np.asarray(arc_cell, dtype=np.int64), np.asarray(arc_box, dtype=np.int64)
    count = np.asarray(count, dtype=np.int64)
    if (np.bincount(arc_cell, weights=count, minlength=len(coarse)) != coarse.count).any():
        raise RuntimeError("solution does not plan every request exactly once")
    keep = count > 0
    arcs = np.lexsort((arc_box[keep], arc_cell[keep]))
    a_box, a_count = arc_box[keep][arcs], count[keep][arcs]
    cells = np.lexsort((np.arange(len(fine)), of_fine))  # coarse cell, then gen ascending (exact cells sort so)
    f_count = fine.count[cells]
    total = int(f_count.sum())
    i, j, length = merge_cuts(np.r_[0, np.cumsum(f_count)[:-1]], np.r_[0, np.cumsum(a_count)[:-1]], total)
    return cells[i], a_box[j], length


def box_runs(fine: Histogram, seg_cell: np.ndarray, seg_box: np.ndarray, seg_count: np.ndarray,
             box_shape: np.ndarray, cost: CostModel, max_batch_size: int | None, box_batches: np.ndarray | None = None
             ) -> CellRuns:
    """Each box's members cut into batches (see the module docstring): the runs of a bucket.

    ``box_shape`` is the declared shape of each segment's box (per segment); ``box_batches``
    (device mode) the batches of each segment's box.  Batches are numbered box by box,
    boxes ascending (by shape: grids are shape-major).
    """
    seg_cell, seg_box = np.asarray(seg_cell, dtype=np.int64), np.asarray(seg_box, dtype=np.int64)
    seg_count = np.asarray(seg_count, dtype=np.int64)
    if (np.asarray(box_shape) < fine.S[seg_cell]).any():
        raise ValueError(f"bucket {fine.name}: a box's declared shape does not cover a prompt it holds")
    within = (fine.S[seg_cell], fine.G[seg_cell]) if cost.shared_batch_time else (fine.G[seg_cell], fine.S[seg_cell])
    order = np.lexsort((*within, seg_box))
    seg_cell, seg_box, seg_count = seg_cell[order], seg_box[order], seg_count[order]
    box_shape = np.asarray(box_shape, dtype=np.int64)[order]
    total = int(seg_count.sum())
    seg_start = np.r_[0, np.cumsum(seg_count)[:-1]].astype(np.int64)
    first = np.flatnonzero(np.r_[True, seg_box[1:] != seg_box[:-1]]) if len(seg_box) else np.zeros(0, np.int64)
    box_start = seg_start[first]
    size = np.diff(np.r_[box_start, total])
    if cost.shared_batch_time:
        m = np.maximum(np.asarray(box_batches, dtype=np.int64)[order][first], 1)
        m = np.minimum(m, size)
    elif max_batch_size:
        m = -(-size // max_batch_size)
    else:
        m = np.ones(len(size), dtype=np.int64)
    k = np.arange(int(m.sum())) - np.repeat(np.r_[0, np.cumsum(m)[:-1]], m)  # chunk number within its box
    owner = np.repeat(np.arange(len(m)), m)
    if cost.shared_batch_time:
        local = (k * size[owner] + m[owner] - 1) // m[owner]  # where (pos * m) // size steps up
    else:
        local = k * (max_batch_size or 0)
    chunk_start = box_start[owner] + local
    s, b, length = merge_cuts(seg_start, chunk_start, total)
    shape_of = box_shape[first][owner]
    cell, batch = seg_cell[s], b
    runs = np.lexsort((batch, cell))
    return CellRuns(cell[runs], batch[runs], length[runs], shape_of)


def batching_of_runs(cell_of: np.ndarray, runs: CellRuns) -> Batching:
    """The runs as a batch per request: each exact cell's requests, in file order, fill its runs in order."""
    cell_of = np.asarray(cell_of, dtype=np.int64)
    order = np.argsort(cell_of, kind="stable")
    if (np.bincount(runs.cell, weights=runs.count, minlength=int(cell_of.max(initial=-1)) + 1)
            != np.bincount(cell_of)).any():
        raise RuntimeError("runs do not cover every request exactly once")
    batch_of = np.empty(len(cell_of), dtype=np.int64)
    batch_of[order] = np.repeat(runs.batch, runs.count)
    return Batching(batch_of, runs.shape_of)
