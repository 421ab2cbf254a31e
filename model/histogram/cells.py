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
from model.domain.schema import Bucket

log = logging.getLogger("shapeplan")


@dataclass(frozen=True, eq=False)
class Histogram:
    """Cells of one bucket, sorted by (S, G).

    ``G`` is each cell's gen value -- the exact gen_len, or after coarsening the upper
    edge of its gen interval (so costs computed from it never understate); ``gen_min``
    is the smallest real gen_len in the cell (padding is counted against it).
    ``cell_of[i]`` maps request i (file order) to its cell; it is None for a histogram
    built from counts alone (``from_counts``: no request is held, only the cells).
    A coarsened histogram keeps ``of_fine``: the coarse cell of each cell of the exact
    histogram it was made from.
    """

    name: str
    S: np.ndarray
    G: np.ndarray
    count: np.ndarray
    prompt_sum: np.ndarray
    gen_sum: np.ndarray
    cell_of: np.ndarray | None
    gen_min: np.ndarray
    coarsened: bool = False
    of_fine: np.ndarray | None = None

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
    width = int(G.max()) + 1
    key = (S // GRANULARITY) * width + G
    uniq, cell_of = _dense_unique(key)
    count = np.bincount(cell_of)
    prompt_sum = np.bincount(cell_of, weights=bucket.prompt_len).astype(np.int64)
    G_cell = uniq % width
    fine = Histogram(bucket.name, (uniq // width) * GRANULARITY, G_cell, count, prompt_sum, count * G_cell,
                     cell_of.astype(np.int64), G_cell.copy())
    if max_gen_values is None or len(np.unique(G_cell)) <= max_gen_values:
        return fine
    return coarsen(fine, max_gen_values)


def from_counts(name: str, S: np.ndarray, G: np.ndarray, count: np.ndarray, prompt_sum: np.ndarray) -> Histogram:
    """The exact histogram of a bucket known only by its cells (aligned prompt S, exact gen G, request count and
    prompt-token sum per cell, e.g. from a group-by over partitions): no request is held."""
    S, G = np.asarray(S, dtype=np.int64), np.asarray(G, dtype=np.int64)
    order = np.lexsort((G, S))
    S, G = S[order], G[order]
    if len(S) > 1 and not ((S[1:] > S[:-1]) | ((S[1:] == S[:-1]) & (G[1:] > G[:-1]))).all():
        raise ValueError("cells repeat")
    count = np.asarray(count, dtype=np.int64)[order]
    return Histogram(name, S, G, count, np.asarray(prompt_sum, dtype=np.int64)[order], count * G, None, G.copy())


def coarsen(fine: Histogram, max_gen_values: int) -> Histogram:
    """The exact histogram with its gens rounded up to at most ``max_gen_values`` edges (``gen_edges`` over its
    distinct gens): the same cells as aggregating the requests at those edges, and ``of_fine`` maps each exact
    cell to its coarse one, so a bound priced on the coarse cells can be carried back to the exact ones."""
    edges = gen_edges(fine.G, max_gen_values)
    G_up = edges[np.searchsorted(edges, fine.G)]
    width = int(G_up.max()) + 1
    uniq, of_fine = np.unique((fine.S // GRANULARITY) * width + G_up, return_inverse=True)
    n = len(uniq)
    gen_min = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(gen_min, of_fine, fine.gen_min)
    log.info("bucket %s: %d distinct gen values coarsened to %d upper edges (conservative)",
             fine.name, len(np.unique(fine.G)), len(edges))
    return Histogram(fine.name, (uniq // width) * GRANULARITY, uniq % width,
                     np.bincount(of_fine, weights=fine.count, minlength=n).astype(np.int64),
                     np.bincount(of_fine, weights=fine.prompt_sum, minlength=n).astype(np.int64),
                     np.bincount(of_fine, weights=fine.gen_sum, minlength=n).astype(np.int64),
                     None if fine.cell_of is None else of_fine[fine.cell_of], gen_min, True, of_fine)


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
