"""Aggregation: a bucket becomes a histogram over cells (aligned prompt S, gen_len G).

The optimiser works on cells, so its size depends on the number of distinct lengths,
never on the number of requests.  Each cell keeps its count and token sums, which is
all the cost model needs: prompt padding inside a cell sums to ``count*S -
prompt_sum`` however the cell is split, so splitting a cell across batches stays exact.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from model.cost.common import GRANULARITY, align
from model.schema import Bucket

log = logging.getLogger("shapeplan")


@dataclass(frozen=True, eq=False)
class Histogram:
    """Cells of one bucket, sorted by (S, G).

    ``G`` is each cell's gen value -- the exact gen_len, or after coarsening the upper
    edge of its gen interval (so costs computed from it never understate).
    ``cell_of[i]`` maps request i (file order) to its cell.
    """

    name: str
    S: np.ndarray
    G: np.ndarray
    count: np.ndarray
    prompt_sum: np.ndarray
    gen_sum: np.ndarray
    cell_of: np.ndarray
    coarsened: bool = False

    def __len__(self) -> int:
        return int(self.S.shape[0])

    @property
    def n_requests(self) -> int:
        return int(self.count.sum())


def gen_edges(gen: np.ndarray, max_values: int) -> np.ndarray:
    """Upper edges of at most ``max_values`` gen intervals, conservative and traffic-aware.

    Edges are quantiles of the distinct gen values plus the maximum, so that dense
    regions keep fine resolution; every gen maps to the smallest edge >= it.
    """
    distinct = np.unique(gen)
    if len(distinct) <= max_values:
        return distinct
    picks = np.unique(np.quantile(distinct, np.linspace(0, 1, max_values), method="higher").astype(np.int64))
    return np.union1d(picks, [distinct[-1]])


def build_histogram(bucket: Bucket, max_gen_values: int | None = None) -> Histogram:
    """Aggregate a bucket into (S, G) cells; coarsen G when it has too many distinct values."""
    S = align(bucket.prompt_len)
    G = bucket.gen_len
    coarsened = False
    if max_gen_values is not None and len(np.unique(G)) > max_gen_values:
        edges = gen_edges(G, max_gen_values)
        G = edges[np.searchsorted(edges, G)]
        coarsened = True
        log.info("bucket %s: %d distinct gen values coarsened to %d upper edges (conservative)",
                 bucket.name, len(np.unique(bucket.gen_len)), len(edges))
    width = int(G.max()) + 1
    key = (S // GRANULARITY) * width + G
    uniq, cell_of = _dense_unique(key)
    count = np.bincount(cell_of)
    prompt_sum = np.bincount(cell_of, weights=bucket.prompt_len).astype(np.int64)
    gen_sum = np.bincount(cell_of, weights=bucket.gen_len).astype(np.int64)
    return Histogram(bucket.name, (uniq // width) * GRANULARITY, uniq % width, count,
                     prompt_sum, gen_sum, cell_of.astype(np.int64), coarsened)


def gen_min_of(bucket_gen: np.ndarray, hist: Histogram) -> np.ndarray:
    """Smallest real gen_len in each cell (padding is counted against it, so coarse cells never understate it)."""
    out = np.full(len(hist), np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(out, hist.cell_of, bucket_gen)
    return out


def _dense_unique(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """np.unique(key, return_inverse=True) in linear time when the key space is small.

    Keys are cell numbers (aligned prompt / 64, gen); a bincount over them replaces the
    sort of np.unique, which dominated aggregation at 10^7 requests.
    """
    span = int(key.max()) + 1
    if span > 8 * len(key) + (1 << 22):
        return np.unique(key, return_inverse=True)
    present = np.bincount(key, minlength=span) > 0
    uniq = np.flatnonzero(present)
    index = np.cumsum(present) - 1
    return uniq, index[key]
