"""The final shape pass: re-declare the shapes of a returned batching wherever that costs less.

Whoever batched (the MIP or a packer), the declared shapes can be re-chosen for the same
batches, within the shape cap (per bucket and across buckets) and the allowed set:

- reference mode: the declared shape moves only compile cost and compile spikes, so each
  bucket declares ONE shape, chosen jointly under K by the exact DP ``reference_shape_set``
  (the smallest allowed shape covering each bucket's longest aligned prompt, with a fixed
  set).  Any plan's union of shapes offers such a choice, so the DP never compiles more;
  and one shape means one spike, which may land on any member.
- strict and device mode: a batch costs more at a larger shape, so each batch moves to the
  smallest kept shape covering its longest aligned prompt; which of the shapes already used
  (in any bucket: the union stays within K and within the allowed set) each bucket keeps is
  an exact DP over them (``kept_shapes``): dropping a level saves its compile charge and costs
  what its batches pay one level up.  Plain lowering within the bucket's own shapes is the
  fallback candidate (it never adds a compile).  The same DP over the used shapes plus every batch's own
  need (its longest aligned prompt, or the smallest allowed shape covering it) may add a shape no bucket
  used: a bucket whose batches sit at a shape far above their prompts (the embedded default's short bucket
  at 1024 where 704 covers it: 147,118 -> 143,060 device-ms); it is offered only when the union stays within K.

The candidates are judged by the caller with the exact evaluation: spikes move with the
shapes, so one is taken only if it is cheaper AND still meets every limit.
"""

from __future__ import annotations

import numpy as np

from model.cost.common import align
from model.cost.model import CostModel
from model.domain.schema import Batching, Bucket, Problem
from model.domain.shapeset import round_up_to, usable


def reference_shape_set(need: list[int], cost: CostModel, max_shapes: int, allowed: np.ndarray | None = None
                        ) -> list[int]:
    """Reference mode: the one shape each bucket compiles, the least total compile cost with <= K shapes in all.

    ``need[b]`` is bucket b's longest aligned prompt.  Any plan gives bucket b a shape >=
    its need; picking K of the needs, each bucket using the smallest pick above its need,
    is exact by dynamic programming over the sorted needs (a pick that is no need can be
    lowered to the largest need it serves).  With a fixed set of ``allowed`` shapes a
    need is the smallest allowed shape covering it.
    """
    if allowed is not None:
        need = [int(round_up_to(n, allowed)) for n in need]
    values = sorted(set(need))
    charge = [float(cost.shape_charge(v)) for v in values]
    count = [need.count(v) for v in values]
    inf = float("inf")
    best = [[inf] * (max_shapes + 1) for _ in values]  # best[j][k]: values[j] picked, k picks so far
    back = [[-1] * (max_shapes + 1) for _ in values]
    for j in range(len(values)):
        best[j][1] = sum(count[:j + 1]) * charge[j]
        for k in range(2, max_shapes + 1):
            for i in range(j):
                val = best[i][k - 1] + sum(count[i + 1:j + 1]) * charge[j]
                if val < best[j][k]:
                    best[j][k], back[j][k] = val, i
    j = len(values) - 1
    k = min(range(1, max_shapes + 1), key=lambda kk: best[j][kk])
    picks = []
    while j >= 0 and k >= 1:
        picks.append(values[j])
        j, k = back[j][k], k - 1
    return [min(v for v in picks if v >= n) for n in need]


def batch_needs(bucket: Bucket, bt: Batching) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per batch: its longest aligned prompt, its size and its longest gen."""
    nb = len(bt.shape_of)
    need = np.zeros(nb, np.int64)
    g_max = np.zeros(nb, np.int64)
    np.maximum.at(need, bt.batch_of, align(bucket.prompt_len))
    np.maximum.at(g_max, bt.batch_of, bucket.gen_len)
    return need, np.bincount(bt.batch_of, minlength=nb), g_max


def totals_at_shape(problem: Problem, n: np.ndarray, g: np.ndarray, s: int) -> np.ndarray:
    """What each batch (n members, longest gen g) costs at declared shape s (inf where it breaks the KV cap)."""
    s_arr = np.full(len(n), s, np.int64)
    return np.where(problem.cost.batch_fits(n, s_arr, g), problem.cost.batch_total(n, s_arr, g), np.inf)


def kept_shapes(problem: Problem, bucket: Bucket, bt: Batching, candidates: np.ndarray) -> np.ndarray:
    """Strict and device mode: each batch's new shape, the smallest kept one covering it, with the set of kept
    candidates chosen by an exact DP to cost least (compile charges plus every batch at its new shape)."""
    need, n, g = batch_needs(bucket, bt)
    shapes = np.asarray(candidates, dtype=np.int64)
    T = len(shapes)
    idx = np.searchsorted(shapes, need)  # every batch's smallest candidate covering it
    compile_ = problem.cost.shape_charge(shapes)
    # f[j]: least cost of serving every batch with idx <= j, shapes[j] kept and the highest so far
    f = np.full(T, np.inf)
    back = np.full(T, -1)
    for j in range(T):
        at_j = totals_at_shape(problem, n, g, int(shapes[j]))

        per = np.bincount(idx[idx <= j], weights=at_j[idx <= j], minlength=j + 1)[:j + 1]
        served = np.cumsum(per[::-1])[::-1]  # served[r] = cost at shapes[j] of batches with idx in r..j
        prev = np.r_[0.0, f[:j]]  # prev[r] = f[r - 1], 0 for r = 0 (nothing below)
        total = prev + served + compile_[j]
        if not np.isfinite(total).any():
            continue
        r = int(np.argmin(total))
        f[j], back[j] = total[r], r - 1
    top = int(np.searchsorted(shapes, need.max()))
    j = top + int(np.argmin(f[top:]))
    kept = []
    while j >= 0:
        kept.append(int(shapes[j]))
        j = int(back[j])
    kept = np.asarray(sorted(kept), dtype=np.int64)
    return kept[np.searchsorted(kept, need)]


def _lowered(bucket: Bucket, bt: Batching) -> np.ndarray:
    """Each batch at the smallest of its bucket's own shapes that covers it."""
    own = np.unique(bt.shape_of)
    return own[np.searchsorted(own, batch_needs(bucket, bt)[0])]


def redeclared(problem: Problem, batchings: tuple[Batching, ...]) -> list[tuple[str, tuple[Batching, ...]]]:
    """The re-declarations worth judging, best first: (what was done, batchings); only ones that differ."""
    out: list[tuple[str, tuple[Batching, ...]]] = []

    def add(what: str, shapes: list[np.ndarray]) -> None:
        new = tuple(Batching(bt.batch_of, np.asarray(s, dtype=np.int64)) for bt, s in zip(batchings, shapes,
                                                                                          strict=True))
        def differs(other: tuple[Batching, ...]) -> bool:
            return any(not np.array_equal(a.shape_of, c.shape_of) for a, c in zip(new, other, strict=True))

        if differs(batchings) and all(differs(o) for _, o in out):
            out.append((what, new))

    if not problem.cost.pads_to_shape:
        need = [int(align(b.prompt_len).max()) for b in problem.buckets]
        one = reference_shape_set(need, problem.cost, problem.max_shapes, usable(problem))
        add("one shape per bucket", [np.full(len(bt.shape_of), s) for bt, s in zip(batchings, one, strict=True)])
        return out
    union = np.unique(np.concatenate([bt.shape_of for bt in batchings]))
    add("each batch at the smallest kept shape covering it, the kept shapes chosen by an exact DP",
        [kept_shapes(problem, b, bt, union) for b, bt in zip(problem.buckets, batchings, strict=True)])
    needs = np.concatenate([batch_needs(b, bt)[0] for b, bt in zip(problem.buckets, batchings, strict=True)])
    allowed = usable(problem)
    if allowed is not None:
        needs = round_up_to(needs, allowed)
    wider = np.union1d(union, needs)
    if problem.max_seq_len is not None:
        wider = wider[wider <= max(problem.max_seq_len, int(union.max()))]
    if len(wider) > len(union):
        shapes = [kept_shapes(problem, b, bt, wider) for b, bt in zip(problem.buckets, batchings, strict=True)]
        if len(np.unique(np.concatenate(shapes))) <= problem.max_shapes:
            add("each batch at the smallest kept shape covering it, the kept shapes chosen by an exact DP over "
                "the used shapes and every batch's own prompt shape", shapes)
    add("each batch lowered to the smallest of its bucket's shapes covering it",
        [_lowered(b, bt) for b, bt in zip(problem.buckets, batchings, strict=True)])
    return out
