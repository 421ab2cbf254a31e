"""Synthetic measurements from a known profile, for tests and benchmarks of the calibration.

The grid is what a profiler sweep on a serving GPU typically covers: prefill batches
up to a per-batch token budget (vLLM-style ``max_num_batched_tokens``), decode steps
at batch sizes from 1 to 512 and contexts up to 2k, every point inside the KV
capacity when the profile has one.  Each point is timed ``repeats`` times with
independent multiplicative noise ``exp(noise * z)``, z standard normal: timing noise
scales with the time measured and a time is never negative.  The noise comes from
the caller's seeded ``numpy.random.Generator``, so a given seed gives the same rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from model.calibration.measurements import Measurements
from model.cost.device import DeviceProfile, decode_ms, prefill_ms


@dataclass(frozen=True)
class Grid:
    """The points a profiler sweep measures (lengths in 128-token steps up to OPT's 2k context)."""

    prefill_batches: tuple[int, ...] = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
    prefill_lengths: tuple[int, ...] = tuple(range(128, 2049, 128))
    max_prefill_tokens: int = 32768
    decode_batches: tuple[int, ...] = (1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 104, 112, 128,
                                       144, 160, 192, 224, 256, 320, 384, 448, 512)
    decode_contexts: tuple[int, ...] = (64, *range(128, 2049, 128))


def grid_points(prof: DeviceProfile, grid: Grid = Grid()) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(is_prefill, batch_size, seq_len) of every grid point that fits the token budget and KV capacity."""
    cap = prof.kv_capacity_tokens if prof.kv_capacity_tokens is not None else np.iinfo(np.int64).max
    pn, ps = (a.ravel() for a in np.meshgrid(grid.prefill_batches, grid.prefill_lengths, indexing="ij"))
    keep = (pn * ps <= grid.max_prefill_tokens) & (pn * ps <= cap)
    dn, dc = (a.ravel() for a in np.meshgrid(grid.decode_batches, grid.decode_contexts, indexing="ij"))
    dkeep = dn * dc <= cap
    is_prefill = np.r_[np.ones(int(keep.sum()), dtype=bool), np.zeros(int(dkeep.sum()), dtype=bool)]
    return is_prefill, np.r_[pn[keep], dn[dkeep]].astype(np.int64), np.r_[ps[keep], dc[dkeep]].astype(np.int64)


def true_step_ms(is_prefill: np.ndarray, n: np.ndarray, s: np.ndarray, prof: DeviceProfile) -> np.ndarray:
    """Noise-free time of each row: a whole prefill, or ONE decode step at context s (= decode_ms with G = 1)."""
    return np.where(is_prefill, prefill_ms(n, s, prof), decode_ms(n, s, 1, prof))


def synthetic_measurements(prof: DeviceProfile, rng: np.random.Generator, noise: float = 0.03,
                           repeats: int = 20, grid: Grid = Grid(), source: str = "<synthetic>") -> Measurements:
    """Every grid point measured ``repeats`` times with multiplicative noise; lines numbered as in a CSV (from 2).

    20 repeats (a profiler keeps every iteration of its timing loop) is what it takes
    at 3 % noise for the small coefficients -- p2, and d0 of large batches, each 5-15 %
    of the time -- to come back within a few percent; fewer repeats are fine for
    exercising the tools rather than the statistics.
    """
    is_prefill, n, s = grid_points(prof, grid)
    is_prefill, n, s = (np.repeat(a, repeats) for a in (is_prefill, n, s))
    ms = true_step_ms(is_prefill, n, s, prof) * np.exp(noise * rng.standard_normal(len(n)))
    phase = np.where(is_prefill, "prefill", "decode").astype(object)
    return Measurements(source, phase, n, s, ms, np.ones(len(n)), np.arange(2, len(n) + 2, dtype=np.int64))
