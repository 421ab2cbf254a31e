"""The riders' bound (``model.planning.rider_bound``): on brute-forced device instances of 3-7 requests, with and
without a P95 limit, a KV capacity and a batch cap, the raised own bound less lam times the allowance is never
above the optimum at any multiplier lam (a Lagrangian bound must hold at every lam, not only the best), never
below the LP-price table it raises, and on the embedded default it lifts the planner's bound."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import brute_force
from test_limit_bound import instance as limited

from model.base.runtime import Deadline
from model.cost.common import allowed_above
from model.planning import limit_bound as L
from model.planning.rider_bound import raised_own_bound
from model.planning.shapes import charged_tables, own_bound
from model.planning.window_bound import candidate_shapes, suffix_min
from model.planning.window_runs import window_pools


def raised_and_plain(prob, lam: float) -> tuple[float, float]:
    """(raised, plain) own bounds of the one-bucket problem at lam, each less lam times the allowance."""
    one = L.one_window(prob)
    pools = window_pools(one)
    cands = candidate_shapes(pools, prob.max_seq_len)
    lim = prob.limits[0].max_p95_latency_ms
    allowed = allowed_above(len(prob.buckets[0])) if lim is not None else 0
    out = []
    for table in L.bucket_tables(one, pools[0], cands, lam, Deadline.never()):
        own, _ = charged_tables(table.acc, table.charge, table.top)
        plain = own_bound(own, cands, table.top, prob.max_shapes)[0]
        raised = raised_own_bound(one, [(pools[0].S[0], pools[0].G[0], suffix_min(table.psi))], table.acc,
                                  table.charge, table.top, cands, lam, lim, Deadline.never())
        out.append((raised - lam * allowed, plain - lam * allowed))
    return max(out)


@pytest.mark.parametrize("seed", range(0, 48, 2))  # the even seeds are one bucket
def test_never_above_the_optimum_at_any_multiplier(seed):
    from dataclasses import replace

    prob = limited(seed)
    best = brute_force(prob).cost
    free = brute_force(replace(prob, limits=tuple(replace(lim, max_p95_latency_ms=None) for lim in prob.limits)))
    rng = np.random.default_rng(seed)
    scale = best / len(prob.buckets[0]) if np.isfinite(best) else 100.0
    for lam in [0.0, *(scale * rng.uniform(0.05, 20.0, 3))]:
        raised, plain = raised_and_plain(prob, float(lam))
        assert raised >= plain * (1 - 1e-9) - 1e-9
        assert raised <= best * (1 + 1e-9) + 1e-9, (lam, raised, best)
    unlimited = replace(prob, limits=tuple(replace(lim, max_p95_latency_ms=None) for lim in prob.limits))
    raised, _ = raised_and_plain(unlimited, 0.0)
    assert raised <= free.cost * (1 + 1e-9) + 1e-9


def test_on_the_embedded_default_the_planners_bound_rises():
    """The P95 bound of the embedded default with the riders' entries: 422,928.9 where the plain tables and their
    top-interval gains gave 402,214.5 (and the plan costs 455,719.6)."""
    from model import pipeline

    prob, _ = pipeline.load_problem(pipeline.InputSpec(scenario=pipeline.DEFAULT_SCENARIO, max_shapes=8))
    got = L.p95_bound(prob, Deadline.never())
    assert got.bound == pytest.approx(422_928.9, abs=1.0)


def riders_instance(seed: int):
    """6-7 requests spread over several shapes with a few long gens among short prompts (so riding up pays),
    K = 2 or 3, a KV capacity on every third."""
    from dataclasses import replace

    from helpers import bucket, problem
    from test_shape_lp import TOY

    from model.cost.model import cost_model
    rng = np.random.default_rng(1000 + seed)
    n = int(rng.integers(6, 8))
    prompts = rng.integers(1, 448, n).tolist()
    gens = [int(g) for g in rng.choice([5, 20, 60, 150, 250], n)]
    prof = replace(TOY, kv_capacity_tokens=1400 if seed % 3 == 0 else None)
    return problem(bucket(prompts, gens), k=int(rng.integers(2, 4)), cost=cost_model("device", prof))


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(12))
def test_never_above_the_optimum_where_riding_up_pays(seed):
    prob = riders_instance(seed)
    best = brute_force(prob).cost
    raised, plain = raised_and_plain(prob, 0.0)
    assert plain * (1 - 1e-9) - 1e-9 <= raised <= best * (1 + 1e-9) + 1e-9, (raised, plain, best)
