"""Device mode: the cheapest runs of a bucket's groups with its P95 limit counted exactly, by dynamic programming.

A P95 limit L lets at most A = ``allowed_above(n)`` of a bucket's n members ride over it: a
count over the whole bucket, not a rule per batch.  ``run_cuts.optimal_runs`` either keeps every
batch within L or prices the count by a Lagrangian weight, and a weight reaches only the convex
hull of the cost-versus-count curve.  Here the count is a state of the DP, so the best batching
under the count is found exactly.

One group (members sharing a window and a declared shape s, sorted by gen): some optimal
batching under the count still cuts the sorted list into consecutive runs -- with the same
batch sizes, dealing the members out in gen order never lengthens a batch's longest gen
(batches taken by their longest gen), so no batch's time rises and none crosses L upwards.
With ``over(n, i) = T(n, s, g_i) > L`` (L the group's limit: the P95 limit less the group's
longest wait):

    C[i, h, k] = min over n of  C[i - n, h', k - n * over(n, i)] + T(n, s, g_i)  (+ pad weight * tokens)

k counts the members over L so far (at most ``most``), and h says whether some batch so far
is a harmless spot for the shape's compile spike: the spike adds ``compile_ms`` to one member
of one batch at the shape, which puts that member over L unless its batch is over already or
has room for it (T + spike <= L).  So h = h' or harmless(n, i).

A bucket: the groups of one shape are combined by min-plus convolution over k with their
flags or-ed (one spike per shape, placed in whichever group has room), each shape's spike
then adds one member where no group had a spot, and the shapes are combined by min-plus
convolution.  The least total with k <= most is the bucket's best batching of these groups,
recovered by walking the choices back.  Where a shape's compile is per graph (compiled batch
sizes) every graph has a spike of its own, which the flag does not count: the judge does, and
the caller asks again with a smaller ``most``.  A plan, never a bound.

Counts in units.  The DP costs (members x run sizes x counts); with thousands of members
allowed over (a 12k-request trace allows 599) a count of one member per state is too dear,
so the count may be kept in units of u members: a run over the limit adds ceil(n / u) units,
a spike one, and the allowance is floor(A / u) units.  Every count it claims is then at
least the true one, so what it returns still meets the count; only u = 1 is exact.
``unit_for`` picks the least u whose DP fits a time budget.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from model.base.runtime import check_interrupt
from model.cost.model import CostModel
from model.domain.schema import Problem
from model.planning.groups import Group
from model.planning.run_cuts import pad_parts, size_parts

INF = np.inf
MAX_ENTRIES = 3_000_000  # (members + 1) x (count + 1) states a group's DP may hold (about 100 MB of tables)


@dataclass(frozen=True, eq=False)
class GroupRuns:
    """One group's DP over its gen-sorted members: ``table[i, h, k]`` the least objective of the first i members
    with exactly k over the limit and flag h (see module docstring); ``take``, ``came`` and ``over`` the size of
    the run ending at each state, the flag before it and the members over it adds, for walking back."""

    table: np.ndarray
    take: np.ndarray
    came: np.ndarray
    over: np.ndarray

    @property
    def value(self) -> np.ndarray:
        """The whole group's curve: ``value[h, k]``."""
        return self.table[-1]

    def prefix(self, i: int) -> GroupRuns:
        """The same DP for the group's first i members (the DP runs over prefixes: nothing to recompute)."""
        return GroupRuns(self.table[:i + 1], self.take[:i + 1], self.came[:i + 1], self.over[:i + 1])

    def batches(self, h: int, k: int) -> np.ndarray:
        """Each member's run number (0, 1, ... in gen order) of the batching that reaches (h, k)."""
        i, cuts = self.take.shape[0] - 1, []
        while i > 0:
            n = int(self.take[i, h, k])
            if n < 1:
                raise ValueError("no batching reaches this state")
            cuts.append(i)
            h, k, i = int(self.came[i, h, k]), k - int(self.over[i, h, k]), i - n
        bounds = np.asarray(sorted(cuts), dtype=np.int64)
        return np.searchsorted(bounds, np.arange(self.take.shape[0] - 1), side="right")


# the DP's time per (member, count, run size), and per member whatever its counts (numpy's per-step
# overhead): measured 1.8e-8 and 6e-5 on the 12k long-context trace's groups (87..3,444 members, counts 50..600,
# runs 2..57, 2 cores, quiet), kept about 1.5x above that so a loaded host still fits the time it is given
S_PER_STATE = 3e-8
S_PER_MEMBER = 9e-5


def fits(members: int, most: int) -> bool:
    """Whether a group of ``members`` with a count up to ``most`` stays within the DP's table budget."""
    return (members + 1) * (min(most, members) + 1) <= MAX_ENTRIES


def work(problem: Problem, group: Group) -> tuple[int, int]:
    """(members, the largest run the DP tries) of one group: its size and the largest batch any member fits."""
    caps = problem.cost.batch_cap(group.shape, group.gens, problem.max_batch_size)
    return len(group), int(min(len(group), caps.max(initial=0)))


def dp_seconds(works: list[tuple[int, int]], most: int) -> float:
    """About how long the DPs of groups with these ``work`` figures take with counts up to ``most``."""
    return sum(m * (S_PER_MEMBER + S_PER_STATE * min(m, most + 1) * runs) for m, runs in works)


def unit_for(works: list[tuple[int, int]], allowed: int, seconds: float) -> int:
    """The least count unit (members per unit, see module docstring) whose DPs over groups with these ``work``
    figures fit ``seconds`` and the table budget (``fits``), counting up to ``allowed`` members."""
    unit = 1
    while unit < max(1, allowed) and (dp_seconds(works, allowed // unit) > seconds
                                      or not all(fits(m, allowed // unit) for m, _ in works)):
        unit *= 2
    return unit


def group_runs(gens: np.ndarray, s: int, cost: CostModel, max_batch: int | None, limit: float | None, most: int,
               spike_ms: float, classes: frozenset | None = None, pad_weight: float = 0.0, unit: int = 1
               ) -> GroupRuns:
    """The DP of the module docstring for one group (``gens`` sorted ascending) at shape s, counting up to
    ``most`` units of ``unit`` members over ``limit`` (None: no limit, nobody is over, the flag is always set).
    Raises ValueError where a member fits no batch or no size of ``classes``; the caller checks ``fits``."""
    m = len(gens)
    K = 0 if limit is None else min(most, m)
    caps = cost.batch_cap(s, gens, max_batch)
    if (caps < 1).any():
        raise ValueError(f"a request does not fit one batch at shape {s}")
    sizes = np.arange(1, int(min(caps.max(), m)) + 1)
    fixed, per, row = size_parts(gens, s, cost, sizes)
    pad_fixed, pad_per = pad_parts(gens, s, cost) if pad_weight else (None, None)
    allowed = None if classes is None else np.isin(np.asarray(cost.size_class(sizes)), list(classes))
    value = np.full((m + 1, 2, K + 1), INF)
    value[0, 0 if limit is not None else 1, 0] = 0.0
    take = np.zeros((m + 1, 2, K + 1), dtype=np.int32)
    came = np.zeros((m + 1, 2, K + 1), dtype=np.int8)
    over_of = np.zeros((m + 1, 2, K + 1), dtype=np.int32)
    ks = np.arange(K + 1)
    for i in range(1, m + 1):
        if i % 4096 == 0:
            check_interrupt()
        cap = int(min(caps[i - 1], i))
        sz = sizes[:cap]
        t = fixed[row[:cap], i - 1] + sz * per[row[:cap], i - 1]
        obj = t if not pad_weight else t + pad_weight * (pad_fixed[row[:cap], i - 1] + sz * pad_per[row[:cap], i - 1])
        if allowed is not None:
            obj = np.where(allowed[:cap], obj, INF)
        if limit is None:
            over, harmless = np.zeros(cap, dtype=bool), np.ones(cap, dtype=bool)
        else:
            over = t > limit
            harmless = over | (t + spike_ms <= limit)
        add = np.where(over, -(-sz // unit), 0)
        src = ks[None, :] - add[:, None]
        ok = src >= 0
        src = np.clip(src, 0, K)
        prev = value[i - sz]  # (cap, 2, K + 1)
        rows = np.arange(cap)[:, None]
        from0 = np.where(ok, prev[rows, 0, src], INF) + obj[:, None]
        from1 = np.where(ok, prev[rows, 1, src], INF) + obj[:, None]
        # h = 0: from h' = 0 through a run that is no spot; h = 1: from h' = 1, or from h' = 0 through a spot
        to0 = np.where(harmless[:, None], INF, from0)
        spot = np.where(harmless[:, None], from0, INF)
        to1 = np.minimum(from1, spot)
        for h, table in ((0, to0), (1, to1)):
            j = np.argmin(table, axis=0)
            value[i, h] = table[j, ks]
            take[i, h] = np.where(np.isfinite(value[i, h]), sz[j], 0)
            over_of[i, h] = add[j]
            if h:  # a state with no spot came from one with none (``came`` stays 0)
                came[i, 1] = from1[j, ks] <= spot[j, ks]
    return GroupRuns(value, take, came, over_of)


def min_plus(a: np.ndarray, b: np.ndarray, most: int) -> tuple[np.ndarray, np.ndarray]:
    """(c, split): c[k] = min over j of a[k - j] + b[j] for k <= most, split[k] the j chosen (-1: none)."""
    size = min(most, len(a) + len(b) - 2) + 1
    c = np.full(size, INF)
    split = np.full(size, -1, dtype=np.int64)
    for j in range(min(len(b), size)):
        if not np.isfinite(b[j]):
            continue
        hi = min(size, len(a) + j)
        trial = a[:hi - j] + b[j]
        better = trial < c[j:hi]
        c[j:hi] = np.where(better, trial, c[j:hi])
        split[j:hi] = np.where(better, j, split[j:hi])
    return c, split


@dataclass(frozen=True)
class Step:
    """One combination of a fold: per result state, which state of the left part and of the new part made it."""

    left_h: np.ndarray
    left_k: np.ndarray
    right_h: np.ndarray
    right_k: np.ndarray


def fold_flags(a: np.ndarray, b: np.ndarray, most: int) -> tuple[np.ndarray, Step]:
    """Two flagged curves (2 x count) of one shape combined: counts added, flags or-ed."""
    size = min(most, a.shape[1] + b.shape[1] - 2) + 1
    out = np.full((2, size), INF)
    lh, lk, rh, rk = (np.full((2, size), -1, dtype=np.int64) for _ in range(4))
    for ha in (0, 1):
        for hb in (0, 1):
            c, split = min_plus(a[ha], b[hb], most)
            h = ha | hb
            better = c < out[h, :len(c)]
            out[h, :len(c)] = np.where(better, c, out[h, :len(c)])
            for arr, val in ((lh, ha), (rh, hb)):
                arr[h, :len(c)] = np.where(better, val, arr[h, :len(c)])
            k = np.arange(len(c))
            lk[h, :len(c)] = np.where(better, k - split, lk[h, :len(c)])
            rk[h, :len(c)] = np.where(better, split, rk[h, :len(c)])
    return out, Step(lh, lk, rh, rk)


def spiked(curve: np.ndarray, most: int) -> tuple[np.ndarray, np.ndarray]:
    """A shape's flagged curve after its spike: (value per final count up to ``most``, the flag each came
    from).  Without a spot the spike's member is one more over."""
    size = min(most, curve.shape[1]) + 1
    out = np.r_[curve[1], INF][:size]
    moved = np.r_[INF, curve[0]][:size]
    better = moved < out
    return np.where(better, moved, out), np.where(better, 0, 1)


def best_runs(tables: list[GroupRuns], shape_of: list[int], most: int) -> tuple[float, list[np.ndarray]] | None:
    """The least objective over every group's runs with at most ``most`` members over in all (spikes included,
    one per distinct shape), and each group's run numbers; None when no batching stays within the count."""
    by_shape: dict[int, list[int]] = {}
    for g, s in enumerate(shape_of):
        by_shape.setdefault(s, []).append(g)
    shapes = sorted(by_shape)
    per_shape = []
    for s in shapes:
        members = by_shape[s]
        curve, steps = tables[members[0]].value, []
        for g in members[1:]:
            curve, step = fold_flags(curve, tables[g].value, most)
            steps.append(step)
        final, came = spiked(curve, most)
        per_shape.append((final, came, steps))
    total, splits = np.zeros(1), []
    for final, _, _ in per_shape:
        total, split = min_plus(total, final, most)
        splits.append(split)
    if not np.isfinite(total).any():
        return None
    k = int(np.argmin(total))
    best = float(total[k])
    runs: list[np.ndarray] = [np.zeros(0, np.int64)] * len(tables)
    for s, (final, came, steps), split in reversed(list(zip(shapes, per_shape, splits, strict=True))):
        j = int(split[k])
        k -= j
        h = int(came[j])
        kk = j - (1 - h)  # the count before the spike
        members = by_shape[s]
        for g, step in reversed(list(zip(members[1:], steps, strict=True))):
            runs[g] = tables[g].batches(int(step.right_h[h, kk]), int(step.right_k[h, kk]))
            h, kk = int(step.left_h[h, kk]), int(step.left_k[h, kk])
        runs[members[0]] = tables[members[0]].batches(h, kk)
    return best, runs


def group_table(problem: Problem, group: Group, most: int, pad_weight: float = 0.0, unit: int = 1
                ) -> GroupRuns | None:
    """``group_runs`` of one group of a bucket; None where its tables would pass ``MAX_ENTRIES`` or its members
    cannot be cut into batches (a KV capacity, its size classes)."""
    limit = group.limit
    if limit is not None and not fits(len(group), most):
        return None
    try:
        return group_runs(group.gens, group.shape, problem.cost, problem.max_batch_size, limit, most,
                          float(problem.cost.spike_ms), group.classes, pad_weight, unit)
    except ValueError:
        return None


def counted_runs(problem: Problem, groups: list[Group], most: int, pad_weight: float = 0.0,
                 tables: dict | None = None, unit: int = 1) -> tuple[float, list[np.ndarray]] | None:
    """The best batching of a bucket's groups with at most ``most`` units of ``unit`` members over its P95 limit
    (``best_runs``):
    (objective plus one compile charge per shape with members, each group's run numbers; an empty group gets
    none), or None where a group cannot be cut.  ``tables`` caches each group's DP (by the group object, held
    in the cache so its identity stays its own); it is valid for one ``most``, ``pad_weight`` and ``unit``."""
    live = [g for g in groups if len(g)]
    found = []
    for g in live:
        entry = tables.get(id(g)) if tables is not None else None
        table = entry[1] if entry is not None and entry[0] is g else None  # the group is kept: its id is not reused
        if table is None:
            table = group_table(problem, g, most, pad_weight, unit)
            if table is None:
                return None
            if tables is not None:
                tables[id(g)] = (g, table)
        found.append(table)
    if all(g.limit is None for g in live):  # nobody is over and no spike counts: the groups' optima add up
        if not all(np.isfinite(t.value[1, 0]) for t in found):
            return None  # a group its classes cannot cut
        value, runs = sum(float(t.value[1, 0]) for t in found), [t.batches(1, 0) for t in found]
    else:
        best = best_runs(found, [g.shape for g in live], most)
        if best is None:
            return None
        value, runs = best
    shapes = np.unique([g.shape for g in live])
    charge = float(np.sum(problem.cost.shape_charge(shapes))) if problem.cost.n_compile_classes == 1 else 0.0
    it = iter(runs)
    return value + charge, [next(it) if len(g) else np.zeros(0, np.int64) for g in groups]
