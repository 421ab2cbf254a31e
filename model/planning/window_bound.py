"""A certified lower bound for the windowed problem (one shape set Y for every window and bucket).

Prices.  For a window w, a candidate shape s and the window's requests whose smallest
usable shape is at most s (the "pool" P_w(s): exactly the requests a batch declared at
s may hold), ``psi[r, s]`` is a price per request such that every batch B at s drawn
from the pool costs at least the sum of its members' prices.  Taking
``phi[r, s] = min over s' >= s of psi[r, s']`` keeps that true and makes phi grow with
s.  Then for ANY shape set Y and ANY plan under Y,

    cost >= sum over requests r of phi[r, y(r)]  +  a compile lower bound,

with y(r) the smallest shape of Y covering r: each batch at s pays at least the sum of
psi[., s] over its members, and every member has y(r) <= s, so phi[r, y(r)] <=
psi[r, s].  A sum over requests of a function of y(r) splits over the intervals
(y_{i-1}, y_i] of Y, so its minimum over every Y with |Y| <= K is an exact dynamic
program over the candidate shapes -- the certified bound, valid whatever shapes a
planner picks.  The compile part: every bucket compiles at least one shape (in the
analytic modes at least the smallest shape of Y covering its longest prompt).

Where the prices come from.  Device mode: at one shape s a batch's time depends only on
its size and longest gen, and the best prices of the pool are the optimal dual of the
set-partitioning LP over every batch at s.  Requests dominated by a longer gen may take
no more, so the duals can be taken nondecreasing in gen, and then the constraints that
matter are the runs of consecutive gens: the dual is the greatest convex P with
P[i] - P[i - n] <= T(n, s, g_i).  ``lp_duals`` finds it in one pass up the gens
(``projections.greatest_convex``) and scales it down to exact feasibility against
rounding.  Gens are rounded DOWN to at most
``LEVELS`` levels first (a relaxation).  The LP is solved at each distinct shape of the
window's own requests; between two of them the pool is the same and the prices at the
lower one plus the per-member growth of T are feasible.  Anywhere the time budget ran
out, and in the analytic modes, the prices are per-request floors: the member's own
per-member cost plus the batch's fixed part shared by as many members as a batch can
hold (the KV capacity, the batch-size cap and the pool's size).

This bound ignores that a request riding above its own shape pays more than its price
there; so it is weaker where windows are small and the plan moves many requests up.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from model.base.runtime import Deadline
from model.cost.device import DeviceProfile, batch_time, linear_parts
from model.domain.schema import Problem, Windowing
from model.packers.grouping import batch_capacity
from model.planning.parallel import chunks, run_items, shared, workers_available
from model.planning.projections import greatest_convex
from model.planning.rider_bound import raised_own_bound
from model.planning.shapes import charged_tables, own_bound, shape_dp, shape_sets
from model.planning.window_runs import WindowPools, window_pools

# gen levels per LP (gens rounded down to request-weighted quantiles beyond that); with 48 levels the
# whole-trace bound on the Azure code trace was 3.20e6, with 1000 3.48e6 (windows of 60 s: 3.98e6 -> 4.14e6)
LEVELS = 1000


def gen_levels(g: np.ndarray, most: int = LEVELS) -> np.ndarray:
    """Each (sorted) gen rounded DOWN to one of at most ``most`` levels (the smallest gen is one)."""
    distinct = np.unique(g)
    if len(distinct) <= most:
        return g
    picks = np.unique(np.r_[distinct[0], np.quantile(g, np.linspace(0, 1, most)[1:], method="lower")])
    return picks[np.searchsorted(picks, g, side="right") - 1]


def suffix_min(psi: np.ndarray) -> np.ndarray:
    """phi[r, s] = min over candidates s' >= s of psi[r, s'] (see module docstring: it keeps every batch's
    prices below its cost and makes phi grow with s)."""
    return np.minimum.accumulate(psi[:, ::-1], axis=1)[:, ::-1]


def penalised(T: np.ndarray, n, penalty: tuple[float, float] | None) -> np.ndarray:
    """Batch times T of n members with ``penalty`` = (limit, lam): lam per member where T exceeds the limit."""
    if penalty is None:
        return T
    limit, lam = penalty
    return np.where(T > limit, T + lam * np.asarray(n, dtype=np.float64), T)


def lp_duals(g: np.ndarray, s: int, prof: DeviceProfile, max_batch: int | None,
             penalty: tuple[float, float] | None = None) -> np.ndarray:
    """Prices of requests with gens ``g`` (sorted ascending) for every batch at shape s drawn from them:
    nondecreasing, and sum(prices of B) <= T(|B|, s, max gen of B) for every such batch B (see module).

    With ``penalty`` = (limit, lam) every batch over the limit is priced at its time plus lam per member
    (``model.planning.limit_bound``'s Lagrangian of a P95 limit): the penalised time still grows with the gen,
    so the same projections and gens rounded down stay a relaxation."""
    h, c = np.unique(gen_levels(g), return_counts=True)
    N = np.r_[0, np.cumsum(c)].astype(np.float64)
    caps = np.minimum(batch_capacity(s, h, max_batch, prof.kv_capacity_tokens), N[1:].astype(np.int64))
    top = int(caps.max(initial=0))
    if top < 1:
        return np.zeros(len(g))
    n = np.arange(1, top + 1)
    valid = n[None, :] <= caps[:, None]
    T = penalised(batch_time(np.minimum(n[None, :], np.maximum(caps[:, None], 1)), s, h[:, None], prof),
                  n[None, :], penalty)
    T = np.where(valid, T, np.inf)
    src = np.maximum(N[1:, None] - n[None, :], 0.0)
    V = np.r_[0.0, np.cumsum(c * penalised(batch_time(1, s, h, prof), 1, penalty))]  # everyone alone: above P
    V = greatest_convex(N, V, T)
    sums = V[1:, None] - np.interp(src, N, V)
    theta = max(1.0, float(np.max(np.where(valid, sums / T, 0.0))))
    slope = np.diff(V) / c / theta
    return np.repeat(np.maximum(slope, 0.0), c)


def floor_prices(problem: Problem, S: np.ndarray, g: np.ndarray, s, pool) -> np.ndarray:
    """Per-request floors at shape s: own per-member cost plus the fixed part shared by the most members a
    batch at s can hold (KV capacity, batch-size cap, ``pool`` requests); inf where a request cannot fit.
    Arguments broadcast (requests down, shapes across), so a block of shapes is priced in one call."""
    cm = problem.cost
    cap_b = problem.max_batch_size
    if cm.shared_batch_time:
        switch = cm.params.decode_large_from
        out_shape = np.broadcast_shapes(np.shape(g), np.shape(s), np.shape(pool))
        best = np.full(out_shape, np.inf)
        cap = np.minimum(batch_capacity(s, g, cap_b, cm.kv_capacity), pool)
        for large in cm.decode_regimes():
            lo = switch if large else 1
            hi = cap if large or switch is None else np.minimum(cap, switch - 1)
            fixed, per = cm.linear_parts(np.broadcast_to(s, out_shape), np.broadcast_to(g, out_shape), large)
            share = per + fixed / np.maximum(hi, 1)
            best = np.where(lo <= hi, np.minimum(best, share), best)
        return best
    own = cm.member_cost(cm.arc_member_length(S, np.broadcast_to(s, np.broadcast_shapes(np.shape(g), np.shape(s)))),
                         g)
    pool = np.asarray(pool)
    return own + cm.batch_floor / np.maximum(1, np.minimum(pool, cap_b or pool))



FLOOR_BLOCK = 2_000_000  # requests x shapes priced per call by ``floor_block``
FLOOR_S_PER_ENTRY = 5e-7  # seconds a (request, shape) floor takes in ``floor_windows`` (measured: 3.3e-7)


def floor_block(problem: Problem, S: np.ndarray, g: np.ndarray, shapes: np.ndarray) -> np.ndarray:
    """(requests x shapes) floors, inf where a shape is below the request, each shape's pool the requests with
    S at most it.  Outside reference mode a floor depends on the gen alone, so it is priced once per
    distinct gen and spread; blocks of shapes keep the temporaries near FLOOR_BLOCK elements."""
    out = np.full((len(g), len(shapes)), np.inf)
    pools = np.searchsorted(np.sort(S), shapes, side="right")
    by_gen = problem.cost.pads_to_shape
    gens, gen_of = np.unique(g, return_inverse=True) if by_gen else (g, np.arange(len(g)))
    step = max(1, FLOOR_BLOCK // max(1, len(g)))
    for lo in range(0, len(shapes), step):
        sh, pl = shapes[lo:lo + step], pools[lo:lo + step]
        at_gen = floor_prices(problem, S[:, None], gens[:, None], sh[None, :], pl[None, :])
        out[:, lo:lo + step] = np.where(S[:, None] <= sh[None, :], at_gen[gen_of], np.inf)
    return out


def anchors(S: np.ndarray) -> np.ndarray:
    """The window's distinct shapes at which an LP is solved: the first, then each where the pool (the
    requests with shape at most it) has grown by a tenth (and at least 2 requests) since the last anchor."""
    distinct, counts = np.unique(S, return_counts=True)
    pool = np.cumsum(counts)
    picks, last = [0], pool[0]
    for i in range(1, len(distinct)):
        if pool[i] >= max(last + 2, 1.1 * last):
            picks.append(i)
            last = pool[i]
    return distinct[picks]


def window_prices(problem: Problem, S: np.ndarray, g: np.ndarray, cands: np.ndarray, use_lp: bool,
                  deadline: Deadline = Deadline.never()) -> np.ndarray:
    """psi for one window of one bucket: (requests, candidates), inf where a candidate is below the request.

    ``S`` and ``g`` are the window's entry shapes and gens, sorted by gen.  With the LP, one is solved per
    anchor a (``anchors``) at shape a over every request below the next anchor: a batch at any shape
    s in [a, next anchor) draws from that pool and costs at least T at a plus each member's growth to s.
    Once ``deadline`` passes, the remaining anchors' shapes are priced by per-request floors (valid, weaker):
    the whole trace as one window is one call, and its LPs took seconds past a short time limit.
    """
    psi = np.full((len(g), len(cands)), np.inf)
    p = problem.cost.params
    lp = use_lp and problem.cost.shared_batch_time
    bases = anchors(S) if lp else np.unique(S)
    for k, base in enumerate(bases.tolist()):
        nxt = int(bases[k + 1]) if k + 1 < len(bases) else None
        cols = np.flatnonzero((cands >= base) & ((cands < nxt) if nxt is not None else True))
        if not len(cols):
            continue
        if lp and not deadline.expired():
            pool = np.flatnonzero(S < nxt) if nxt is not None else np.arange(len(S))
            fits = batch_capacity(base, g[pool], problem.max_batch_size, p.kv_capacity_tokens) >= 1
            pool = pool[fits]
            base_price = lp_duals(g[pool], base, p, problem.max_batch_size)
            shapes = cands[cols]
            ok = (S[pool][:, None] <= shapes[None, :]) & (batch_capacity(shapes[None, :], g[pool][:, None],
                                                                         problem.max_batch_size,
                                                                         p.kv_capacity_tokens) >= 1)
            block = base_price[:, None] + growth(g[pool], base, shapes, p)
            psi[np.ix_(pool, cols)] = np.where(ok, block, np.inf)
        else:
            psi[:, cols] = floor_block(problem, S, g, cands[cols])
    return psi


def growth(g: np.ndarray, base: int, shapes: np.ndarray, p: DeviceProfile) -> np.ndarray:
    """(members x shapes): the least a member of gen g adds to its batch's time when the batch's shape grows
    from base to each of ``shapes`` (the per-member part of T, in the cheaper decode regime; the fixed part
    does not depend on the shape)."""
    g = np.asarray(g, dtype=np.int64)[:, None]
    grid = np.asarray(shapes, dtype=np.int64)[None, :]
    out = np.full((g.shape[0], grid.shape[1]), np.inf)
    for large in ([False, True] if p.decode_large is not None else [False]):
        at = linear_parts(grid, g, large, p)[1] - linear_parts(base, g, large, p)[1]
        out = np.minimum(out, at)
    return np.maximum(out, 0.0)


def floor_windows(problem: Problem, pools_b: WindowPools, windows: list[int], cands: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray]:
    """(rows, phi) of many windows of one bucket priced by per-request floors at once: what ``window_prices``
    gives each of them without the LP, in blocks of about FLOOR_BLOCK (request, shape) pairs rather than a
    call per window and shape (10^4 windows took 12 s that way, over a 2.5 s share).  A request's pool at a
    shape is the requests of its own window with entry shape at most it."""
    if not windows:
        return np.zeros(0, dtype=np.int64), np.zeros((0, len(cands)))
    rows = np.concatenate([pools_b.rows[w] for w in windows])
    S = np.concatenate([pools_b.S[w] for w in windows])
    g = np.concatenate([pools_b.G[w] for w in windows])
    win = np.repeat(np.arange(len(windows)), [len(pools_b.rows[w]) for w in windows])
    T = len(cands)
    j_of = np.searchsorted(cands, S)  # entry shapes are candidates (or above the last, which none covers)
    fits = j_of < T
    counts = np.bincount(win[fits] * T + j_of[fits], minlength=len(windows) * T).reshape(len(windows), T)
    pool = np.cumsum(counts, axis=1)  # pool[w, j]: requests of window w with entry shape <= cands[j]
    phi = np.empty((len(rows), T))
    step = max(1, FLOOR_BLOCK // max(1, T))
    for lo in range(0, len(rows), step):
        sl = slice(lo, lo + step)
        psi = floor_prices(problem, S[sl, None], g[sl, None], cands[None, :], pool[win[sl]])
        psi = np.where(cands[None, :] >= S[sl, None], psi, np.inf)
        phi[sl] = suffix_min(psi)
    return rows, phi


def _price_windows(item: tuple[int, range]) -> tuple[list[tuple[np.ndarray, np.ndarray]], list[int]]:
    """Worker: the LP prices (rows, phi rows) of the windows ``item`` names (one bucket's), one window after
    another until the deadline, and the windows left for the floors (which the caller prices all at once: on
    a worker they cost their arrays' transfer back, seconds at 10^5 windows)."""
    problem, pools, cands, use_lp, deadline = shared()
    b, windows = item
    out = []
    rest = list(windows)
    while rest and use_lp and not deadline.expired():
        w = rest.pop(0)
        psi = window_prices(problem, pools[b].S[w], pools[b].G[w], cands, True, deadline)
        out.append((pools[b].rows[w], suffix_min(psi)))
    return out, rest


PARALLEL_MIN_REQUESTS = 4000  # below this the LP prices take well under a second: no processes


def all_prices(problem: Problem, pools: list[WindowPools], cands: np.ndarray, use_lp: bool, deadline: Deadline
               ) -> tuple[list[np.ndarray], int]:
    """phi of every bucket (rows in file order x candidates) and how many windows got LP prices; the LPs run
    on several processes when they have enough to do, and stop early enough for the floors of every window
    (``floor_windows``, here, all at once) to fit before the deadline."""
    n_req = sum(len(b) for b in problem.buckets)
    parallel = use_lp and n_req >= PARALLEL_MIN_REQUESTS
    parts = 2 * workers_available() if parallel else 1
    items = [(b, r) for b, pb in enumerate(pools) for r in chunks(len(pb), parts)]
    lp_until = Deadline(deadline.at - FLOOR_S_PER_ENTRY * n_req * len(cands))
    results = run_items(_price_windows, items, (problem, pools, cands, use_lp, lp_until), parallel)
    phis = [np.full((len(problem.buckets[pb.bucket]), len(cands)), np.inf) for pb in pools]
    lp_windows = 0
    rest: list[list[int]] = [[] for _ in pools]
    for (b, _), (priced, left) in zip(items, results, strict=True):
        for rows, phi in priced:
            phis[b][rows] = phi
        lp_windows += len(priced)
        rest[b] += left
    for b, windows in enumerate(rest):
        rows, phi = floor_windows(problem, pools[b], windows, cands)
        phis[b][rows] = phi
    return phis, lp_windows


@dataclass(frozen=True)
class WindowBound:
    """The certified bound, the shapes achieving its relaxation (a good start), and how it was priced;
    ``shape_sets`` are the relaxation's best sets under every cap k <= K (more starts)."""

    bound: float
    bucket_bounds: tuple[float, ...]
    shapes: tuple[int, ...]
    lp_windows: int
    windows: int
    shape_sets: tuple[tuple[int, ...], ...] = ()


def candidate_shapes(pools: list[WindowPools], max_seq_len: int | None) -> np.ndarray:
    """Every shape an optimal plan may use: the distinct entry shapes (a shape between two of them can be
    lowered to the one below without raising any cost)."""
    shapes = np.unique(np.concatenate([np.concatenate(p.S) for p in pools]))
    return shapes[shapes <= max_seq_len] if max_seq_len is not None else shapes


def interval_table(problem: Problem, pools_b: WindowPools, phi: np.ndarray, cands: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray, int]:
    """(acc, charge, top): acc[lo + 1, hi] is one bucket's sum of phi[r, hi] over its requests with entry
    shape in (cands[lo], cands[hi]]; charge[hi] its compile cost of cands[hi]; top the index of the smallest
    candidate covering its longest request."""
    T = len(cands)
    bucket = problem.buckets[pools_b.bucket]
    S = np.zeros(len(bucket), dtype=np.int64)
    for rows, s in zip(pools_b.rows, pools_b.S, strict=True):
        S[rows] = s
    j_of = np.searchsorted(cands, S)
    charge = problem.cost.shape_charge(cands)
    acc = np.zeros((T + 1, T))
    for hi in range(T):
        fits = j_of <= hi
        per_j = np.bincount(j_of[fits], weights=phi[fits, hi], minlength=T)[:hi + 1]
        acc[:hi + 1, hi] = np.cumsum(per_j[::-1])[::-1]
    return acc, charge, int(j_of.max())


def window_bound(problem: Problem, pools: list[WindowPools], deadline: Deadline, use_lp: bool = True,
                 raise_until: Deadline | None = None) -> WindowBound:
    """The certified lower bound of the windowed problem (see module docstring), and per bucket the bound of
    that bucket alone.

    As in ``model.planning.shapes``: a bucket alone, over the shapes it uses, pays each one's compile, so
    its own DP charges a compile on every interval; jointly, over the union of those sets, a bucket need
    not use a shape that covers some of its requests, so only its longest request's interval is charged.
    The bound is the larger of the joint DP and the sum of the buckets' own; its shapes are the one
    bucket's own DP's, or with several the joint DP's.  With ``raise_until`` (device mode) each bucket's own
    bound has its entries raised by the riders' bound (``model.planning.rider_bound``) until then."""
    cands = candidate_shapes(pools, problem.max_seq_len)
    phis, lp_windows = all_prices(problem, pools, cands, use_lp and problem.cost.shared_batch_time, deadline)
    joint, bucket_bounds, own_shapes, own_sets = 0.0, [], (), ()
    for pools_b, phi in zip(pools, phis, strict=True):
        acc, charge, top = interval_table(problem, pools_b, phi, cands)
        own_table, joint_table = charged_tables(acc, charge, top)
        joint = joint + joint_table
        value, own_shapes = own_bound(own_table, cands, top, problem.max_shapes)
        own_sets = shape_sets(own_table[:top + 2, :top + 1], cands[:top + 1], problem.max_shapes)
        if raise_until is not None and problem.cost.shared_batch_time and not raise_until.expired():
            windows = [(pools_b.S[w], pools_b.G[w], phi[pools_b.rows[w]]) for w in range(len(pools_b))]
            value = max(value, raised_own_bound(problem, windows, acc, charge, top, cands, 0.0, None, raise_until))
        bucket_bounds.append(value)
    value, shapes = shape_dp(joint, cands, problem.max_shapes)
    sets = shape_sets(joint, cands, problem.max_shapes)
    if len(pools) == 1:
        shapes, sets = own_shapes, own_sets
    return WindowBound(max(value, sum(bucket_bounds)), tuple(bucket_bounds), shapes, lp_windows,
                       sum(len(p) for p in pools), sets)


def whole_trace_bound(problem: Problem, deadline: Deadline) -> float:
    """Device mode without windows: the same certified bound with the whole trace as one window.

    Every plan of the unwindowed problem is a plan of its one-window form with the same cost (a window
    changes latency only, which the bound does not use), so the bound holds for it.  It charges each
    batch at least its set-partitioning LP value, which the shape relaxation (members in full batches)
    does not: on the embedded default scenario it is 28% higher; on the Azure traces, lower."""
    one = replace(problem, buckets=tuple(replace(b, arrival_s=np.zeros(len(b))) for b in problem.buckets),
                  windowing=Windowing(1.0, 0.0))
    return window_bound(one, window_pools(one), deadline, use_lp=True).bound
