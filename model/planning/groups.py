"""Device mode: a bucket's plan as groups -- members that share a window and a declared shape -- and groups changed.

At one declared shape a batch's time depends only on its size and its longest gen, so the
re-batching DPs (``model.planning.rebatch``, ``model.planning.move_up``) cut each group's
gen-sorted members into runs.  A group keeps each member's wait to its window's end, so its
per-batch latency limit (the P95 limit less its longest wait) follows whatever members it
holds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from model.cost.metrics import window_wait_ms
from model.domain.schema import Batching, Problem
from model.domain.windowing import windows_of


@dataclass(frozen=True, eq=False)
class Group:
    """One bucket's members that share a window and a declared shape, by gen then row (the order runs cut),
    their waits, the bucket's P95 limit (None: none) and the size classes their runs may use (None: all)."""

    rows: np.ndarray
    gens: np.ndarray
    shape: int
    window: int
    wait: np.ndarray
    p95: float | None
    classes: frozenset | None

    @property
    def limit(self) -> float | None:
        """The per-batch latency limit: the P95 limit less the group's longest wait (None: no limit)."""
        if self.p95 is None:
            return None
        return float(self.p95 - (self.wait.max() if len(self.wait) else 0.0))

    def __len__(self) -> int:
        return len(self.rows)


def groups_of(problem: Problem, b: int, batching: Batching) -> list[Group]:
    """The groups of bucket b's plan: its members by (window, declared shape), each group's classes those its
    batches use now where a class is a graph of its own (compiled batch sizes)."""
    bucket, cm = problem.buckets[b], problem.cost
    batch_of = np.asarray(batching.batch_of, dtype=np.int64)
    shape_of = np.asarray(batching.shape_of, dtype=np.int64)
    shape = shape_of[batch_of]
    wins = windows_of(problem, bucket)
    w = problem.windowing
    wait = (window_wait_ms(bucket.arrival_s, w.seconds, w.origin_s) if w is not None
            else np.zeros(len(bucket)))
    p95 = problem.limits[b].max_p95_latency_ms
    sizes = np.bincount(batch_of, minlength=len(shape_of))
    out = []
    order = np.lexsort((np.arange(len(bucket)), bucket.gen_len, shape, wins))
    key_of = np.stack([wins[order], shape[order]], axis=1)
    starts = np.flatnonzero(np.r_[True, (key_of[1:] != key_of[:-1]).any(axis=1)])
    for lo, hi in zip(starts, np.r_[starts[1:], len(order)], strict=True):
        rows = order[lo:hi]
        classes = None
        if cm.n_compile_classes > 1:
            used = np.unique(batch_of[rows])
            classes = frozenset(np.asarray(cm.size_class(sizes[used])).tolist())
        out.append(Group(rows, bucket.gen_len[rows], int(shape[rows[0]]), int(wins[rows[0]]), wait[rows],
                         None if p95 is None else float(p95), classes))
    return out


def moved_up(lower: Group, upper: Group, k: int) -> tuple[Group, Group]:
    """The ``k`` longest-gen members of ``lower`` moved to ``upper`` (same window, a larger shape, so they fit
    there): (what stays, what the upper group becomes), each still by gen then row.  The upper group keeps
    its size classes (the graphs it compiles)."""
    cut = len(lower) - k
    rows = np.r_[upper.rows, lower.rows[cut:]]
    gens = np.r_[upper.gens, lower.gens[cut:]]
    wait = np.r_[upper.wait, lower.wait[cut:]]
    order = np.lexsort((rows, gens))
    stay = Group(lower.rows[:cut], lower.gens[:cut], lower.shape, lower.window, lower.wait[:cut], lower.p95,
                 lower.classes)
    return stay, Group(rows[order], gens[order], upper.shape, upper.window, wait[order], upper.p95, upper.classes)


def batching_of(groups: list[Group], runs: list[np.ndarray], n: int) -> Batching:
    """The bucket's batching from each group's run numbers (groups without members dropped)."""
    batch_of = np.empty(n, dtype=np.int64)
    shapes: list[np.ndarray] = []
    base = 0
    for g, r in zip(groups, runs, strict=True):
        if not len(g):
            continue
        batch_of[g.rows] = base + r
        k = int(r.max()) + 1
        shapes.append(np.full(k, g.shape, dtype=np.int64))
        base += k
    return Batching(batch_of, np.concatenate(shapes) if shapes else np.zeros(0, np.int64))
