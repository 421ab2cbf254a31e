"""Device mode without windows: the LP-price bound with every bucket's P95 limit priced by a Lagrangian.

A P95 limit L on a bucket of n requests is a counting constraint: at most A = ``allowed_above(n)``
members may have a latency above L, and in device mode a member's latency is its batch's time T (a
compile spike only adds to it).  So for any lam >= 0 and any plan that meets the limit,

    cost  >=  cost + lam * (members over L - A)  =  sum over batches [T + lam * |B| * (T > L)]  -  lam * A.

Pricing every batch at that penalised time -- the set-partitioning duals of ``window_bound.lp_duals``
with a penalty (``lp_duals(..., penalty)``), which still grows with a batch's gen and shape, so the gen rounding
and the anchors stay relaxations -- and subtracting lam * A gives a certified bound for every lam; lam = 0
is the LP-price bound (``window_bound.whole_trace_bound``).  The bound is concave in lam, so a few values
per bucket around the scale of a request's price find most of it.  Each bucket's own DP (a compile on
every interval, see ``model.planning.shapes``) depends on its own lam only, so each bucket's lam is chosen
on its own; the joint DP then takes every bucket's chosen lam.

A shape's prices need only be valid for the batches at that shape, so each shape may take the LP's duals
or the per-request floors, whichever sums higher over its pool (``shape_prices``): on the Azure conv trace
the floors win at some shapes and the bound rises from 8.730e6 to 8.774e6 (gap 1.89% -> 1.67%).

What it does not see: a batch at a shape holds only the requests the plan puts there, but the prices at
a shape are the duals of every request that may ride there (the pool), so where few requests sit in the
top intervals the bound stays below the plan; and the LP lets a request be "over" fractionally, where a
plan counts it whole.  On the embedded default scenario the bound rises about 5 % (369,673 -> 387,542),
far from the plan's 555,440: see scripts/bench.py --main-job.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from model.base.runtime import Deadline
from model.cost.common import allowed_above
from model.domain.schema import Problem, Windowing
from model.packers.grouping import batch_capacity
from model.planning.prefix_bound import MAX_WORK, prefix_bound
from model.planning.rider_bound import raised_table
from model.planning.shape_lp import SAFETY
from model.planning.shapes import charged_tables, own_bound, shape_dp
from model.planning.top_interval import gained_own_bound, top_interval
from model.planning.window_bound import (
    anchors,
    candidate_shapes,
    floor_block,
    growth,
    interval_table,
    lp_duals,
    suffix_min,
)
from model.planning.window_runs import WindowPools, window_pools

LAMBDA_STEPS = (0.25, 0.5, 1.0, 2.0, 4.0)  # multiples of a request's mean price tried per bucket
REFINE_ROUNDS = 2  # bisections of the multiplier on each side of the best step


@dataclass(frozen=True)
class Table:
    """One bucket's interval table (``window_bound.interval_table``: acc, charge, top) and, where the bucket is
    one window, that window's prices psi (its requests in gen order), which its top interval's gains need."""

    acc: np.ndarray
    charge: np.ndarray
    top: int
    psi: np.ndarray | None


@dataclass(frozen=True)
class LimitBound:
    """The certified bound, the multiplier each bucket's P95 limit got (0 without a limit), each bucket's
    own bound at it, whether the search over shape sets raised the bound, the buckets whose search did not
    end exact (more time could raise them) and those too large to search."""

    bound: float
    lams: tuple[float, ...]
    bucket_bounds: tuple[float, ...]
    searched: bool = False
    unfinished: tuple[int, ...] = ()
    too_large: tuple[int, ...] = ()


def one_window(problem: Problem) -> Problem:
    """The problem as one window (every plan of it is a plan of this, at the same cost and latency)."""
    return replace(problem, buckets=tuple(replace(b, arrival_s=np.zeros(len(b))) for b in problem.buckets),
                   windowing=Windowing(1.0, 0.0))


def shape_prices(problem: Problem, S: np.ndarray, g: np.ndarray, cands: np.ndarray, deadline: Deadline,
                 penalty: tuple[float, float] | None = None) -> list[np.ndarray]:
    """Two psi of one bucket's requests (entry shapes S, gens g, sorted by gen) at every candidate, inf below a
    request: ``window_bound.window_prices`` with the penalised duals, and the same with, at each shape, the
    per-request floors where their sum over the pool is the larger.

    Any valid price vector per shape keeps the bound valid (a batch at s only needs the prices at s), and
    the floors -- a member's own per-member time plus the batch's fixed time shared by as many as it can
    hold -- beat the LP's duals at some shapes (the duals maximise over the whole pool, most of which rides
    lower); which mixture the DP over shape sets prefers is not known in advance, so both are returned.
    Once ``deadline`` passes, the remaining shapes get the floors alone (unpenalised: lower, so valid)."""
    duals = np.full((len(g), len(cands)), np.inf)
    mixed = np.full((len(g), len(cands)), np.inf)
    p = problem.cost.params
    bases = anchors(S)
    for k, base in enumerate(bases.tolist()):
        nxt = int(bases[k + 1]) if k + 1 < len(bases) else None
        cols = np.flatnonzero((cands >= base) & ((cands < nxt) if nxt is not None else True))
        if not len(cols):
            continue
        floors = floor_block(problem, S, g, cands[cols])
        duals[:, cols] = mixed[:, cols] = floors
        if deadline.expired():
            continue
        pool = np.flatnonzero(S < nxt) if nxt is not None else np.arange(len(S))
        pool = pool[batch_capacity(base, g[pool], problem.max_batch_size, p.kv_capacity_tokens) >= 1]
        shapes = cands[cols]
        ok = (S[pool][:, None] <= shapes[None, :]) & (batch_capacity(
            shapes[None, :], g[pool][:, None], problem.max_batch_size, p.kv_capacity_tokens) >= 1)
        lp = np.full((len(g), len(cols)), np.inf)
        lp[pool] = np.where(ok, lp_duals(g[pool], base, p, problem.max_batch_size, penalty)[:, None]
                            + growth(g[pool], base, shapes, p), np.inf)
        duals[:, cols] = lp
        better = finite_sum(lp) > finite_sum(floors)
        mixed[:, cols[better]] = lp[:, better]
    return [duals, mixed]


def finite_sum(prices: np.ndarray) -> np.ndarray:
    """Per column, the sum of the finite prices (a request that cannot run there adds nothing)."""
    return np.where(np.isfinite(prices), prices, 0.0).sum(axis=0)


def bucket_tables(one: Problem, pools_b: WindowPools, cands: np.ndarray, lam: float, deadline: Deadline
                  ) -> list[Table]:
    """One bucket's interval tables (``window_bound.interval_table``), one per price mixture of
    ``shape_prices``, with its batches priced at the penalised time for ``lam`` (lam = 0: the plain LP), each
    with its window's prices where the bucket is one window."""
    penalty = penalty_of(one, pools_b.bucket, lam)
    phis = [np.full((len(one.buckets[pools_b.bucket]), len(cands)), np.inf) for _ in range(2)]
    kept: list[np.ndarray | None] = [None, None]
    for w in range(len(pools_b)):
        psis = shape_prices(one, pools_b.S[w], pools_b.G[w], cands, deadline, penalty)
        for k, (phi, psi) in enumerate(zip(phis, psis, strict=True)):
            phi[pools_b.rows[w]] = suffix_min(psi)
            if len(pools_b) == 1:
                kept[k] = psi
    return [Table(*interval_table(one, pools_b, phi, cands), psi) for phi, psi in zip(phis, kept, strict=True)]


def penalty_of(one: Problem, bucket: int, lam: float) -> tuple[float, float] | None:
    """(limit, lam) of the bucket's P95 limit priced at lam, None without a limit or at lam = 0."""
    limit = one.limits[bucket].max_p95_latency_ms
    return (float(limit), float(lam)) if limit is not None and lam > 0 else None


def own_value(table: Table, cands: np.ndarray, max_shapes: int) -> float:
    """A bucket's own bound from its interval table (before subtracting lam * A)."""
    own, _ = charged_tables(table.acc, table.charge, table.top)
    return own_bound(own, cands, table.top, max_shapes)[0]


def best_table(one: Problem, pools_b: WindowPools, cands: np.ndarray, lam: float, allowed: int | None,
               deadline: Deadline) -> tuple[float, float, Table, list[Table]]:
    """(own bound less lam * allowance, lam, table, every table) of the price mixture whose own bound is the
    highest, the first of every table being the LP prices alone."""
    tables = bucket_tables(one, pools_b, cands, lam, deadline)
    values = [own_value(table, cands, one.max_shapes) - lam * (allowed or 0) for table in tables]
    k = int(np.argmax(values))
    return values[k], lam, tables[k], tables


def refined(one: Problem, pools_b: WindowPools, cands: np.ndarray, allowed: int, tried: list[tuple],
            deadline: Deadline) -> tuple:
    """The best of ``tried`` (best_table results, by lam) after REFINE_ROUNDS bisections (geometric) on each
    side of the best multiplier: the bound is concave in lam, so its peak lies between the best's neighbours."""
    tried = sorted(tried, key=lambda t: t[1])
    for _ in range(REFINE_ROUNDS):
        k = max(range(len(tried)), key=lambda i: tried[i][0])
        sides = [(tried[k - 1][1], tried[k][1]) if k > 0 else None,
                 (tried[k][1], tried[k + 1][1]) if k + 1 < len(tried) else None]
        for lo, hi in (side for side in sides if side is not None):
            if deadline.expired():
                return max(tried, key=lambda t: t[0])
            mid = float(np.sqrt(lo * hi)) if lo > 0 else 0.5 * hi
            tried.append(best_table(one, pools_b, cands, mid, allowed, deadline))
        tried.sort(key=lambda t: t[1])
    return max(tried, key=lambda t: t[0])


def gained(one: Problem, pools_b: WindowPools, cands: np.ndarray, allowed: int | None, entry: tuple,
           deadline: Deadline) -> float:
    """A bucket's own bound from a ``best_table`` entry with its top interval's gains added until ``deadline``
    (``top_interval.gained_own_bound``); the entry's own value where the bucket is several windows or no gain
    is certified, and never below it (a gain the deadline cut is zero)."""
    value, lam, table, _ = entry
    if table.psi is None:
        return value
    ctx = top_interval(one.cost.params, one.max_batch_size, pools_b.S[0], pools_b.G[0], cands, table.psi,
                       penalty_of(one, pools_b.bucket, lam))
    if ctx is None:
        return value
    own, _ = charged_tables(table.acc, table.charge, table.top)
    return max(value, gained_own_bound(own, cands, one.max_shapes, ctx, deadline)[0] - lam * (allowed or 0))


@dataclass(frozen=True)
class Searchable:
    """One bucket's search over shape sets, ready to run: its pools, prices phi, raised table (``acc``, with the
    entries ``done``), chosen table and multiplier, and allowance; ``work`` (requests x candidates up to its
    top) orders the searches."""

    work: int
    bucket: int
    pools: WindowPools
    phi: np.ndarray
    acc: np.ndarray
    done: np.ndarray
    table: Table
    lam: float
    allowed: int | None


@dataclass(frozen=True)
class Priced:
    """``p95_bound`` before its search over shape sets: the one-window problem and its candidates, each bucket's
    multiplier and own bound, the searches to run, the joint DP's value and the sum of the own bounds (what
    the search must beat to have raised anything)."""

    one: Problem
    cands: np.ndarray
    lams: tuple[float, ...]
    owns: tuple[float, ...]
    searches: tuple[Searchable, ...]
    joint_value: float


def p95_bound(problem: Problem, deadline: Deadline, sets_s: float = 0.0) -> LimitBound:
    """The LP-price bound with each bucket's P95 limit priced by its best multiplier found before ``deadline``
    (see module docstring); without a P95 limit, lam = 0 alone (the LP prices, and the floors where better).
    Then each bucket's own bound is raised by the search over its shape sets for up to ``sets_s`` seconds
    (within ``deadline``; ``searched``)."""
    return searched(priced_buckets(problem, deadline), deadline.within(sets_s))


def priced_buckets(problem: Problem, deadline: Deadline) -> Priced:
    """Every bucket's tables, multiplier and own bound before ``deadline`` (``p95_bound`` but its search)."""
    allowance = [allowed_above(len(b)) if lim.max_p95_latency_ms is not None else None
                 for b, lim in zip(problem.buckets, problem.limits, strict=True)]
    one = one_window(problem)
    pools = window_pools(one)
    cands = candidate_shapes(pools, problem.max_seq_len)
    chosen, owns, searches = [], [], []
    for pools_b, allowed in zip(pools, allowance, strict=True):
        best = best_table(one, pools_b, cands, 0.0, allowed, deadline)
        scale = best[0] / max(1, len(one.buckets[pools_b.bucket]))  # a request's mean price
        tried = [best]
        for step in LAMBDA_STEPS if allowed is not None else ():  # an allowance of 0 is a limit too
            if deadline.expired():
                break
            tried.append(best_table(one, pools_b, cands, step * scale, allowed, deadline))
        # each bucket's own bound with its top interval's gains (``top_interval``, valid there alone): at the
        # best step first (the gains cost a few LPs, the bisection a few tables), then at the bisected lam
        stepped = max(tried, key=lambda t: t[0])
        own = gained(one, pools_b, cands, allowed, stepped, deadline)
        if allowed is not None:
            stepped = refined(one, pools_b, cands, allowed, tried, deadline)
            own = max(own, gained(one, pools_b, cands, allowed, stepped, deadline))
        value, lam, table, _ = stepped
        if table.psi is not None and not deadline.expired():  # the riders' bound on the same prices
            phi = suffix_min(table.psi)
            raised, acc, done = raised_table(one, [(pools_b.S[0], pools_b.G[0], phi)], table.acc, table.charge,
                                             table.top, cands, lam, one.limits[pools_b.bucket].max_p95_latency_ms,
                                             deadline)
            own = max(own, raised - lam * (allowed or 0))
            searches.append(Searchable(len(pools_b.S[0]) * (table.top + 1), len(owns), pools_b, phi, acc, done,
                                       table, lam, allowed))
        chosen.append(stepped)
        owns.append(own)
    lams = tuple(lam for _, lam, _, _ in chosen)
    subtract = sum(lam * (a or 0) for lam, a in zip(lams, allowance, strict=True))
    joint_value = -np.inf
    if len(pools) > 1:  # the joint DP over each bucket's chosen tables, and over the LP prices alone (no gains)
        for pick in ([table for _, _, table, _ in chosen], [tables[0] for _, _, _, tables in chosen]):
            joint = sum(charged_tables(table.acc, table.charge, table.top)[1] for table in pick)
            joint_value = max(joint_value, shape_dp(joint, cands, problem.max_shapes)[0] - subtract)
    return Priced(one, cands, lams, tuple(owns), tuple(sorted(searches, key=lambda t: (t.work, t.bucket))),
                  joint_value)


def searched(priced: Priced, deadline: Deadline, on_rise: Callable[[LimitBound], None] | None = None,
             max_work: int = MAX_WORK) -> LimitBound:
    """The bound with each bucket's own bound raised by the search over its shape sets (``prefix_bound``) until
    ``deadline``, the smallest searches first (a search that ends early leaves its time to the next), each
    the same share of what is left.  ``on_rise`` is told each higher bound as the searches go (each valid
    when told: the frontier's least is a bound at every moment).  ``unfinished`` names the buckets whose
    search did not end exact, ``too_large`` those not searched (above ``max_work``: requests x candidates)."""
    owns, unfinished = list(priced.owns), []
    too_large = [t.bucket for t in priced.searches if t.work > max_work]

    def bound_of(values: list[float], left: list[int]) -> LimitBound:
        value = max(priced.joint_value, sum(values))
        if np.isfinite(value):  # the DPs add entries without a margin: one ulp above the optimum at a tie
            value -= SAFETY * abs(value)
        return LimitBound(value, priced.lams, tuple(values), sum(values) > max(priced.joint_value, sum(priced.owns)),
                          tuple(sorted(left)), tuple(too_large))

    def told(item: Searchable, rest: list[int]) -> Callable[[float], None] | None:
        if on_rise is None:
            return None
        return lambda least: on_rise(bound_of([max(v, least - item.lam * (item.allowed or 0)) if b == item.bucket
                                               else v for b, v in enumerate(owns)], rest))

    todo = [t for t in priced.searches if t.work <= max_work]
    for k, item in enumerate(todo):
        rest = [t.bucket for t in todo[k:]]
        if deadline.expired():
            unfinished += rest
            break
        found = prefix_bound(priced.one, item.pools.S[0], item.pools.G[0], item.phi, item.acc, item.done,
                             item.table.charge, item.table.top, priced.cands, item.lam,
                             priced.one.limits[item.bucket].max_p95_latency_ms,
                             deadline.share(1.0 / (len(todo) - k)), told(item, rest), max_work)
        owns[item.bucket] = max(owns[item.bucket], found.bound - item.lam * (item.allowed or 0))
        if not found.exact:
            unfinished.append(item.bucket)
    return bound_of(owns, unfinished)
