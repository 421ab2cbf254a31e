"""Every bound plan_mip certifies, against the brute-force optimum, on seeded two-bucket instances in every
cost model (a bound above an optimum is a false claim; a 4-request probe once had one 1.8% above).

Instances: two buckets of 2-3 requests (prompts 1-700, gens 1-400), K 1-3, some with a batch-size cap,
so that buckets share or split shapes and a bucket may skip a shape the other needs."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import brute_force, bucket, mode_cost, plan_mip, problem

from model.cost.device import DeviceProfile

TOY = DeviceProfile(name="toy", prefill=(2.0, 0.01, 1e-5), decode=(5.0, 1e-4, 0.02),
                    decode_large=(3.0, 1e-4, 0.05), decode_large_from=3, compile_ms=40.0)


def instance(seed: int, mode: str):
    rng = np.random.default_rng(seed)
    buckets = [bucket(rng.integers(1, 700, n).tolist(), rng.integers(1, 400, n).tolist(), name=name)
               for name, n in (("a", int(rng.integers(2, 4))), ("b", int(rng.integers(2, 4))))]
    cap = [None, None, 2][seed % 3]
    return problem(*buckets, k=int(rng.integers(1, 4)), cost=mode_cost(mode, TOY), max_batch_size=cap)


@pytest.mark.parametrize("mode", ["reference", "strict", "device"])
@pytest.mark.parametrize("seed", range(10))
def test_the_certified_bound_is_below_the_brute_force_optimum(mode, seed):
    prob = instance(seed, mode)
    best = brute_force(prob).cost
    planned = plan_mip(prob, time_limit=10)
    assert planned.report.bound is not None
    assert planned.report.bound <= best * (1 + 1e-9), (planned.report.bound, best)
    assert planned.report.objective >= best * (1 - 1e-9)


def graph_instance(seed: int):
    """Graph mode (compiled batch sizes): one or two buckets of 3-5 requests, bucket sets with and without a
    bucket of 1, a KV capacity now and then, each kind of limit, and a graph cap on a third of them."""
    from dataclasses import replace

    from model.cost.model import cost_model
    from model.domain.schema import Limits
    rng = np.random.default_rng(seed)
    sizes = [int(rng.integers(3, 6))] if seed % 2 == 0 else [int(rng.integers(2, 4)), int(rng.integers(2, 4))]
    buckets = [bucket(rng.integers(1, 700, n).tolist(), rng.integers(1, 400, n).tolist(), name=name)
               for name, n in zip("ab", sizes, strict=False)]
    prof = replace(TOY, batch_buckets=[(1, 2, 4), (2, 3), (1, 4), (3,)][seed % 4],
                   kv_capacity_tokens=2500 if seed % 6 == 0 else None)
    limits = [Limits(), Limits(max_p95_latency_ms=float(rng.integers(900, 2500))), Limits(max_pad_ratio=3.0),
              Limits(max_sequential_ms=float(rng.integers(1500, 5000)))][seed % 4]
    return problem(*buckets, k=int(rng.integers(1, 4)), cost=cost_model("device", prof), limits=limits,
                   max_graphs=[None, 2, 3][seed % 3])


@pytest.mark.parametrize("seed", range(16))
def test_graph_mode_plans_the_brute_force_optimum_with_a_bound_below_it(seed):
    """With compiled batch sizes the flow model holds one size class per bucket, a compile and a spike per graph
    and the graph cap: on every level it is exact, so the plan is optimal and the bound certified."""
    from helpers import check_valid

    from model.base.errors import InfeasibleError
    prob = graph_instance(seed)
    best = brute_force(prob).cost
    if best == float("inf"):
        with pytest.raises(InfeasibleError):
            plan_mip(prob, time_limit=10)
        return
    planned = plan_mip(prob, time_limit=10)
    results = check_valid(prob, planned.batchings)
    assert all(r.ok for r in results)
    assert len(set().union(*(set(r.metrics.graphs) for r in results))) <= (prob.graph_cap or 99)
    assert planned.report.bound <= best * (1 + 1e-9), (planned.report.bound, best)
    assert sum(r.metrics.cost for r in results) == pytest.approx(best, rel=1e-9)
