"""The top interval's gains (``model.planning.top_interval``): the leave floor against every batch and every
member leaving it (across the decode-regime switch, with and without a KV capacity and a P95 penalty), the
mixed duals feasible for every batch of a small pool, the lazy DP equal to the DP over every gain, the gained
bound never above the brute-force optimum on 40 more seeded instances and tight (strictly above the ungained
one) on four where it binds, and the embedded default scenario's bound raised by more than 10,000 ms."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest
from helpers import brute_force, bucket, problem
from test_limit_bound import TOY

import model.planning.top_interval as top_interval_module
from model.base.runtime import Deadline
from model.cost.device import batch_time
from model.cost.model import cost_model
from model.domain.schema import Limits
from model.planning.limit_bound import LimitBound, one_window, p95_bound, shape_prices
from model.planning.shapes import charged_tables, own_bound
from model.planning.top_interval import gain, gained_own_bound, leave_floor, top_interval
from model.planning.window_bound import candidate_shapes, interval_table, lp_duals, penalised, suffix_min
from model.planning.window_runs import window_pools


def batch_penalised(n: int, s: int, G: int, prof, penalty) -> float:
    """T' of a batch of n members at shape s with longest gen G (0 for no members)."""
    return 0.0 if n == 0 else float(penalised(batch_time(n, s, G, prof), n, penalty))


@pytest.mark.parametrize("kv", [None, 1500])
@pytest.mark.parametrize("penalty", [None, (60.0, 7.0), (200.0, 50.0)])
@pytest.mark.parametrize("shape", [64, 256])
def test_a_member_leaving_lowers_the_batch_by_at_least_its_floor(kv, penalty, shape):
    prof = replace(TOY, kv_capacity_tokens=kv)
    gens = np.array([3, 10, 40, 41, 90, 200])
    floors = leave_floor(prof, shape, gens, None, penalty)
    checked = 0
    for size in range(1, len(gens) + 1):
        for batch in itertools.combinations(range(len(gens)), size):
            G = int(gens[list(batch)].max())
            if kv is not None and size * (shape + G) > kv:
                continue
            for r in batch:
                rest = [i for i in batch if i != r]
                after = batch_penalised(len(rest), shape, int(gens[rest].max()) if rest else 0, prof, penalty)
                fall = batch_penalised(size, shape, G, prof, penalty) - after
                assert fall >= floors[r] - 1e-9, (batch, r, fall, floors[r])
                checked += 1
    assert checked > 20


def test_the_floor_sees_a_batch_whose_time_rises_when_a_member_leaves():
    # TOY switches to its cheaper decode at 3 members: leaving a batch of 3 can make it slower
    gens = np.array([50, 50, 50])
    three = batch_penalised(3, 64, 50, TOY, None)
    two = batch_penalised(2, 64, 50, TOY, None)
    floor = leave_floor(TOY, 64, gens, None, None)
    assert three - two < 0 and floor[0] <= three - two + 1e-9


def feasible_everywhere(y: np.ndarray, gens: np.ndarray, s: int, prof, penalty, cap: int | None) -> bool:
    """sum over B of y <= T'(B) for every batch B of the pool at shape s (brute force)."""
    for size in range(1, len(gens) + 1):
        if cap is not None and size > cap:
            break
        for batch in itertools.combinations(range(len(gens)), size):
            if y[list(batch)].sum() > batch_penalised(size, s, int(gens[list(batch)].max()), prof, penalty) + 1e-7:
                return False
    return True


@pytest.mark.parametrize("seed", range(6))
def test_the_mixed_duals_are_feasible_for_every_batch_at_the_top(seed):
    rng = np.random.default_rng(seed)
    prompts = sorted(rng.integers(1, 400, 6).tolist())
    gens = rng.integers(1, 120, 6).tolist()
    prob = problem(bucket(prompts, gens), k=3, cost=cost_model("device", TOY))
    lim = float(batch_time(2, 448, 60, TOY))
    prob = replace(prob, limits=(Limits(max_p95_latency_ms=lim),))
    one = one_window(prob)
    pools = window_pools(one)
    cands = candidate_shapes(pools, prob.max_seq_len)
    pb = pools[0]
    for penalty in (None, (lim, 30.0)):
        psi = shape_prices(one, pb.S[0], pb.G[0], cands, Deadline.after(30), penalty)[0]
        ctx = top_interval(TOY, None, pb.S[0], pb.G[0], cands, psi, penalty)
        assert ctx is not None
        for lo in range(-1, ctx.top):
            M = ctx.j_of > lo
            y1 = ctx.floors.copy()
            y1[M] = lp_duals(ctx.g[M], ctx.c, TOY, None, penalty)
            for alpha in (0.0, 0.5, 1.0):
                y = alpha * y1 + (1 - alpha) * ctx.y2
                assert feasible_everywhere(y, ctx.g, ctx.c, TOY, penalty, None), (seed, lo, alpha)
            assert gain(ctx, lo) >= 0.0


def test_the_lazy_dp_equals_the_dp_over_every_gain():
    rng = np.random.default_rng(0)
    prompts = rng.integers(1, 1500, 40).tolist()
    gens = rng.integers(1, 60, 40).tolist()  # short gens: the fixed time is most of a batch's
    prob = problem(bucket(prompts, gens), k=3, cost=cost_model("device", TOY))
    one = one_window(prob)
    pools = window_pools(one)
    cands = candidate_shapes(pools, prob.max_seq_len)
    pb = pools[0]
    psi = shape_prices(one, pb.S[0], pb.G[0], cands, Deadline.after(30))[0]
    ctx = top_interval(TOY, None, pb.S[0], pb.G[0], cands, psi, None)
    phi = np.empty_like(psi)
    phi[pb.rows[0]] = suffix_min(psi)
    acc, charge, top = interval_table(one, pb, phi, cands)
    own, _ = charged_tables(acc, charge, top)
    lazy, computed = gained_own_bound(own, cands, prob.max_shapes, ctx, Deadline.never())
    full = own.copy()
    for lo in range(-1, top):
        full[lo + 1, top] += gain(ctx, lo)
    assert lazy == pytest.approx(own_bound(full, cands, top, prob.max_shapes)[0], rel=1e-12)
    assert lazy > own_bound(own, cands, top, prob.max_shapes)[0]
    assert 1 <= computed < top  # fewer gains than candidates below the top


def without_gains(prob, monkeypatch) -> float:
    """The bound with every gain zero and no riders' entries (what ``limit_bound`` gave before the top intervals'
    gains: the riders' bound, ``model.planning.rider_bound``, reaches the optimum on some of these by itself)."""
    import model.planning.limit_bound as limit_bound_module
    with monkeypatch.context() as m:
        m.setattr(top_interval_module, "gain", lambda ctx, lo: 0.0)
        m.setattr(limit_bound_module, "raised_table", lambda *args, **kw: (-np.inf, args[2], np.zeros(args[2].shape, dtype=bool)))
        return p95_bound(prob, Deadline.after(30)).bound


@pytest.mark.parametrize("seed", range(24, 64))
def test_the_gained_bound_stays_below_the_brute_force_optimum(seed):
    from test_limit_bound import instance
    prob = instance(seed)
    assert p95_bound(prob, Deadline.after(30)).bound <= brute_force(prob).cost * (1 + 1e-9)


@pytest.mark.parametrize("seed", [4, 16, 19, 23])
def test_the_gain_lifts_the_bound_to_the_optimum_where_it_binds(seed, monkeypatch):
    from test_limit_bound import instance
    prob = instance(seed)
    best = brute_force(prob).cost
    gained = p95_bound(prob, Deadline.after(30))
    assert isinstance(gained, LimitBound)
    assert without_gains(prob, monkeypatch) < gained.bound - 1e-6
    assert gained.bound == pytest.approx(best, rel=1e-9)  # tight here, and never above (the oracle test)


@pytest.mark.slow  # 2 s; scripts/bench.py --main-job measures the same bound
def test_the_default_scenario_bound_rises(monkeypatch):
    from model import pipeline
    prob, _ = pipeline.load_problem(pipeline.InputSpec(scenario=pipeline.DEFAULT_SCENARIO, max_shapes=8))
    assert p95_bound(prob, Deadline.after(60)).bound > without_gains(prob, monkeypatch) + 10_000
