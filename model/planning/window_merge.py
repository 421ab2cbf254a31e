"""Per-window batchings back into one batching per bucket, batch numbers unique across windows."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from model.domain.schema import Batching, Problem
from model.domain.windowing import WindowPart, windows_of


def merge(problem: Problem, parts: Sequence[WindowPart], batchings: Sequence[Sequence[Batching]]
          ) -> tuple[Batching, ...]:
    """One Batching per bucket of ``problem`` from each window's batchings (window order kept, so a bucket's
    batches are numbered window by window; no batch ever holds requests of two windows)."""
    batch_of = [np.full(len(b), -1, dtype=np.int64) for b in problem.buckets]
    shapes: list[list[np.ndarray]] = [[] for _ in problem.buckets]
    count = [0] * len(problem.buckets)
    for part, bts in zip(parts, batchings, strict=True):
        for i, rows, bt in zip(part.bucket_of, part.rows, bts, strict=True):
            batch_of[i][rows] = np.asarray(bt.batch_of, dtype=np.int64) + count[i]
            shapes[i].append(np.asarray(bt.shape_of, dtype=np.int64))
            count[i] += len(bt.shape_of)
    for i, bo in enumerate(batch_of):
        if (bo < 0).any():
            raise ValueError(f"bucket {problem.buckets[i].name}: {int((bo < 0).sum())} request(s) in no window part")
    return tuple(Batching(bo, np.concatenate(sh) if sh else np.zeros(0, np.int64))
                 for bo, sh in zip(batch_of, shapes, strict=True))


def window_slices(parts: Sequence[WindowPart], batchings: Sequence[Batching]) -> list[tuple[Batching, ...]]:
    """The inverse of ``merge``: each window's share of whole-problem batchings (that keep every batch inside one
    window), as the window part's own batchings (its buckets, its rows, batches renumbered from 0)."""
    out = []
    for part in parts:
        own = []
        for i, rows in zip(part.bucket_of, part.rows, strict=True):
            bt = batchings[i]
            used, of = np.unique(np.asarray(bt.batch_of, dtype=np.int64)[rows], return_inverse=True)
            own.append(Batching(of.reshape(-1).astype(np.int64), np.asarray(bt.shape_of, dtype=np.int64)[used]))
        out.append(tuple(own))
    return out


def overlay(problem: Problem, fast: Sequence[Batching], planned: Sequence[tuple[WindowPart, Sequence[Batching]]]
            ) -> tuple[Batching, ...]:
    """``fast`` (whole-problem batchings keeping every batch inside one window) with some windows re-planned:
    each (part, its own batchings) replaces the fast plan's batches of that window; batches renumbered in
    order.  Python work per re-planned window only, not per window of the trace."""
    out = []
    for b, bt in enumerate(fast):
        batch_of = np.asarray(bt.batch_of, dtype=np.int64).copy()
        shapes = [np.asarray(bt.shape_of, dtype=np.int64)]
        offset = len(shapes[0])
        for part, bts in planned:
            if b in part.bucket_of:
                j = part.bucket_of.index(b)
                batch_of[part.rows[j]] = np.asarray(bts[j].batch_of, dtype=np.int64) + offset
                shapes.append(np.asarray(bts[j].shape_of, dtype=np.int64))
                offset += len(shapes[-1])
        used, of = np.unique(batch_of, return_inverse=True)  # the fast batches of re-planned windows are gone
        out.append(Batching(of.reshape(-1).astype(np.int64), np.concatenate(shapes)[used]))
    return tuple(out)


def batch_windows(problem: Problem, b: int, batching: Batching, wins: np.ndarray) -> np.ndarray:
    """The window of each batch of bucket b (the window of its members; they share one in a valid plan)."""
    out = np.zeros(len(batching.shape_of), dtype=np.int64)
    out[np.asarray(batching.batch_of, dtype=np.int64)] = wins
    return out


def split_at_windows(problem: Problem, batchings: Sequence[Batching]) -> tuple[Batching, ...]:
    """Batchings made without windows, each batch cut at the window ends into one batch per window it spans
    (same declared shape, batches in order of their first appearance kept apart): the un-windowed planner sees
    the whole trace at once, so its plan cut where windows require is one more candidate for the windowed
    planner (the best one when windows are long)."""
    out = []
    for bucket, bt in zip(problem.buckets, batchings, strict=True):
        wins = windows_of(problem, bucket)
        batch_of = np.asarray(bt.batch_of, dtype=np.int64)
        keys, new_of = np.unique(np.stack([batch_of, wins]), axis=1, return_inverse=True)
        out.append(Batching(new_of.reshape(-1).astype(np.int64),
                            np.asarray(bt.shape_of, dtype=np.int64)[keys[0]]))
    return tuple(out)
