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
