"""Device mode without windows: the LP-price bound with every bucket's P95 limit priced by a Lagrangian.

A P95 limit L on a bucket of n requests is a counting constraint: at most A = ``allowed_above(n)``
members may have a latency above L, and in device mode a member's latency is its batch's time T (a
compile spike only adds to it).  So for any lam >= 0 and any plan that meets the limit,

    cost  >=  cost + lam * (members over L - A)  =  sum over batches [T + lam * |B| * (T > L)]  -  lam * A.

Pricing every batch at that penalised time -- the set-partitioning duals of ``window_bound.lp_duals``
with a penalty, which still grows with a batch's gen and shape, so the gen rounding and the anchors stay
relaxations -- and subtracting lam * A gives a certified bound for every lam; lam = 0 is the LP-price
bound (``window_bound.whole_trace_bound``).  The bound is concave in lam, so a few values per bucket
around the scale of a request's price find most of it.  Each bucket's own DP (a compile on every
interval, see ``model.planning.shapes``) depends on its own lam only, so each bucket's lam is chosen on
its own; the joint DP then takes every bucket's chosen lam.

What it does not see: a batch at a shape holds only the requests the plan puts there, but the prices at
a shape are the duals of every request that may ride there (the pool), so where few requests sit in the
top intervals the bound stays below the plan; and the LP lets a request be "over" fractionally, where a
plan counts it whole.  On the embedded default scenario this lifts the bound by about 4 % (369,673 ->
about 384,000), far from the plan's 555,440: see scripts/bench.py --main-job.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from model.base.runtime import Deadline
from model.cost.common import allowed_above
from model.domain.schema import Problem, Windowing
from model.planning.shapes import charged_tables, own_bound, shape_dp
from model.planning.window_bound import candidate_shapes, interval_table, whole_trace_bound, window_prices
from model.planning.window_runs import WindowPools, window_pools

LAMBDA_STEPS = (0.25, 0.5, 1.0, 2.0, 4.0)  # multiples of a request's mean price tried per bucket


@dataclass(frozen=True)
class LimitBound:
    """The certified bound, the multiplier each bucket's P95 limit got (0 without a limit) and each bucket's
    own bound at it."""

    bound: float
    lams: tuple[float, ...]
    bucket_bounds: tuple[float, ...]


def one_window(problem: Problem) -> Problem:
    """The problem as one window (every plan of it is a plan of this, at the same cost and latency)."""
    return replace(problem, buckets=tuple(replace(b, arrival_s=np.zeros(len(b))) for b in problem.buckets),
                   windowing=Windowing(1.0, 0.0))


def bucket_tables(one: Problem, pools_b: WindowPools, cands: np.ndarray, lam: float, deadline: Deadline
                  ) -> tuple[np.ndarray, np.ndarray, int]:
    """One bucket's interval table (``window_bound.interval_table``) with its batches priced at the penalised
    time for ``lam`` (lam = 0: the plain LP prices)."""
    limit = one.limits[pools_b.bucket].max_p95_latency_ms
    penalty = (float(limit), float(lam)) if limit is not None and lam > 0 else None
    phi = np.full((len(one.buckets[pools_b.bucket]), len(cands)), np.inf)
    for w in range(len(pools_b)):
        psi = window_prices(one, pools_b.S[w], pools_b.G[w], cands, True, deadline, penalty)
        phi[pools_b.rows[w]] = np.minimum.accumulate(psi[:, ::-1], axis=1)[:, ::-1]
    return interval_table(one, pools_b, phi, cands)


def own_value(table: tuple[np.ndarray, np.ndarray, int], cands: np.ndarray, max_shapes: int) -> float:
    """A bucket's own bound from its interval table (before subtracting lam * A)."""
    acc, charge, top = table
    own, _ = charged_tables(acc, charge, top)
    return own_bound(own, cands, top, max_shapes)[0]


def p95_bound(problem: Problem, deadline: Deadline) -> LimitBound:
    """The LP-price bound with each bucket's P95 limit priced by its best multiplier found before ``deadline``
    (see module docstring).  Without any P95 limit it is ``whole_trace_bound`` itself."""
    allowance = [allowed_above(len(b)) if lim.max_p95_latency_ms is not None else None
                 for b, lim in zip(problem.buckets, problem.limits, strict=True)]
    if all(a is None for a in allowance):
        value = whole_trace_bound(problem, deadline)
        return LimitBound(value, (0.0,) * len(problem.buckets), ())
    one = one_window(problem)
    pools = window_pools(one)
    cands = candidate_shapes(pools, problem.max_seq_len)
    chosen, owns = [], []
    for pools_b, allowed in zip(pools, allowance, strict=True):
        table = bucket_tables(one, pools_b, cands, 0.0, deadline)
        best = (own_value(table, cands, problem.max_shapes), 0.0, table)
        if allowed is not None:  # an allowance of 0 is a limit too
            scale = best[0] / max(1, len(one.buckets[pools_b.bucket]))  # a request's mean price
            for step in LAMBDA_STEPS:
                if deadline.expired():
                    break
                lam = step * scale
                trial = bucket_tables(one, pools_b, cands, lam, deadline)
                value = own_value(trial, cands, problem.max_shapes) - lam * allowed
                if value > best[0]:
                    best = (value, lam, trial)
        owns.append(best[0])
        chosen.append(best)
    lams = tuple(lam for _, lam, _ in chosen)
    joint = sum(charged_tables(*table)[1] for _, _, table in chosen)
    subtract = sum(lam * (a or 0) for lam, a in zip(lams, allowance, strict=True))
    joint_value = shape_dp(joint, cands, problem.max_shapes)[0] - subtract if len(pools) > 1 else -np.inf
    return LimitBound(max(joint_value, sum(owns)), lams, tuple(owns))
