"""When the limits cannot all be met: say which conflict and what each metric can at best reach.

"At best" numbers are bounds no plan of THIS problem can beat -- its batch-size cap,
allowed shapes, shape cap K and cost mode included -- from the one cost model (see
``at_best``).  A limit below its "at best" can never be met.  Otherwise each limit
alone, then pairs of limits, are probed by the planner's own search: a probe whose
search held the whole exact model and found it infeasible is a proof; any other
failure is said to be unproven.  With a single limit, the search that failed is
itself the probe of that limit alone.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from model.base.errors import InfeasibleError
from model.base.runtime import Deadline, DeadlineExceeded
from model.cost.common import align, allowed_above, p95_rank
from model.domain.schema import Bucket, Limits, Problem
from model.domain.shapeset import round_up_to, usable
from model.formulation.boxes import bucket_model, request_floor
from model.histogram.cells import Histogram, build_histogram
from model.planning.contract import Judge
from model.planning.stages import greedy_plan, search, shape_setup
from solvers.backends import get_backend

PROBE_MIN_S = 0.5  # a probe needs at least this much of the time limit left
PROBE_S = 10.0  # and gets at most this much


# ---------------------------------------------------------------- what no plan can beat


def candidate_shapes(problem: Problem, S: np.ndarray) -> np.ndarray:
    """The shapes worth declaring: the aligned prompts, or with a fixed set the smallest allowed shape covering
    each (any declared shape can be lowered to one of these without raising a member's cost or latency)."""
    shapes = np.unique(S)
    allowed = usable(problem)
    if allowed is not None and len(allowed) and shapes.max() <= allowed[-1]:
        shapes = np.unique(round_up_to(shapes, allowed))
    return shapes


def smallest_shape(problem: Problem, S):
    """The smallest shape a prompt aligned to S may declare: S itself, or the smallest allowed shape covering it."""
    allowed = usable(problem)
    if allowed is None or not len(allowed) or np.max(S) > allowed[-1]:
        return S
    return round_up_to(S, allowed)


def interval_sums(hist: Histogram, shapes: np.ndarray, weight: Callable[[int, np.ndarray], np.ndarray],
                  deadline: Deadline) -> np.ndarray:
    """w[lo+1, hi]: the total weight of the cells with S in (shapes[lo], shapes[hi]] riding at shapes[hi]
    (``weight(s, cells)`` gives each cell's count-weighted value at shape s); +inf where lo >= hi."""
    T = len(shapes)
    j_of = np.searchsorted(shapes, hist.S)
    out = np.full((T + 1, T), np.inf)
    for hi in range(T):
        deadline.tick("diagnosis")
        fits = np.flatnonzero(j_of <= hi)
        per = np.bincount(j_of[fits], weights=weight(int(shapes[hi]), fits), minlength=T)[:hi + 1]
        out[:hi + 1, hi] = np.cumsum(per[::-1])[::-1]
    return out


def least_over_shape_sets(sums: np.ndarray, per_shape: np.ndarray, k: int, top: int) -> float:
    """min over sets of at most k shapes, the largest shapes[top], of the interval sums plus per_shape of each
    shape in the set: every cell rides at the smallest shape of the set covering it (shortest path, exact)."""
    f = sums[0] + per_shape
    best = f[top]
    for _ in range(2, min(k, len(per_shape)) + 1):
        f = np.min(f[:, None] + sums[1:, :], axis=0) + per_shape
        best = min(best, f[top])
    return float(best)


def at_best(bucket: Bucket, problem: Problem, deadline: Deadline = Deadline.never()) -> dict[str, float]:
    """A value each limited metric can never beat in this bucket, whatever the plan of this problem.

    Latency: a member is fastest alone at the smallest shape it may declare (its aligned
    prompt, or the smallest allowed shape covering it).  P95: those latencies' P95, and
    when the P95 is the maximum the compile spike counts (it lands on some member).
    Sequential time: with at most B members a batch, the batch maxima are at least every
    B-th of the latencies sorted from the top (B = 1: every request is its own batch), plus
    what a spike adds at least (the whole spike in strict mode and with B = 1; in reference
    mode less only by the widest prefill gap inside one batch); in strict mode also the
    least over shape sets of at most K of sum(latency)/B + one spike per shape (exact for
    B = 1).  Padding: the alignment pad (strict: the least prompt pad over shape sets of
    at most K; device mode too).  Cost: every request alone at its own shape, ceil(n/B)
    batch overheads and the compile of the one shape it needs (strict: the least over shape
    sets of at most K, compile and one batch per shape).  Device mode: a request's cost is
    at least its floor (``boxes.request_floor``: exact alone with B = 1), least over shape
    sets with one compile each, and sequential time at least that (a batch's time counts in
    both, a compile spike as much as a compile).  If ``deadline`` passes, the shape-set
    terms fall back to every request at its own shape (still valid).
    """
    cm = problem.cost
    n = len(bucket)
    S = align(bucket.prompt_len)
    y = S if not cm.pads_to_shape else smallest_shape(problem, S)
    own = cm.fastest_latency(y, bucket.gen_len)
    spike = cm.spike_ms
    k = p95_rank(n)
    p95 = float(np.partition(own, k)[k])
    if allowed_above(n) == 0:  # the P95 is the maximum: the spike counts
        p95 = max(p95, float(own.min()) + spike)
    real = float(bucket.prompt_len.sum() + bucket.gen_len.sum())
    pad = float((y - bucket.prompt_len).sum()) / real
    per_batch = min(problem.max_batch_size or n, n)
    top_down = np.sort(own)[::-1]
    seq = float(top_down[::per_batch].sum())  # the j-th largest batch maximum is at least the (jB)-th latency
    batches = -(-n // per_batch)
    if not cm.pads_to_shape:
        need = int(smallest_shape(problem, S.max()))
        cost = float(cm.member_cost(S, bucket.gen_len).sum() + cm.batch_floor * batches + cm.shape_charge(need))
        gap = float(cm.prefill_latency(S.max()) - cm.prefill_latency(S.min()))
        grows = spike if per_batch == 1 else max(0.0, spike - gap)
        return {"cost": cost, "pad_ratio": pad, "p95_latency_ms": p95,
                "sequential_ms": max(seq + grows, float(own.min()) + spike)}
    # strict and device mode: every request at its own shape, then (when the time allows) the least over
    # shape sets of at most K; a spike raises its batch's time by all of it (a batch's members share one)
    hist = build_histogram(bucket)
    shapes = candidate_shapes(problem, S)
    top = int(np.searchsorted(shapes, hist.S.max()))
    K = problem.max_shapes
    if cm.shared_batch_time:
        bm = bucket_model(hist, hist.G, Limits(), cm, max_batch=problem.max_batch_size)
        cost = float((hist.count * request_floor(bm, smallest_shape(problem, hist.S), hist.G)).sum()) + spike
        seq = max(cost, float(own.max()) + spike, seq + spike)
    else:
        cost = float(cm.member_cost(y, bucket.gen_len).sum() + cm.batch_floor * batches
                     + cm.shape_charge(int(y.max())))
        seq = seq + spike
    try:
        if cm.shared_batch_time:  # a batch's time is its cost and its sequential time; a shape's compile both
            floor = interval_sums(hist, shapes, lambda s, c: hist.count[c] * request_floor(bm, np.int64(s),
                                                                                            hist.G[c]), deadline)
            least = least_over_shape_sets(floor, np.full(len(shapes), spike), K, top)
            cost, seq = max(cost, least), max(seq, least)
        else:
            charge = cm.shape_charge(shapes)
            run = interval_sums(hist, shapes, lambda s, c: hist.count[c] * cm.member_cost(s, hist.G[c]), deadline)
            cost = max(cost, least_over_shape_sets(run, charge + cm.batch_floor, K, top),
                       least_over_shape_sets(run, charge, K, top) + cm.batch_floor * batches)
            lat = interval_sums(hist, shapes, lambda s, c: hist.count[c] * cm.member_latency(s, s, hist.G[c]),
                                deadline)
            seq = max(seq, least_over_shape_sets(lat / per_batch, np.full(len(shapes), spike), K, top))
        prompt = interval_sums(hist, shapes, lambda s, c: hist.count[c] * s - hist.prompt_sum[c], deadline)
        pad = max(pad, least_over_shape_sets(prompt, np.zeros(len(shapes)), K, top) / real)
    except DeadlineExceeded:
        pass
    return {"cost": cost, "pad_ratio": pad, "p95_latency_ms": p95, "sequential_ms": seq}


def unmeetable(problem: Problem, deadline: Deadline = Deadline.never()) -> list[str]:
    """The limits no plan can meet (each below its ``at_best``): a proof, one line per limit."""
    found = []
    for bucket, limits in zip(problem.buckets, problem.limits, strict=True):
        if not limits.items():
            continue
        best = at_best(bucket, problem, deadline)
        for metric, limit in limits.items():
            if limit < best[metric]:
                found.append(f"{bucket.name}: {metric} <= {limit:.6g} can never be met: no plan goes below "
                             f"{best[metric]:.6g}")
    return found


# ---------------------------------------------------------------- probes by the planner's own search


@dataclass(frozen=True)
class Probe:
    """What the search found for some limits of one bucket: a plan meeting them (``met``), a proof that none
    does (``proven``), or neither; ``values`` are the plan's metrics when it found one."""

    met: bool
    proven: bool
    values: dict[str, float] | None = None


def probe(problem: Problem, b: int, limits: Limits, deadline: Deadline, judge: Judge) -> Probe | None:
    """Search bucket b alone under ``limits`` (the other buckets and limits dropped: a relaxation, so a proof
    holds for the problem); None when the time left is too short."""
    if deadline.left() < PROBE_MIN_S:
        return None
    bucket = problem.buckets[b]
    single = replace(problem, buckets=(bucket,), limits=(limits,))
    fine = [build_histogram(bucket)]
    until = deadline.within(PROBE_S)
    try:
        outcome = search(single, fine, shape_setup(single, fine, deadline=until),
                         greedy_plan(single, deadline=until), get_backend("highs"), until)
    except (DeadlineExceeded, InfeasibleError):
        return None
    if outcome.batchings is None:
        return Probe(False, outcome.proven_infeasible)
    result = judge(single, "probe", outcome.batchings).evaluation.results[0]
    values = {m: result.metrics.value(m) for m in ("cost", "pad_ratio", "p95_latency_ms", "sequential_ms")}
    return Probe(all(c.ok for c in result.checks), False, values)


def best_without(problem: Problem, b: int, metric: str, deadline: Deadline, judge: Judge) -> float | None:
    """The value of ``metric`` in the plan the search finds for bucket b with no limits (None if none in time)."""
    found = probe(problem, b, Limits(), deadline, judge)
    return None if found is None or found.values is None else found.values[metric]


def single_limit(problem: Problem) -> tuple[int, str, float] | None:
    """(bucket, metric, limit) when exactly one limit is set in the whole problem, else None."""
    found = [(b, m, v) for b, lim in enumerate(problem.limits) for m, v in lim.items()]
    return found[0] if len(found) == 1 else None


def alone_message(problem: Problem, proof: str | None, known: dict[str, float], deadline: Deadline,
                  judge: Judge) -> str:
    """A single limit no plan found meets: it alone is unmeetable -- proven by ``proof`` (or not proven) --
    with the best value known (the plans tried, ``known`` by source, and a search without the limit) and the
    bound no plan beats."""
    b, metric, limit = single_limit(problem)
    bucket = problem.buckets[b]
    free = best_without(problem, b, metric, deadline, judge)
    if free is not None:
        known = {**known, "the search without this limit": free}
    floor = at_best(bucket, problem, deadline)[metric]
    if proof:
        head = f"{bucket.name}: {metric} <= {limit:.6g} cannot be met, even alone ({proof})"
    else:
        head = (f"{bucket.name}: {metric} <= {limit:.6g}, the only limit, is met by no plan found "
                "(not proven unmeetable)")
    if known:
        source, value = min(known.items(), key=lambda kv: kv[1])
        head += f"; the best value known is {value:.6g} ({source})"
    return head + f"; no plan goes below {floor:.6g}"


def within_caps(problem: Problem) -> str:
    """What the limits are met within beyond the shape cap: the graph cap across all buckets, if any (the
    probes plan one bucket, so a conflict through the shared graphs shows only in the whole problem)."""
    cap = problem.graph_cap
    return "" if cap is None else f" within {cap} graph{'s' if cap != 1 else ''} across all buckets"


def explain_infeasible(problem: Problem, judge: Judge, deadline: Deadline = Deadline.never(), proof: str = ""
                       ) -> str:
    """One line per finding: limits that can never be met, else limits unmeetable alone, else pairs that conflict.

    ``proof`` names what proved the problem infeasible.  Each limit alone and then each
    pair is probed by the planner's search within ``deadline``; a finding from a search
    over the whole exact model is proven, others are marked not proven.
    """
    found = unmeetable(problem, deadline)
    if found:
        return "the limits cannot all be met; " + "; ".join(found)
    lead = "the limits cannot all be met" + within_caps(problem) + (f" ({proof})" if proof else "")
    if single_limit(problem) is not None:
        return lead + "; " + alone_message(problem, proof or None, {}, deadline, judge)
    alone, pairs, unknown = [], [], []
    for b, (bucket, limits) in enumerate(zip(problem.buckets, problem.limits, strict=True)):
        reachable = []
        for metric, value in limits.items():
            got = probe(problem, b, Limits.of_metrics({metric: value}), deadline, judge)
            if got is None or not (got.met or got.proven):
                unknown.append(f"{bucket.name}: {metric} <= {value:.6g}")
            elif got.proven:
                alone.append(f"{bucket.name}: {metric} <= {value:.6g} cannot be met even alone (proven)")
            else:
                reachable.append((metric, value))
        for (m1, v1), (m2, v2) in itertools.combinations(reachable, 2):
            got = probe(problem, b, Limits.of_metrics({m1: v1, m2: v2}), deadline, judge)
            if got is not None and not got.met:
                pairs.append(f"{bucket.name}: {m1} <= {v1:.6g} with {m2} <= {v2:.6g}"
                             + (" (proven)" if got.proven else " (no plan found, not proven)"))
    bests = "; ".join(f"{b.name}: " + ", ".join(f"{m} at best {v:.6g}" for m, v in at_best(b, problem, deadline).items()
                                                  if lim.get(m) is not None)
                      for b, lim in zip(problem.buckets, problem.limits, strict=True) if lim.items())
    if alone:
        return f"{lead}; {'; '.join(alone)} (no plan goes below: {bests})"
    if pairs:
        return f"{lead}; these conflict: {'; '.join(pairs)} (no plan goes below: {bests})"
    if unknown:
        return (f"{lead}: no plan meets every limit; the probes could not settle "
                f"{', '.join(unknown)} in the time left (no plan goes below: {bests})")
    return (f"{lead}: no plan meets every limit (each limit alone is met by some plan, and no pair of them "
            f"conflicts, so the conflict needs three or more; no plan goes below: {bests})")
