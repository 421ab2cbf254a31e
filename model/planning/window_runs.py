"""Device mode under fixed shapes: the best batches of every window at once, by dynamic programming.

Wherever every member is processed at its batch's declared shape (strict and device mode:
``CostModel.pads_to_shape``), a batch's cost at one declared shape s depends only on its
size n and its longest gen -- fixed + n * per-member within a decode regime
(``CostModel.run_parts``) -- so with a window's requests sorted by gen some optimal batching
cuts the sorted list into consecutive runs (``model.planning.exact_runs``).  ``batched_runs`` solves that DP for
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

import functools
from dataclasses import dataclass

import numpy as np

from model.base.runtime import Deadline
from model.cost.common import align
from model.cost.model import CostModel
from model.domain.schema import Batching, Bucket, Problem
from model.domain.shapeset import round_up_to, usable
from model.domain.windowing import windows_of

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

    @functools.cached_property
    def top(self) -> np.ndarray:
        """The longest entry shape of each window."""
        return np.array([int(s.max()) for s in self.S], dtype=np.int64)

    @functools.cached_property
    def flat(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(entry shape, gen, window position) of every request, window by window in gen order: what the
        interval costs select from with one mask instead of a Python step per window."""
        sizes = [len(r) for r in self.rows]
        return (np.concatenate(self.S) if sizes else np.zeros(0, np.int64),
                np.concatenate(self.G) if sizes else np.zeros(0, np.int64),
                np.repeat(np.arange(len(sizes)), sizes))


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


def batched_runs(gens: np.ndarray, m: np.ndarray, s, cost: CostModel, max_batch: int | None,
                 keep_choice: bool = False) -> tuple[np.ndarray, np.ndarray | None]:
    """Cheapest cut of each row of ``gens`` (sorted ascending in its first m[i] entries) into consecutive
    batches at shape s (one shape, or one per row): (cost per row, inf where a request fits no batch; the size
    of the batch ending at each position when ``keep_choice``).  A batch of n members ending at a position
    costs fixed + n * per there (``CostModel.run_parts``, in the regime a batch of n runs), if n is within that
    regime's sizes (the batch-size cap, the KV capacity)."""
    n_inst, width = gens.shape
    cost_to = np.zeros((n_inst, width + 1))
    take = np.zeros((n_inst, width + 1), dtype=np.int64) if keep_choice else None
    if width == 0 or n_inst == 0:
        return cost_to[:, 0], take
    g = np.maximum(gens, 1)
    shape = np.asarray(s, dtype=np.int64).reshape(-1, 1) if np.ndim(s) else np.int64(s)
    regimes = cost.decode_regimes()
    parts, his = {}, {}
    for large in regimes:
        fixed, per = cost.run_parts(shape, g, large)
        parts[large] = (np.broadcast_to(fixed, g.shape), np.broadcast_to(per, g.shape))
        his[large] = np.broadcast_to(cost.regime_range(shape, g, large, max_batch)[1], g.shape)
    small_f, small_p = parts[False]
    large_f, large_p = parts.get(True, parts[False])
    small_hi, large_hi = his[False], his.get(True, his[False])
    top = int(min(max(int(h.max(initial=0)) for h in his.values()), width))
    sizes = np.arange(1, max(top, 1) + 1)
    big = cost.is_large(sizes) if True in parts else np.zeros(len(sizes), dtype=bool)
    rows = np.arange(n_inst)
    for i in range(1, width + 1):
        sz = sizes[:min(i, top)]
        if not len(sz):
            cost_to[:, i] = INF
            continue
        b = big[:len(sz)]
        fixed = np.where(b, large_f[:, i - 1, None], small_f[:, i - 1, None])
        per = np.where(b, large_p[:, i - 1, None], small_p[:, i - 1, None])
        cap = np.where(b, large_hi[:, i - 1, None], small_hi[:, i - 1, None])
        total = cost_to[:, i - sz] + fixed + sz * per
        total = np.where(sz[None, :] <= cap, total, INF)
        k = np.argmin(total, axis=1)
        cost_to[:, i] = total[rows, k]
        if take is not None:
            take[:, i] = sz[k]
    return cost_to[rows, m], take


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


def group_costs(groups: list[np.ndarray], shapes: np.ndarray, cost: CostModel, max_batch: int | None
                ) -> np.ndarray:
    """Cost of each group of gens (sorted ascending) batched optimally at its shape (0 if empty)."""
    out = np.zeros(len(groups))
    for chunk in _length_chunks(np.array([len(g) for g in groups], dtype=np.int64)):
        gens, m = padded([groups[i] for i in chunk])
        out[chunk] = batched_runs(gens, m, np.asarray(shapes)[chunk], cost, max_batch)[0]
    return out


def group_cuts(groups: list[np.ndarray], shapes: np.ndarray, cost: CostModel, max_batch: int | None
               ) -> list[list[int]]:
    """The optimal batch sizes of each group of gens (sorted ascending), from its shortest gens up."""
    out: list[list[int]] = [[] for _ in groups]
    for chunk in _length_chunks(np.array([len(g) for g in groups], dtype=np.int64)):
        gens, m = padded([groups[i] for i in chunk])
        _, take = batched_runs(gens, m, np.asarray(shapes)[chunk], cost, max_batch, keep_choice=True)
        for row, i in enumerate(chunk.tolist()):
            sizes, at = [], int(m[row])
            while at > 0:
                sizes.append(int(take[row, at]))
                at -= sizes[-1]
            out[i] = sizes[::-1]
    return out


class IntervalCosts:
    """Cost of each window's requests with entry shape in (lo, hi] run at hi, cached per (lo, hi)."""

    def __init__(self, pools: WindowPools, cost: CostModel, max_batch: int | None) -> None:
        self.pools = pools
        self.cost = cost
        self.max_batch = max_batch
        self.cache: dict[tuple[int, int], np.ndarray] = {}

    def __call__(self, lo: int, hi: int) -> np.ndarray:
        key = (lo, hi)
        if key not in self.cache:
            S, G, win = self.pools.flat
            sel = (S > lo) & (S <= hi)
            out = np.zeros(len(self.pools))
            for rows, gens, m in padded_windows(G[sel], win[sel]):
                out[rows] = batched_runs(gens, m, hi, self.cost, self.max_batch)[0]
            self.cache[key] = out
        return self.cache[key]


def padded_windows(gens: np.ndarray, win: np.ndarray) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """The selected gens (grouped by window ``win``, ascending within each) as padded matrices of windows of
    similar size: (window positions, gens padded with each row's last, lengths) per block, built without a
    Python step per window (10^5 windows took seconds per shape interval that way)."""
    if not len(gens):
        return []
    rows, start, m = np.unique(win, return_index=True, return_counts=True)
    rank = np.arange(len(gens)) - np.repeat(start, m)
    row_of = np.repeat(np.arange(len(rows)), m)
    out = []
    order = np.argsort(m, kind="stable")
    lo = 0
    while lo < len(order):  # blocks of windows whose sizes are within 1.5x + 8 of the block's smallest
        hi = int(np.searchsorted(m[order], 1.5 * m[order[lo]] + 8, side="right"))
        block = order[lo:hi]
        width = int(m[block].max())
        at = np.full(len(rows), -1, dtype=np.int64)
        at[block] = np.arange(len(block))
        mat = np.repeat(gens[start[block] + m[block] - 1][:, None], width, axis=1)  # each row's last (largest)
        take = at[row_of] >= 0
        mat[at[row_of[take]], rank[take]] = gens[take]
        out.append((rows[block], mat, m[block]))
        lo = hi
    return out


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
    """Total cost of the windowed plan ``subset_dp`` makes with these shapes (compile included: each bucket
    compiles the shapes some window of it uses)."""
    shapes = np.asarray(shapes, dtype=np.int64)
    total = 0.0
    for costs in all_costs:
        value, used = subset_dp(costs, shapes)
        total += float(value.sum()) + float(problem.cost.shape_charge(shapes[used.any(axis=0)]).sum())
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
    pools, cost, max_batch = costs.pools, costs.cost, costs.max_batch
    assign = [a.copy() for a in assign]
    active = set(range(len(assign)))  # a window with no helpful move keeps none until it changes
    for rnd in range(rounds):
        if deadline.expired() or not active:
            break
        deadline.tick("windowed plan: moves between shapes", "round %d, %d windows still moving", rnd + 1, len(active))
        base_groups, base_shape, base = [], [], {}
        cand, cand_groups, cand_shape = [], [], []
        for n_done, w in enumerate(sorted(active)):
            if n_done % 1000 == 999 and deadline.expired():  # a round is a Python step per window
                break
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
        now = group_costs(base_groups, np.asarray(base_shape), cost, max_batch)
        after = group_costs(cand_groups, np.asarray(cand_shape), cost, max_batch).reshape(-1, 2).sum(axis=1)
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
    for mem, s, sizes in zip(members, shapes, group_cuts(gens, np.asarray(shapes), problem.cost,
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
