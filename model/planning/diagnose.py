"""When the limits cannot all be met: say which conflict and what each metric can at best reach.

"At best" numbers are bounds no plan can beat, from the one cost model (see
``at_best``).  A limit below its "at best" can never be met; otherwise pairs of
limits are probed by the planner's own search to name the ones that conflict.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np

from model.cost.analytic import compile_cost, decode_cost, prefill_cost
from model.cost.common import align, allowed_above, p95_rank
from model.cost.metrics import fastest_latency, spike_ms
from model.formulation.boxes import bucket_model, request_floor
from model.histogram.cells import build_histogram
from model.planning.stages import greedy_plan, search, shape_setup
from model.runtime import Deadline, DeadlineExceeded
from model.schema import Bucket, Limits, Problem, Status
from solvers.backends import get_backend

PROBE_MIN_S = 0.5  # a pair probe needs at least this much of the time limit left


def at_best(bucket: Bucket, problem: Problem) -> dict[str, float]:
    """A value each limited metric can never beat in this bucket, whatever the plan.

    Every member's latency is at least its latency alone in its own tightest box, so
    sequential time is at least the largest such latency and the P95 at least their
    P95 -- and some member carries a compile spike, which counts where it must;
    padding is at least the alignment pad (in strict mode too: each at its own shape);
    cost at least every request alone at its own box with one batch and one shape.
    Device mode: a member's latency is its batch's time, least when it runs alone; a
    request's cost is at least its floor (``boxes.request_floor``: its own per-member
    time plus a full batch's share of the fixed time) and sequential time is the cost.
    """
    p = problem.params
    S = align(bucket.prompt_len)
    own = fastest_latency(S, bucket.gen_len, p, problem.mode)
    k = p95_rank(len(bucket))
    spiked = float(own.min()) + spike_ms(p)  # some member carries a compile spike in every plan
    p95 = float(np.partition(own, k)[k])
    if allowed_above(len(bucket)) == 0:  # the P95 is the maximum: the spike counts
        p95 = max(p95, spiked)
    pad = float((S - bucket.prompt_len).sum()) / float(bucket.prompt_len.sum() + bucket.gen_len.sum())
    if problem.mode == "device":
        hist = build_histogram(bucket)
        bm = bucket_model(hist, hist.G, Limits(), p, "device", max_batch=problem.max_batch_size)
        floor = float((hist.count * request_floor(bm, hist.S, hist.G)).sum()) + p.compile_ms
        return {"cost": floor, "pad_ratio": pad, "p95_latency_ms": p95,
                "sequential_ms": max(floor, float(own.max()) + p.compile_ms)}
    floor = float((prefill_cost(S, p) + decode_cost(S, bucket.gen_len, p)).sum()
                  + p.Kbatch_overhead_cost + compile_cost(S.max(), p))
    return {"cost": floor, "pad_ratio": pad, "p95_latency_ms": p95, "sequential_ms": max(float(own.max()), spiked)}


def unmeetable(problem: Problem) -> list[str]:
    """The limits no plan can meet (each below its ``at_best``): a proof, one line per limit."""
    found = []
    for bucket, limits in zip(problem.buckets, problem.limits, strict=True):
        best = at_best(bucket, problem)
        for metric, limit in limits.items():
            if limit < best[metric]:
                found.append(f"{bucket.name}: {metric} <= {limit:.6g} can never be met: no plan goes below "
                             f"{best[metric]:.6g}")
    return found


def explain_infeasible(problem: Problem, deadline: Deadline = Deadline.never(), proof: str = "") -> str:
    """One line per finding: limits that can never be met, else pairs that conflict.

    ``proof`` names what proved the problem infeasible when no single limit explains
    it (the pair probes then say which limits conflict, within ``deadline``).
    """
    found = unmeetable(problem)
    if found:
        return "the limits cannot all be met; " + "; ".join(found)
    pairs = conflicting_pairs(problem, deadline)
    bests = "; ".join(f"{b.name}: " + ", ".join(f"{m} at best {v:.6g}" for m, v in at_best(b, problem).items()
                                                  if lim.get(m) is not None)
                      for b, lim in zip(problem.buckets, problem.limits, strict=True) if lim.items())
    lead = f"the limits cannot all be met ({proof})" if proof else "the limits cannot all be met"
    if pairs:
        return f"{lead}; these conflict: {'; '.join(pairs)} (each alone: {bests})"
    return (f"{lead}: no plan meets every limit (each limit alone is reachable: {bests}; "
            "no pair of them conflicts within the probe's time, so the conflict needs three or more)")


def conflicting_pairs(problem: Problem, deadline: Deadline) -> list[str]:
    """Pairs of one bucket's limits for which the planner's search finds no plan."""
    solver = get_backend("highs")
    out = []
    for b, (bucket, limits) in enumerate(zip(problem.buckets, problem.limits, strict=True)):
        for (m1, v1), (m2, v2) in itertools.combinations(limits.items(), 2):
            if deadline.left() < PROBE_MIN_S:
                return out
            single = replace(problem, buckets=(bucket,), limits=(Limits.of_metrics({m1: v1, m2: v2}),))
            fine = [build_histogram(bucket)]
            until = deadline.within(10.0)
            try:
                outcome = search(single, fine, shape_setup(single, fine, deadline=until),
                                 greedy_plan(single, deadline=until), solver, until)
            except DeadlineExceeded:
                return out
            if outcome.batchings is None and outcome.status is Status.INFEASIBLE:
                out.append(f"{bucket.name}: {m1} <= {v1:.6g} with {m2} <= {v2:.6g}")
    return out
