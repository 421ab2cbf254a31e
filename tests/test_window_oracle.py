"""The windowed planner against the brute-force optimum (``helpers.windowed_brute_force``): every partition whose
batches stay within one arrival window x every shape per batch x every spike placement, with each member's
wait to its window's end in its latency.

Seeded instances: 3-7 requests in one or two buckets, over two to four aligned prompt lengths (so the brute force
stays small), random arrival times over a random span, a random window length, K 1-3, sometimes a batch-size cap,
in every cost mode.  Half of them get limits set just above the metrics of a window-respecting plan drawn at
random (so a plan meeting them provably exists), on a random subset of cost, pad ratio, P95 and sequential time.
Every instance: the planner returns a plan (never "no plan" when the brute force has one), valid and within every
limit, its certified bound is at most the optimum, and from 3 to 5 requests its cost is the optimum.  A few seeds
per mode run by default, many more with ``-m slow``.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from helpers import Layout, bucket, check_valid, layout_metrics, mode_cost, plan_windowed, problem, windowed_brute_force

from model.base.errors import InfeasibleError, NoPlanFound
from model.base.runtime import Deadline
from model.cost.common import align
from model.cost.device import DeviceProfile
from model.domain.schema import Limits, Problem
from model.domain.windowing import waits_of, windowed, windows_of
from model.planning.window_bound import window_bound
from model.planning.window_runs import window_pools

TOY = DeviceProfile(name="toy", prefill=(2.0, 0.01, 1e-5), decode=(5.0, 1e-4, 0.02),
                    decode_large=(3.0, 1e-4, 0.05), decode_large_from=3, compile_ms=40.0, kv_capacity_tokens=4000)
MODES = ("reference", "strict", "device")
LIMITS = ("max_cost", "max_pad_ratio", "max_p95_latency_ms", "max_sequential_ms")
METRIC = {"max_cost": "cost", "max_pad_ratio": "pad_ratio", "max_p95_latency_ms": "p95_latency_ms",
          "max_sequential_ms": "sequential_ms"}


def random_shapes(rng: np.random.Generator, prob: Problem) -> list[int]:
    """A random shape set within K: the longest aligned prompt of all the buckets and up to K - 1 others."""
    values = sorted({int(s) for b in prob.buckets for s in align(b.prompt_len)})
    others = values[:-1]
    extra = rng.choice(others, size=min(len(others), int(rng.integers(0, prob.max_shapes))), replace=False) \
        if others else []
    return sorted({values[-1], *(int(v) for v in extra)})


def random_layout(rng: np.random.Generator, prob: Problem, i: int, ys: list[int]) -> Layout:
    """A plan of bucket i within its windows and the batch-size cap on the shapes ``ys``: each window's requests
    shuffled and cut into batches of random size, each batch at a random shape of ``ys`` covering it where its KV
    cache fits (a batch that fits nowhere is split into single requests, which fit their own shape)."""
    b = prob.buckets[i]
    S, G, wins = align(b.prompt_len), b.gen_len, windows_of(prob, b)
    cap = prob.max_batch_size or len(b)
    blocks, shapes = [], []
    for w in np.unique(wins).tolist():
        rows = rng.permutation(np.flatnonzero(wins == w)).tolist()
        while rows:
            size = int(rng.integers(1, min(cap, len(rows)) + 1))
            blk, rows = rows[:size], rows[size:]
            for part in ([blk] if any(prob.cost.batch_fits(len(blk), y, G[blk].max()) for y in ys
                                      if y >= S[blk].max()) else [[r] for r in blk]):
                fits = [y for y in ys if y >= S[part].max() and prob.cost.batch_fits(len(part), y, G[part].max())]
                blocks.append(tuple(part))
                shapes.append(int(rng.choice(fits)))
    return Layout(tuple(blocks), tuple(shapes))


def instance(seed: int, mode: str) -> Problem:
    """One seeded instance (see the module docstring); its limits, if any, are met by a plan drawn at random."""
    rng = np.random.default_rng([seed, MODES.index(mode)])
    n = int(rng.integers(3, 8))
    n_buckets = int(rng.integers(1, 3)) if n >= 4 else 1
    sizes = [n] if n_buckets == 1 else [n // 2, n - n // 2]
    bases = rng.choice(np.arange(1, 12) * 64, size=int(rng.integers(2, 5)), replace=False)
    span = float(rng.choice([1.0, 3.0, 10.0]))
    buckets = []
    for name, m in zip("ab", sizes, strict=False):
        prompts = [int(rng.choice(bases) - rng.integers(0, 64)) for _ in range(m)]
        b = bucket(prompts, rng.integers(1, 200, m).tolist(), name)
        buckets.append(replace(b, arrival_s=np.round(rng.uniform(0, span, m), 3)))
    cap = int(rng.integers(1, 4)) if rng.random() < 0.2 else None
    base = problem(*buckets, k=int(rng.integers(1, 4)), cost=mode_cost(mode, TOY), max_batch_size=cap)
    prob = windowed(base, float(rng.choice([0.5, 1.0, 2.0, 5.0])) * span / 3)
    if rng.random() < 0.5:
        return prob
    limits, ys = [], random_shapes(rng, prob)
    for i, b in enumerate(prob.buckets):
        m = layout_metrics(b, random_layout(rng, prob, i, ys), prob, waits=waits_of(prob, b))
        picked = [f for f in LIMITS if rng.random() < 0.5] or [LIMITS[int(rng.integers(0, 4))]]
        limits.append(Limits(**{f: float(m.value(METRIC[f])) * (1 + 1e-6) + 1e-9 for f in picked}))
    return replace(prob, limits=tuple(limits))


def check_against_oracle(prob: Problem) -> tuple[float, float]:
    """(planner cost, optimum): the planner's plan is valid, within every limit and never below the optimum,
    its bound and the window bound are at most the optimum; no plan only when the brute force has none."""
    best = windowed_brute_force(prob).cost
    wb = window_bound(prob, window_pools(prob), Deadline.never(), use_lp=prob.cost.shared_batch_time)
    assert wb.bound <= best * (1 + 1e-9), (wb.bound, best)
    raised = window_bound(prob, window_pools(prob), Deadline.never(), use_lp=prob.cost.shared_batch_time,
                          raise_until=Deadline.never())  # with the riders' entries (device mode)
    assert wb.bound * (1 - 1e-9) <= raised.bound <= best * (1 + 1e-9), (raised.bound, wb.bound, best)
    try:
        planned = plan_windowed(prob, time_limit=20)
    except (NoPlanFound, InfeasibleError) as exc:
        assert not np.isfinite(best), f"no plan ({exc}), but the brute force has one of cost {best}"
        return np.inf, best
    results = check_valid(prob, planned.batchings)
    assert all(r.ok for r in results), [r.checks for r in results]
    cost = sum(r.metrics.cost for r in results)
    assert np.isfinite(best) and cost >= best * (1 - 1e-9), (cost, best)
    assert planned.report.bound is not None and planned.report.bound <= best * (1 + 1e-9), \
        (planned.report.bound, best)
    return cost, best


DEFAULT_SEEDS = 3  # per mode in the default run; ``-m slow`` adds the rest
SEEDS = 60


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("seed", [s if s < DEFAULT_SEEDS else pytest.param(s, marks=pytest.mark.slow)
                                  for s in range(SEEDS)])
def test_the_windowed_plan_against_the_brute_force_optimum(mode, seed):
    prob = instance(seed, mode)
    cost, best = check_against_oracle(prob)
    if sum(len(b) for b in prob.buckets) <= 5 and np.isfinite(best):
        assert cost == pytest.approx(best, rel=1e-9), (cost, best)
