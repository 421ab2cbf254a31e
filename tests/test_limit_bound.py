"""The LP-price bound with P95 limits priced by a Lagrangian (``model.planning.limit_bound``) against the
brute-force optimum: never above it on seeded device instances of 3-6 requests -- one or two buckets, P95
limits between one member's batch time and a full batch's, with and without a KV capacity, a batch-size cap,
pad and sequential-time limits beside it -- and above the plain LP-price bound where the limit keeps batches
small (the main job's case)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import brute_force, bucket, plan_mip, problem

from model.base.runtime import Deadline
from model.cost.device import DeviceProfile, batch_time
from model.domain.schema import Limits, Problem
from model.planning.limit_bound import p95_bound
from model.planning.window_bound import lp_duals, whole_trace_bound

TOY = DeviceProfile(name="toy", prefill=(2.0, 0.01, 1e-5), decode=(5.0, 1e-4, 0.02),
                    decode_large=(3.0, 1e-4, 0.05), decode_large_from=3, compile_ms=40.0)


def instance(seed: int) -> Problem:
    """One or two buckets (3-6 requests in all), a P95 limit on each between a lone member's batch time and a
    batch of all of them, a KV capacity on a third, a batch-size cap on a fifth, and now and then a pad or a
    sequential-time limit too."""
    from dataclasses import replace

    from model.cost.model import cost_model
    rng = np.random.default_rng(seed)
    sizes = [int(rng.integers(3, 6))] if seed % 2 == 0 else [int(rng.integers(2, 4)), int(rng.integers(1, 4))]
    buckets = [bucket(rng.integers(1, 400, n).tolist(), rng.integers(1, 300, n).tolist(), name=name)
               for name, n in zip("ab", sizes, strict=False)]
    prof = replace(TOY, kv_capacity_tokens=900 if seed % 3 == 0 else None)
    limits = []
    for b in buckets:
        shape = int(-(-int(b.prompt_len.max()) // 64) * 64)
        lo = float(batch_time(1, shape, int(b.gen_len.max()), prof))
        hi = float(batch_time(len(b), shape, int(b.gen_len.max()), prof))
        limit = lo + rng.uniform(0.0, 1.0) * max(hi - lo, 1.0)
        extra = [{}, {"max_pad_ratio": 4.0}, {"max_sequential_ms": 4 * hi}][seed % 3 if seed % 4 == 1 else 0]
        limits.append(Limits(max_p95_latency_ms=limit, **extra))
    prob = problem(*buckets, k=int(rng.integers(1, 4)), cost=cost_model("device", prof),
                   max_batch_size=2 if seed % 5 == 4 else None)
    return replace(prob, limits=tuple(limits))


@pytest.mark.parametrize("seed", range(24))
def test_the_p95_bound_is_below_the_brute_force_optimum(seed):
    prob = instance(seed)
    best = brute_force(prob).cost
    full = p95_bound(prob, Deadline.after(30))
    cut = p95_bound(prob, Deadline(0.0))  # every shape priced by per-request floors, no multiplier tried
    plain = whole_trace_bound(prob, Deadline.after(30))
    assert cut.bound <= best * (1 + 1e-9), (cut, best)
    assert full.bound <= best * (1 + 1e-9), (full, best)
    assert full.bound >= plain * (1 - 2e-9)  # lam = 0 with the LP prices alone is one of the tables tried (less SAFETY)
    searched = p95_bound(prob, Deadline.after(30), sets_s=30.0)  # every bucket's shape sets searched too
    assert full.bound * (1 - 1e-12) <= searched.bound <= best * (1 + 1e-9), (searched, full, best)


def alone_problem(n: int = 6) -> Problem:
    """n equal requests whose P95 limit lets no member share a batch (one decode regime, so a batch's time
    grows with its size): only the plan of every request alone meets it (allowed_above(6) is 0), which the
    plain LP prices as one shared batch."""
    from dataclasses import replace

    from model.cost.model import cost_model
    prof = replace(TOY, decode_large=None, decode_large_from=None, compile_ms=1.0)  # its spike stays within
    one = float(batch_time(1, 64, 100, prof)) + prof.compile_ms
    two = float(batch_time(2, 64, 100, prof))
    prob = problem(bucket([60] * n, [100] * n), k=1, cost=cost_model("device", prof))
    return replace(prob, limits=(Limits(max_p95_latency_ms=0.5 * (one + two)),))


def test_the_multiplier_sees_what_a_p95_limit_forces():
    prob = alone_problem()
    best = brute_force(prob).cost
    assert best < float("inf")
    priced = p95_bound(prob, Deadline.after(30))
    plain = whole_trace_bound(prob, Deadline.after(30))
    assert priced.bound <= best * (1 + 1e-9)
    assert priced.bound > plain + 0.5 * (best - plain), (plain, priced, best)  # most of the gap closes
    assert priced.lams[0] > 0


def test_a_penalty_only_raises_the_prices():
    g = np.array([10, 20, 20, 40, 80, 150])
    plain = lp_duals(g, 128, TOY, None)
    assert lp_duals(g, 128, TOY, None, None) == pytest.approx(plain, rel=1e-12)  # no penalty: the LP's own
    limit = float(batch_time(2, 128, 80, TOY))
    for lam in (1.0, 10.0, 100.0):
        assert lp_duals(g, 128, TOY, None, (limit, lam)).sum() >= plain.sum() * (1 - 1e-12)


def test_plan_mip_reports_the_p95_bound_on_a_limit_that_forces_lone_requests():
    prob = alone_problem()
    best = brute_force(prob).cost
    planned = plan_mip(prob, time_limit=10)
    assert planned.report.objective == pytest.approx(best, rel=1e-9)
    assert whole_trace_bound(prob, Deadline.after(30)) < planned.report.bound <= best * (1 + 1e-9)
