"""Device mode: the cheapest cut of one shape's gen-sorted requests into consecutive batches, by dynamic programming.

For one shape s, a batch's time depends only on its size n and its longest gen, so with
the requests sorted by gen some optimal batching cuts the sorted list into consecutive
runs (swapping two members across two batches never shortens the longer one's gen).
``optimal_runs`` finds the cheapest cuts exactly:

    C[i] = min over n <= cap(s, g_i) of  C[i - n] + T(n, s, g_i)     (g_i = gen of member i, sorted)

with T the cost model's batch time (with batch buckets T(B(n)): a run of n members runs in
its graph, the same argument holding for T(B(n), s, g)) and cap the KV capacity and
batch-size cap (and the largest bucket whose graph fits).  With batch buckets each graph a
shape's runs use is one more compile, which ``priced_runs`` weighs by dropping buckets
while that lowers the exact total.  ``filled_cost`` is the greedy fill the shape DP ranks
intervals by.  These are plans, never bounds (``model.planning.exact_runs`` uses them).
"""

from __future__ import annotations

import numpy as np

from model.cost.model import CostModel


def size_parts(gens: np.ndarray, s: int, cost: CostModel, sizes: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(fixed[c, i], per[c, i], class row of each size): T = fixed + n * per for a batch of n members in size
    class c whose longest gen is gens[i] -- the decode regimes, or with batch buckets one class per bucket
    (constant time T(B)) -- so the DP prices every size by the cost model's own linear parts."""
    kinds = cost.size_classes()
    parts = [cost.linear_parts(s, gens, np.full(len(gens), c)) for c in kinds]
    fixed = np.stack([f for f, _ in parts])
    per = np.stack([u for _, u in parts])
    row = np.searchsorted(np.asarray(kinds, dtype=np.int64), np.asarray(cost.size_class(sizes), dtype=np.int64))
    return fixed, per, row


def optimal_runs(gens: np.ndarray, s: int, cost: CostModel, max_batch: int | None,
                 latency_limit: float | None = None, classes: set | None = None, pad_weight: float = 0.0,
                 over_weight: float | None = None) -> tuple[float, np.ndarray]:
    """Cheapest cut of ``gens`` (sorted ascending) into consecutive batches at shape s.

    Returns (total batch time, batch number of each member).  Exact for the order given
    (T from the cost model's per-batch and per-member parts, each size class on its own
    sizes: with batch buckets a run of n costs its graph's T(B(n))).  With a
    ``latency_limit`` no batch takes longer than it, except batches of members that
    exceed it even alone (every member's latency is its batch's time): a P95 limit then
    counts no member over it that need not be.  ``classes`` keeps only the sizes of those
    size classes (None: every size); ValueError when the runs cannot be cut into them.

    Two Lagrangian weights let a caller price the limits that bind the whole bucket rather
    than one batch (``model.planning.rebatch``): ``pad_weight`` charges each batch that many
    ms per KV token it holds (``CostModel.box_pad``: its members' padding plus what no
    partition changes), and ``over_weight``, with a ``latency_limit``, turns the limit soft
    -- a batch over it is allowed, charged that many ms per member (what a P95 limit
    counts).  The DP minimises the weighted sum; the total returned is always the runs'
    own device time (``CostModel.batch_total``), weights aside.
    """
    n = len(gens)
    best = np.full(n + 1, np.inf)
    best[0] = 0.0
    take = np.zeros(n + 1, dtype=np.int64)
    caps = cost.batch_cap(s, gens, max_batch)
    if (caps < 1).any():
        raise ValueError(f"a request does not fit one batch at shape {s}")
    sizes = np.arange(1, int(min(caps.max(), n)) + 1)
    fixed, per, row = size_parts(gens, s, cost, sizes)
    pad_fixed, pad_per = (pad_parts(gens, s, cost) if pad_weight else (np.zeros_like(fixed), np.zeros_like(per)))
    soft = latency_limit is not None and over_weight is not None
    allowed = None if classes is None else np.isin(np.asarray(cost.size_class(sizes)), list(classes))
    if allowed is not None and not allowed.any():
        raise ValueError(f"no batch size of the classes {sorted(classes)} fits at shape {s}")
    smallest = 0 if allowed is None else int(np.argmax(allowed))  # the smallest size a member may ride in
    # members over the limit even alone: a suffix of the gen order (time grows with gen)
    first_over = n
    if latency_limit is not None and not soft:
        alone = fixed[row[smallest]] + sizes[smallest] * per[row[smallest]]
        first_over = int(np.searchsorted(alone > latency_limit, True))  # alone is non-decreasing in gen
    for i in range(1, n + 1):
        cap = int(min(caps[i - 1], i))
        sz = sizes[:cap]
        time_ = fixed[row[:cap], i - 1] + sz * per[row[:cap], i - 1]
        cost_ = best[i - sz] + time_
        if pad_weight:
            cost_ = cost_ + pad_weight * (pad_fixed[row[:cap], i - 1] + sz * pad_per[row[:cap], i - 1])
        if soft:
            cost_ = cost_ + np.where(time_ > latency_limit, over_weight * sz, 0.0)
        elif latency_limit is not None:
            keep = time_ <= latency_limit if i <= first_over else sz <= i - first_over
            cost_ = np.where(keep | (sz == sizes[smallest]), cost_, np.inf)
        if allowed is not None:
            cost_ = np.where(allowed[:cap], cost_, np.inf)
        k = int(np.argmin(cost_))
        best[i], take[i] = cost_[k], sz[k]
    if not np.isfinite(best[n]):
        raise ValueError(f"the requests cannot be cut into batches of the classes {sorted(classes)} at shape {s}")
    cuts = []
    i = n
    while i > 0:
        cuts.append(i)
        i -= int(take[i])
    bounds = np.asarray(sorted(cuts), dtype=np.int64)
    batch = np.searchsorted(bounds, np.arange(n), side="right")
    if pad_weight or soft:
        return runs_time(gens, batch, s, cost), batch
    return float(best[n]), batch


def pad_parts(gens: np.ndarray, s: int, cost: CostModel) -> tuple[np.ndarray, np.ndarray]:
    """(per batch[c, i], per member[c, i]) KV tokens a batch of size class c with longest gen gens[i] holds at
    shape s (``CostModel.box_pad``): what a pad weight charges (the members' own tokens are the same in every
    cut, so charging all the tokens charges the padding)."""
    parts = [cost.box_pad(np.full(len(gens), s), gens, np.full(len(gens), c)) for c in cost.size_classes()]
    return np.stack([f for f, _ in parts]), np.stack([u for _, u in parts])


def runs_time(gens: np.ndarray, batch: np.ndarray, s: int, cost: CostModel) -> float:
    """Device time of runs (``gens`` sorted, ``batch`` their run numbers) at shape s: each run's
    ``CostModel.batch_total`` at its size and its last (longest) gen."""
    sizes = np.bincount(batch)
    return float(cost.batch_total(sizes, s, gens[np.cumsum(sizes) - 1]).sum())


def compile_units(sizes: np.ndarray, cost: CostModel) -> int:
    """How many compiles batches of these sizes need at one shape: 1 where the compile is per shape, one per
    distinct graph (batch bucket) they run in where it is per graph."""
    if not len(sizes):
        return 0
    return len(np.unique(cost.compile_class(cost.size_class(np.asarray(sizes, dtype=np.int64)))))


def members_over(gens: np.ndarray, batch: np.ndarray, s: int, cost: CostModel, limit: float | None) -> int:
    """How many members of these runs (``gens`` sorted, ``batch`` their run numbers) ride in a batch whose
    time exceeds ``limit`` (0 without a limit): what a P95 limit counts."""
    if limit is None:
        return 0
    sizes = np.bincount(batch)
    g_max = gens[np.r_[np.cumsum(sizes) - 1]]
    return int(sizes[cost.batch_total(sizes, s, g_max) > limit].sum())


def priced_runs(gens: np.ndarray, s: int, cost: CostModel, max_batch: int | None,
                latency_limit: float | None = None, classes: frozenset | None = None) -> tuple[float, np.ndarray]:
    """``optimal_runs`` with the compile its runs need at shape s: (device time plus compiles, batch of each
    member).  With batch buckets every bucket a run uses is one more graph to compile, which the DP does not
    see: the buckets it uses are then dropped one at a time while the exact total (time plus one compile per
    graph) drops, each trial re-cut by the DP over the remaining buckets' sizes -- and only where no more
    members end over ``latency_limit`` than before (without the smaller buckets a member may have no batch
    within the limit left).  ``classes`` (None: all) are the size classes the runs may use at all."""
    t, batch = optimal_runs(gens, s, cost, max_batch, latency_limit, classes)
    charge = float(cost.shape_charge(s))
    total = t + charge * compile_units(np.bincount(batch), cost)
    if cost.n_compile_classes == 1:
        return total, batch
    over = members_over(gens, batch, s, cost, latency_limit)
    keep = set(cost.size_classes()) if classes is None else set(classes)
    improved = True
    while improved:
        improved = False
        used = sorted(set(cost.size_class(np.bincount(batch)).tolist()))
        for c in used if len(used) > 1 else []:
            try:
                t2, batch2 = optimal_runs(gens, s, cost, max_batch, latency_limit, keep - {c})
            except ValueError:
                continue
            total2 = t2 + charge * compile_units(np.bincount(batch2), cost)
            if total2 < total * (1 - 1e-12) and members_over(gens, batch2, s, cost, latency_limit) <= over:
                total, batch, keep, improved = total2, batch2, keep - {c}, True
                break
    return total, batch


def filled_cost(gens: np.ndarray, s: int, cost: CostModel, max_batch: int | None) -> float:
    """Device time of ``gens`` (sorted ascending) cut greedily into runs filled to capacity at shape s, plus
    the compiles those runs need (``compile_units``).

    An upper bound on ``priced_runs`` that costs one step per batch instead of one per
    member: what the shape DP ranks intervals by before the chosen shapes are batched exactly.  inf where a
    request does not fit one batch at s (under a KV capacity a request may fit its own shape only).
    """
    n = len(gens)
    total, p = 0.0, 0
    sizes = []
    while p < n:
        window = int(min(n - p, cost.batch_cap(s, gens[p:p + 1], max_batch)[0] + 1))
        fits = np.arange(1, window + 1) <= cost.batch_cap(s, gens[p:p + window], max_batch)
        take = int(np.argmin(fits)) if not fits.all() else window
        if take == 0:  # this request fits at its own shape but not at s (KV capacity): no interval up to s
            return np.inf
        total += float(cost.batch_total(take, s, gens[p + take - 1]))
        sizes.append(take)
        p += take
    return total + float(cost.shape_charge(s)) * compile_units(np.asarray(sizes), cost)
