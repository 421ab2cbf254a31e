"""Device mode under fixed shapes: the best batches of every window at once, by dynamic programming.

At one declared shape s a batch's time depends only on its size n and its longest gen,
so with a window's requests sorted by gen some optimal batching cuts the sorted list
into consecutive runs (``model.planning.exact_runs``).  ``batched_runs`` solves that DP for
many windows together -- one numpy step per position, vectorised over the windows and
the batch sizes -- so a whole trace's windows cost about as much as its largest one.

Under a shape set Y a window may leave some shapes of Y unused: its requests then run
on the next used shape above (they "move up" and share batches there, which pays when a
window holds only a few of them).  ``window_plan`` chooses the used subset of Y per
window exactly for that family -- every request on the smallest USED shape covering
it, each shape's requests cut into optimal runs -- by a DP over the intervals of Y.
It is a plan, never a bound.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from model.base.runtime import Deadline
from model.cost.common import align
from model.cost.device import DeviceProfile, linear_parts
from model.domain.schema import Batching, Bucket, Problem
from model.domain.shapeset import round_up_to, usable
from model.domain.windowing import windows_of
from model.packers.grouping import batch_capacity

INF = np.inf


def entry_shapes(problem: Problem, bucket: Bucket) -> np.ndarray:
    """Each request's smallest usable shape: its aligned prompt, or the smallest allowed shape covering it."""
    S = align(bucket.prompt_len)
    allowed = usable(problem)
    return S if allowed is None else round_up_to(S, allowed)


@dataclass(frozen=True, eq=False)
class WindowPools:
    """One bucket's requests grouped by window, each window's requests sorted by gen.

    ``rows[w]``, ``S[w]`` and ``G[w]`` are parallel (bucket row, entry shape, gen) for
    the w-th non-empty window ``windows[w]``.
    """

    bucket: int
    windows: np.ndarray
    rows: tuple[np.ndarray, ...]
    S: tuple[np.ndarray, ...]
    G: tuple[np.ndarray, ...]

    def __len__(self) -> int:
        return len(self.windows)

    @property
    def top(self) -> np.ndarray:
        """The longest entry shape of each window."""
        return np.array([int(s.max()) for s in self.S], dtype=np.int64)


def window_pools(problem: Problem) -> list[WindowPools]:
    """Every bucket's requests grouped by window and sorted by gen (ties in file order)."""
    out = []
    for i, b in enumerate(problem.buckets):
        wins = windows_of(problem, b)
        S = entry_shapes(problem, b)
        order = np.lexsort((np.arange(len(b)), b.gen_len, wins))
        w_sorted = wins[order]
        cuts = np.flatnonzero(np.r_[True, w_sorted[1:] != w_sorted[:-1], True])
        rows = tuple(order[a:z] for a, z in zip(cuts[:-1], cuts[1:], strict=True))
        out.append(WindowPools(i, w_sorted[cuts[:-1]], rows, tuple(S[r] for r in rows),
                               tuple(b.gen_len[r] for r in rows)))
    return out


def batched_runs(gens: np.ndarray, m: np.ndarray, s, prof: DeviceProfile, max_batch: int | None,
                 keep_choice: bool = False) -> tuple[np.ndarray, np.ndarray | None]:
    """Cheapest cut of each row of ``gens`` (sorted ascending in its first m[i] entries) into consecutive
    batches at shape s (one shape, or one per row): (device time per row, inf where a request fits no batch;
    the size of the batch ending at each position when ``keep_choice``)."""
    n_inst, width = gens.shape
    cost = np.zeros((n_inst, width + 1))
    take = np.zeros((n_inst, width + 1), dtype=np.int64) if keep_choice else None
    if width == 0 or n_inst == 0:
        return cost[:, 0], take
    g = np.maximum(gens, 1)
    shape = np.asarray(s, dtype=np.int64).reshape(-1, 1) if np.ndim(s) else int(s)
    caps = batch_capacity(shape, g, max_batch, prof.kv_capacity_tokens)
    small = linear_parts(shape, g, np.zeros(g.shape, bool), prof)
    large = linear_parts(shape, g, np.ones(g.shape, bool), prof) if prof.decode_large is not None else small
    switch = prof.decode_large_from if prof.decode_large is not None else np.iinfo(np.int64).max
    top = int(min(caps.max(initial=0), width))
    sizes = np.arange(1, max(top, 1) + 1)
    big = sizes >= switch
    rows = np.arange(n_inst)
    for i in range(1, width + 1):
        sz = sizes[:min(i, top)]
        if not len(sz):
            cost[:, i] = INF
            continue
        fixed = np.where(big[:len(sz)], large[0][:, i - 1, None], small[0][:, i - 1, None])
        per = np.where(big[:len(sz)], large[1][:, i - 1, None], small[1][:, i - 1, None])
        total = cost[:, i - sz] + fixed + sz * per
        total = np.where(sz[None, :] <= caps[:, i - 1, None], total, INF)
        k = np.argmin(total, axis=1)
        cost[:, i] = total[rows, k]
        if take is not None:
            take[:, i] = sz[k]
    return cost[rows, m], take


def padded(parts: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Rows of different lengths as one matrix (padded with each row's last value) and the lengths."""
    m = np.array([len(p) for p in parts], dtype=np.int64)
    width = int(m.max(initial=0))
    out = np.ones((len(parts), width), dtype=np.int64)
    for i, p in enumerate(parts):
        if len(p):
            out[i, :len(p)] = p
            out[i, len(p):] = p[-1]
    return out, m


def _length_chunks(lengths: np.ndarray) -> list[np.ndarray]:
    """Indices of the non-empty rows in chunks of similar length (so a padded matrix wastes little)."""
    order = np.argsort(lengths, kind="stable")
    order = order[lengths[order] > 0]
    out, start = [], 0
    while start < len(order):
        stop = start + 1
        while stop < len(order) and lengths[order[stop]] <= 1.5 * lengths[order[start]] + 8:
            stop += 1
        out.append(order[start:stop])
        start = stop
    return out


def group_costs(groups: list[np.ndarray], shapes: np.ndarray, prof: DeviceProfile, max_batch: int | None
                ) -> np.ndarray:
    """Device time of each group of gens (sorted ascending) batched optimally at its shape (0 if empty)."""
    out = np.zeros(len(groups))
    for chunk in _length_chunks(np.array([len(g) for g in groups], dtype=np.int64)):
        gens, m = padded([groups[i] for i in chunk])
        out[chunk] = batched_runs(gens, m, np.asarray(shapes)[chunk], prof, max_batch)[0]
    return out


def group_cuts(groups: list[np.ndarray], shapes: np.ndarray, prof: DeviceProfile, max_batch: int | None
               ) -> list[list[int]]:
    """The optimal batch sizes of each group of gens (sorted ascending), from its shortest gens up."""
    out: list[list[int]] = [[] for _ in groups]
    for chunk in _length_chunks(np.array([len(g) for g in groups], dtype=np.int64)):
        gens, m = padded([groups[i] for i in chunk])
        _, take = batched_runs(gens, m, np.asarray(shapes)[chunk], prof, max_batch, keep_choice=True)
        for row, i in enumerate(chunk.tolist()):
            sizes, at = [], int(m[row])
            while at > 0:
                sizes.append(int(take[row, at]))
                at -= sizes[-1]
            out[i] = sizes[::-1]
    return out


class IntervalCosts:
    """Device time of each window's requests with entry shape in (lo, hi] run at hi, cached per (lo, hi)."""

    def __init__(self, pools: WindowPools, prof: DeviceProfile, max_batch: int | None) -> None:
        self.pools = pools
        self.prof = prof
        self.max_batch = max_batch
        self.cache: dict[tuple[int, int], np.ndarray] = {}

    def members(self, lo: int, hi: int) -> list[np.ndarray]:
        """Per window, the positions (in its gen-sorted list) of the requests with entry shape in (lo, hi]."""
        return [np.flatnonzero((S > lo) & (S <= hi)) for S in self.pools.S]

    def __call__(self, lo: int, hi: int) -> np.ndarray:
        key = (lo, hi)
        if key not in self.cache:
            sel = self.members(lo, hi)
            out = np.zeros(len(self.pools))
            busy = [w for w, s in enumerate(sel) if len(s)]
            if busy:
                gens, m = padded([self.pools.G[w][sel[w]] for w in busy])
                out[busy] = batched_runs(gens, m, hi, self.prof, self.max_batch)[0]
            self.cache[key] = out
        return self.cache[key]


def subset_dp(costs: IntervalCosts, shapes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per window, the cheapest plan using a subset of ``shapes`` (every request on the smallest used shape
    covering it): (device time per window, the used shapes as a boolean matrix windows x shapes)."""
    shapes = np.asarray(shapes, dtype=np.int64)
    k = len(shapes)
    nw = len(costs.pools)
    top = np.searchsorted(shapes, costs.pools.top)  # every window's longest request needs shapes[top]
    best = np.full((k, nw), INF)
    back = np.full((k, nw), -1, dtype=np.int64)
    for j in range(k):
        hi = int(shapes[j])
        best[j] = costs(0, hi)
        for i in range(j):
            cand = best[i] + costs(int(shapes[i]), hi)
            better = cand < best[j]
            best[j] = np.where(better, cand, best[j])
            back[j] = np.where(better, i, back[j])
    ok = top < k
    value = np.full(nw, INF)
    value[ok] = best[top[ok], np.flatnonzero(ok)]
    used = np.zeros((nw, k), dtype=bool)
    for w in np.flatnonzero(ok):
        j = int(top[w])
        while j >= 0:
            used[w, j] = True
            j = int(back[j, w])
    return value, used


def shape_set_cost(problem: Problem, all_costs: list[IntervalCosts], shapes: np.ndarray) -> float:
    """Total device time of the windowed plan ``window_plan`` makes with these shapes (compile included:
    each bucket compiles the shapes some window of it uses)."""
    total = 0.0
    for costs in all_costs:
        value, used = subset_dp(costs, shapes)
        total += float(value.sum()) + problem.cost.params.compile_ms * int(used.any(axis=0).sum())
    return total


def subset_assignment(costs: IntervalCosts, shapes: np.ndarray) -> list[np.ndarray]:
    """Per window, the shape each request (in the window's gen order) runs on under ``subset_dp``: the
    smallest used shape covering it."""
    value, used = subset_dp(costs, shapes)
    if not np.isfinite(value).all():
        raise ValueError(f"a window cannot be planned with shapes {list(shapes)}")
    out = []
    for w, S in enumerate(costs.pools.S):
        on = shapes[used[w]]
        out.append(on[np.searchsorted(on, S)])
    return out


TAIL_SIZES = (1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233, 377)


def improve(costs: IntervalCosts, assign: list[np.ndarray], deadline: Deadline, rounds: int = 12
            ) -> list[np.ndarray]:
    """Move part of a used shape's requests up to the next used shape of their window -- the q longest or
    the q shortest gens, q from ``TAIL_SIZES`` or all -- where that lowers the window's exact cost (runs
    re-cut on both sides); the best move per window per round, until none helps or the deadline."""
    pools, prof, max_batch = costs.pools, costs.prof, costs.max_batch
    assign = [a.copy() for a in assign]
    active = set(range(len(assign)))  # a window with no helpful move keeps none until it changes
    for rnd in range(rounds):
        if deadline.expired() or not active:
            break
        deadline.tick("windowed plan: moves between shapes", "round %d, %d windows still moving", rnd + 1, len(active))
        base_groups, base_shape, base = [], [], {}
        cand, cand_groups, cand_shape = [], [], []
        for w in sorted(active):
            a_w = assign[w]
            used = np.unique(a_w)
            for s in used.tolist():
                base[(w, s)] = len(base_groups)
                base_groups.append(pools.G[w][a_w == s])  # the window's items are sorted by gen
                base_shape.append(s)
            for a, b in zip(used[:-1].tolist(), used[1:].tolist(), strict=True):
                ia, ib = np.flatnonzero(a_w == a), np.flatnonzero(a_w == b)
                for q in sorted({*(t for t in TAIL_SIZES if t < len(ia)), len(ia)}):
                    for moved in ((ia[-q:], ia[:q]) if q < len(ia) else (ia,)):
                        cand.append((w, a, b, moved))
                        cand_groups += [pools.G[w][np.setdiff1d(ia, moved)], pools.G[w][np.union1d(ib, moved)]]
                        cand_shape += [a, b]
        if not cand:
            break
        now = group_costs(base_groups, np.asarray(base_shape), prof, max_batch)
        after = group_costs(cand_groups, np.asarray(cand_shape), prof, max_batch).reshape(-1, 2).sum(axis=1)
        best: dict[int, tuple[float, int]] = {}
        for c, (w, a, b, _) in enumerate(cand):
            before = now[base[(w, a)]] + now[base[(w, b)]]
            delta = after[c] - before
            if delta < min(-1e-9 * before, best.get(w, (0.0, -1))[0]):
                best[w] = (delta, c)
        for _, c in best.values():
            w, _, b, moved = cand[c]
            assign[w][moved] = b
        active = set(best)
    return assign


def assignment_batchings(problem: Problem, costs: IntervalCosts, assign: list[np.ndarray]) -> Batching:
    """One bucket's batching: every window's requests on their assigned shapes, each shape's requests cut
    into optimal runs of gens."""
    pools = costs.pools
    bucket = problem.buckets[pools.bucket]
    members, gens, shapes = [], [], []
    for w, a_w in enumerate(assign):
        for s in np.unique(a_w).tolist():
            items = np.flatnonzero(a_w == s)
            members.append(pools.rows[w][items])
            gens.append(pools.G[w][items])
            shapes.append(s)
    batch_of = np.full(len(bucket), -1, dtype=np.int64)
    shape_out: list[int] = []
    for mem, s, sizes in zip(members, shapes, group_cuts(gens, np.asarray(shapes), problem.cost.params,
                                                         problem.max_batch_size), strict=True):
        at = 0
        for n in sizes:
            batch_of[mem[at:at + n]] = len(shape_out)
            shape_out.append(s)
            at += n
    return Batching(batch_of, np.asarray(shape_out, dtype=np.int64))


def window_plan(problem: Problem, all_costs: list[IntervalCosts], shapes: np.ndarray,
                deadline: Deadline | None = None) -> tuple[Batching, ...]:
    """Every bucket's batching under ``shapes``: per window the used subset chosen by ``subset_dp``, then
    (until ``deadline``) part of a shape's requests moved up where that pays (``improve``); each shape's
    requests cut into optimal runs."""
    shapes = np.asarray(sorted(set(int(s) for s in shapes)), dtype=np.int64)
    out = []
    for costs in all_costs:
        assign = subset_assignment(costs, shapes)
        if deadline is not None:
            assign = improve(costs, assign, deadline)
        out.append(assignment_batchings(problem, costs, assign))
    return tuple(out)
