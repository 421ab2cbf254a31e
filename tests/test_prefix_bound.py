"""The search over shape sets (``model.planning.prefix_bound``): on brute-forced device instances of 3-7 requests,
with and without a P95 limit, a KV capacity and a batch cap, its bound less lam times the allowance is never
above the optimum at any multiplier lam, never below the riders' DP it starts from, still valid wherever a
deadline cuts it (the frontier always covers every set), and on the embedded default it raises both buckets."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pytest
from helpers import brute_force
from test_limit_bound import instance as limited
from test_rider_bound import riders_instance

from model.base.runtime import Deadline
from model.cost.common import allowed_above
from model.planning import limit_bound as L
from model.planning import prefix_bound as PB
from model.planning.prefix_bound import prefix_bound, suffix_values
from model.planning.rider_bound import raised_table
from model.planning.shapes import charged_tables, own_bound
from model.planning.window_bound import candidate_shapes, suffix_min
from model.planning.window_runs import window_pools


@dataclass
class Checks:
    """A deadline that passes after ``left`` checks: a cut at a chosen point whatever the host's speed."""

    left: int

    def expired(self) -> bool:
        self.left -= 1
        return self.left < 0


def bounds(prob, lam: float, deadline=None, **kw) -> list[tuple[float, float, bool]]:
    """Per price table of the one-bucket problem at lam: (riders' DP, search, exact), each less lam times the
    allowance."""
    one = L.one_window(prob)
    pools = window_pools(one)
    cands = candidate_shapes(pools, prob.max_seq_len)
    lim = prob.limits[0].max_p95_latency_ms
    allowed = allowed_above(len(prob.buckets[0])) if lim is not None else 0
    S, G = pools[0].S[0], pools[0].G[0]
    out = []
    for table in L.bucket_tables(one, pools[0], cands, lam, Deadline.never()):
        phi = suffix_min(table.psi)
        _, acc, done = raised_table(one, [(S, G, phi)], table.acc, table.charge, table.top, cands, lam, lim,
                                    Deadline.never())
        own, _ = charged_tables(acc, table.charge, table.top)
        dp = own_bound(own, cands, table.top, prob.max_shapes)[0]
        found = prefix_bound(one, S, G, phi, acc, done, table.charge, table.top, cands, lam, lim,
                             Deadline.never() if deadline is None else deadline(), **kw)
        out.append((dp - lam * allowed, found.bound - lam * allowed, found.exact))
    return out


def check(prob, lams, deadline=None) -> None:
    best = brute_force(prob).cost
    for lam in lams:
        for dp, found, exact in bounds(prob, float(lam), deadline):
            assert found <= best * (1 + 1e-9) + 1e-9, (lam, found, best)
            if deadline is None:
                assert exact and found >= dp * (1 - 1e-9) - 1e-9, (lam, found, dp)


@pytest.mark.parametrize("seed", range(0, 48, 2))  # the even seeds are one bucket
def test_never_above_the_optimum_at_any_multiplier(seed):
    prob = limited(seed)
    best = brute_force(prob).cost
    scale = best / len(prob.buckets[0]) if np.isfinite(best) else 100.0
    rng = np.random.default_rng(seed)
    check(prob, [0.0, *(scale * rng.uniform(0.05, 20.0, 3))])
    check(replace(prob, limits=tuple(replace(lim, max_p95_latency_ms=None) for lim in prob.limits)), [0.0])


@pytest.mark.parametrize("seed", [s if s in (0, 3) else pytest.param(s, marks=pytest.mark.slow) for s in range(12)])
def test_never_above_the_optimum_where_riding_up_pays(seed):
    check(riders_instance(seed), [0.0])


@pytest.mark.parametrize("seed", [3, 9, pytest.param(0, marks=pytest.mark.slow), pytest.param(6, marks=pytest.mark.slow)])
@pytest.mark.parametrize("checks", [0, 3, 8, 20])
def test_cut_anywhere_it_stays_below_the_optimum(seed, checks):
    """Cut before anything is priced it claims nothing beyond the riders' DP; cut later, what it has is valid."""
    prob = riders_instance(seed)
    check(prob, [0.0], deadline=lambda: Checks(checks))
    if checks == 0:  # nothing priced: at most the riders' DP (or -inf)
        assert all(found == -np.inf or found <= dp * (1 + 1e-9) for dp, found, _ in bounds(prob, 0.0, lambda: Checks(0)))


def test_the_suffix_values_are_the_dp_over_the_sets_above():
    """F[i, k] against an enumeration of every set above candidate i ending at the top with at most k shapes."""
    import itertools

    rng = np.random.default_rng(5)
    top, K = 5, 3
    own = rng.uniform(1, 10, (top + 2, top + 1))
    F = suffix_values(own, top, K)
    for i in range(top):
        for k in range(1, K + 1):
            best = np.inf
            for m in range(0, k):
                for mid in itertools.combinations(range(i + 1, top), m):
                    path = [i, *mid, top]
                    best = min(best, sum(own[a + 1, b] for a, b in itertools.pairwise(path)))
            assert F[i, k] == pytest.approx(best)


def test_on_the_embedded_default_both_buckets_rise():
    """The short bucket's search ends exact within a few steps; chat's, cut after 300 deadline checks, is above its
    riders' DP (287,654) and below what the plan's chat batches cost (the plan is 455,719.6 in all)."""
    from model import pipeline

    prob, _ = pipeline.load_problem(pipeline.InputSpec(scenario=pipeline.DEFAULT_SCENARIO, max_shapes=8))
    one = L.one_window(prob)
    pools = window_pools(one)
    cands = candidate_shapes(pools, prob.max_seq_len)
    got = {}
    for pools_b in pools:
        b = pools_b.bucket
        lim = one.limits[b].max_p95_latency_ms
        allowed = allowed_above(len(one.buckets[b]))
        dl = Deadline.never()
        tried = [L.best_table(one, pools_b, cands, 0.0, allowed, dl)]
        scale = tried[0][0] / len(one.buckets[b])
        tried += [L.best_table(one, pools_b, cands, s * scale, allowed, dl) for s in L.LAMBDA_STEPS]
        _, lam, table, _ = L.refined(one, pools_b, cands, allowed, tried, dl)
        S, G, phi = pools_b.S[0], pools_b.G[0], suffix_min(table.psi)
        dp, acc, done = raised_table(one, [(S, G, phi)], table.acc, table.charge, table.top, cands, lam, lim, dl)
        found = prefix_bound(one, S, G, phi, acc, done, table.charge, table.top, cands, lam, lim, Checks(300))
        got[one.buckets[b].name] = (dp - lam * allowed, found.bound - lam * allowed, found.exact)
    assert got["short"][2] and got["short"][1] > got["short"][0] + 1000
    assert got["chat"][1] > got["chat"][0] + 1000 and got["chat"][1] + got["short"][1] < 455_719.6


def test_a_bucket_too_large_to_search_claims_nothing():
    """Above max_work (requests x candidates) the search does not start: -inf, and the caller keeps its bound."""
    prob = riders_instance(3)
    assert all(found == -np.inf for _, found, _ in bounds(prob, 0.0, max_work=1))


@pytest.mark.parametrize("seed", [3, 9])
def test_its_memory_cap_stops_it_short_and_what_it_has_holds(seed, monkeypatch):
    """NODE_BYTES counts the nodes made and the frontier's entries: a cap of a few nodes stops the search
    unfinished, below the optimum; the default cap lets the same instance end exact (so the small cap is what
    stopped it)."""
    prob = riders_instance(seed)
    best = brute_force(prob).cost
    assert all(exact for _, _, exact in bounds(prob, 0.0))
    n = sum(len(b) for b in prob.buckets)
    monkeypatch.setattr(PB, "NODE_BYTES", 2 * (PB.NODE_OVERHEAD + 32 * n))  # two nodes' worth at most
    cut = bounds(prob, 0.0)
    assert not any(exact for _, _, exact in cut)
    assert all(found <= best * (1 + 1e-9) + 1e-9 for _, found, _ in cut)


@pytest.mark.parametrize("kv", [100, 500])
def test_no_plan_is_inf_not_nan_and_a_tie_is_not_lifted_by_rounding(kv):
    """The review's instances: under a KV capacity of 100 no batch holds the 300-gen request (the bound is inf,
    once nan); at 500 the bound ties the optimum, which the LP-price DP's sums passed by one ulp (now with a
    margin: never above it, with no tolerance)."""
    from dataclasses import replace as swap

    from helpers import bucket, problem
    from test_shape_lp import TOY

    from model.cost.model import cost_model

    prob = problem(bucket([30, 100, 200], [10, 300, 10]), k=2,
                   cost=cost_model("device", swap(TOY, kv_capacity_tokens=kv)))
    best = brute_force(prob).cost
    found = [f for _, f, _ in bounds(prob, 0.0)]
    assert not any(np.isnan(f) for f in found) and all(f <= best for f in found)
    assert L.p95_bound(prob, Deadline.after(30), sets_s=30.0).bound <= best
