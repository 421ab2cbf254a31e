"""Device mode: a judged plan's requests kept on their shapes and re-batched exactly, the limits priced by weights.

Once the shapes are settled -- by the MIP, a packer, the windowed planner -- the batches
are a separate question: at one declared shape a batch's time depends only on its size
and its longest gen, so each (bucket, window, shape) group's members, sorted by gen, are
best cut into consecutive runs (``model.planning.run_cuts.optimal_runs``, the exact DP,
under the KV capacity, the batch-size cap and, with compiled batch sizes, only the graphs
the plan already compiles at that shape, so no compile and no graph is added).

The limits bind a whole bucket, not a batch, so they are priced, not imposed per batch:

- the P95 limit counts members over it: first every batch is kept within it (its time
  plus the group's longest wait), which meets it wherever the plan can; then the limit is
  made soft, a batch over it charged ``over_weight`` ms per member, and the least weight
  that the judge accepts is searched for (a Lagrangian multiplier of the counting row);
  a weight reaches only the convex hull of the cost-versus-count curve, so the count is
  then also kept exactly, as a state of the DP (``model.planning.count_runs``, compile
  spikes included), from the allowance down until the judge accepts;
- the pad limit is a sum of tokens: a batch is charged ``pad_weight`` ms per KV token it
  holds, the least weight accepted searched the same way.

Every trial is judged exactly on the bucket alone (its limits, spikes placed by the
expansion), so what is kept meets every limit; the whole plan is judged once more at the
end.  The result is a candidate plan, never a bound; it is kept only when cheaper.
"""

from __future__ import annotations

import logging
from dataclasses import replace

import numpy as np

from model.base.runtime import Deadline, DeadlineExceeded, check_interrupt
from model.cost.common import allowed_above
from model.domain.schema import Batching, Problem
from model.planning.contract import Judge, Judged
from model.planning.count_runs import counted_runs, dp_seconds, unit_for, work
from model.planning.groups import Group, batching_of, groups_of
from model.planning.run_cuts import optimal_runs

log = logging.getLogger("shapeplan")

RUNS_S_PER_MEMBER = 1e-5  # the runs DP's time per member (about a second on 10^5 long-context requests)
DOUBLINGS = 14  # weights tried from a tiny one up, doubling, before a bisection between the last two
BISECTIONS = 3
COUNT_RETRIES = (0, 1, 2, 4, 8, 16)  # counts below the allowance tried when the judge finds more members over
COUNT_SHARE = 0.8  # of the time left, what one counted DP may take (its count unit is chosen to fit): most of
# it, as candidates come cheapest first and an exact count needs no weights after it; with several buckets the
# first may leave the later ones little (they keep their own batches then)


def cut(problem: Problem, groups: list[Group], n: int, pad_weight: float, over_weight: float | None,
        deadline: Deadline) -> Batching | None:
    """Every group cut into optimal runs under the weights (``optimal_runs``): the bucket's batching, or None
    when a group cannot be cut (its classes).  Raises DeadlineExceeded when a group's DP, which cannot stop
    part-way, would not fit the time left."""
    runs = []
    for g in groups:
        check_interrupt()
        if deadline.left() < RUNS_S_PER_MEMBER * len(g.rows):
            raise DeadlineExceeded("re-batching")
        try:
            _, batch = optimal_runs(g.gens, g.shape, problem.cost, problem.max_batch_size, g.limit,
                                    None if g.classes is None else set(g.classes), pad_weight, over_weight)
        except ValueError:
            return None
        runs.append(batch)
    return batching_of(groups, runs, n)


def alone(problem: Problem, b: int) -> Problem:
    """Bucket b as a problem of its own (its limits with it): what a trial of its batching is judged on."""
    return replace(problem, buckets=(problem.buckets[b],), limits=(problem.limits[b],))


def counted(problem: Problem, b: int, groups: list[Group], pad_weight: float, judge: Judge, name: str,
            deadline: Deadline) -> tuple[Batching, float, bool] | None:
    """Bucket b's groups cut with its P95 count exact (``count_runs.counted_runs``), judged on the bucket alone:
    (batching, cost, whether the count was exact: in members, the whole allowance) of the first count the judge
    accepts, from ``allowed_above(n)`` down (a count the DP cannot see -- a spike per graph, a member's own wait
    -- costs a retry), or None.  The count is kept in the least unit whose DP fits a share of the time left
    (``count_runs.unit_for``; one member where it can).  Without a P95 limit the groups are cut once, with no
    count."""
    n = len(problem.buckets[b])
    sub = alone(problem, b)
    limited = problem.limits[b].max_p95_latency_ms is not None
    allowed = allowed_above(n) if limited else 0  # without a limit nobody is over: one DP, no count
    works = [work(problem, g) for g in groups]
    unit = unit_for(works, allowed, COUNT_SHARE * deadline.left())
    for back in COUNT_RETRIES if limited else (0,):
        most = allowed // unit - back
        if most < 0 or deadline.left() < dp_seconds(works, most):
            return None
        check_interrupt()
        found = counted_runs(problem, groups, most, pad_weight, unit=unit)
        if found is None:
            return None
        bt = batching_of(groups, found[1], n)
        judged = judge(sub, name, (bt,))
        log.info("counted re-batching of %s (bucket %d): %d over allowed in units of %d: %s", name, b,
                 most * unit, unit, f"{judged.cost:.6e}" if judged.acceptable else "not accepted")
        if judged.acceptable:
            return bt, judged.cost, unit == 1 and back == 0
    return None


def least_weight(trial, scale: float, deadline: Deadline) -> float | None:
    """The least weight (from ``scale`` / 2^8 up, doubling, then bisected) at which ``trial(weight)`` holds;
    None when none does within ``DOUBLINGS`` or the deadline.  ``trial`` judges, so this is a search, not a
    proof; a weight that holds is a plan that meets the limits."""
    bad, good = 0.0, None
    w = scale / 256.0
    for _ in range(DOUBLINGS):
        if deadline.expired():
            return None
        if trial(w):
            good = w
            break
        bad, w = w, 2 * w
    if good is None:
        return None
    for _ in range(BISECTIONS):
        if deadline.expired():
            break
        mid = 0.5 * (bad + good)
        if trial(mid):
            good = mid
        else:
            bad = mid
    return good


def rebatch_bucket(problem: Problem, b: int, judged: Judged, judge: Judge, deadline: Deadline
                   ) -> tuple[Batching, float, bool]:
    """Bucket b's cheapest re-batching found that meets its limits, its cost (the plan's own batching and cost
    when none is cheaper; see the module docstring for the search) and whether the search was complete: no
    cut refused for time and, with a P95 limit, the count kept exactly (in single members, the whole
    allowance) -- what more time could not improve."""
    batching = judged.batchings[b]
    metrics = judged.evaluation.results[b].metrics
    own = (batching, float(metrics.cost) if metrics is not None else np.inf)
    sub = alone(problem, b)
    n = len(problem.buckets[b])
    groups = groups_of(problem, b, batching)
    best = [own]
    short = [False]  # some cut was refused for time

    def trial(pad_weight: float, over_weight: float | None) -> bool:
        """Cut and judge; keep the cut when cheaper and acceptable; True when acceptable."""
        try:
            bt = cut(problem, groups, n, pad_weight, over_weight, deadline)
        except DeadlineExceeded:
            short[0] = True
            return False
        if bt is None:
            return False
        found = judge(sub, judged.name, (bt,))
        if found.acceptable and found.cost < best[0][1]:
            best[0] = (bt, found.cost)
        return found.acceptable

    lim = problem.limits[b]
    pad_weight = 0.0
    if not trial(0.0, None) and lim.max_pad_ratio is not None:
        tokens = max(1.0, float(metrics.pad_tokens + metrics.real_tokens)) if metrics is not None else 1.0
        found = least_weight(lambda w: trial(w, None), own[1] / tokens, deadline)
        pad_weight = found if found is not None else 0.0
    exact = None
    if lim.max_p95_latency_ms is not None:
        # the count kept exactly first (what a weight cannot reach), then the weights while time is left
        exact = counted(problem, b, groups, pad_weight, judge, judged.name, deadline)
        if exact is not None and exact[1] < best[0][1]:
            best[0] = exact[:2]
        if exact is None or not exact[2] or pad_weight:  # exact, unweighted: the weights search no more
            least_weight(lambda w: trial(pad_weight, w), own[1] / max(1, n), deadline)
    # a weight search the deadline stopped counts as cut short too (conservative: the end only tries again)
    complete = not short[0] and not deadline.expired() and (lim.max_p95_latency_ms is None
                                                            or (exact is not None and exact[2]))
    return (*best[0], complete)


def rebatched(problem: Problem, judge: Judge, judged: Judged, deadline: Deadline) -> Judged | None:
    """``rebatch_plan``'s plan alone."""
    return rebatch_plan(problem, judge, judged, deadline)[0]


def rebatch_plan(problem: Problem, judge: Judge, judged: Judged, deadline: Deadline) -> tuple[Judged | None, bool]:
    """The judged plan with every bucket re-batched (``rebatch_bucket``), judged whole -- None unless it is
    cheaper and meets every limit (or in a mode where a batch's size does not set its time) -- and whether every
    bucket's search was complete (more time could not find more); a complete plan is marked ``rebatched``."""
    if not problem.cost.shared_batch_time or not judged.acceptable:
        return None, False
    out, complete = [], True
    for b in range(len(problem.buckets)):
        bt, _, done = rebatch_bucket(problem, b, judged, judge, deadline)
        out.append(bt)
        complete &= done
    if all(new is old for new, old in zip(out, judged.batchings, strict=True)):
        return None, complete
    found = judge(problem, judged.name, tuple(out))
    if not found.acceptable or found.cost >= judged.cost * (1 - 1e-12):
        return None, complete
    log.info("re-batching the %s plan's shapes exactly: %.6e -> %.6e", judged.name, judged.cost, found.cost)
    return replace(found, rebatched=complete,
                   notes=(f"the {judged.name} plan's requests kept on their shapes and re-batched by the "
                          f"exact runs DP under the limits: cost {judged.cost:.6g} -> {found.cost:.6g}",),
                   method=f"the {judged.name} plan re-batched exactly on its own shapes (the exact-runs DP under "
                          "the limits)"), complete


def canonical(batching: Batching) -> bytes:
    """A batching's content whatever its batch numbers: batches renumbered by their first member, with their
    shapes (the MIP's plan and the start it returned differ in numbers only)."""
    batch_of = np.asarray(batching.batch_of, dtype=np.int64)
    used, first = np.unique(batch_of, return_index=True)
    rank = np.empty(len(used), dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(len(used))
    renumbered = rank[np.searchsorted(used, batch_of)]
    shapes = np.asarray(batching.shape_of, dtype=np.int64)[used[np.argsort(first, kind="stable")]]
    return renumbered.tobytes() + b"|" + shapes.tobytes()


def plan_key(judged: Judged) -> int:
    """A judged plan's content whatever its names and batch numbers (``canonical`` of every bucket)."""
    return hash(tuple(canonical(bt) for bt in judged.batchings))


def rebatched_candidates(problem: Problem, judge: Judge, candidates: list[Judged], deadline: Deadline,
                         most: int = 5) -> list[Judged]:
    """The ``most`` cheapest acceptable candidates re-batched (``rebatched``), cheapest first while the deadline
    allows: the ones that came out cheaper, as more candidates (device mode; none elsewhere).  Not only the
    cheapest: on 12k long-context requests dpfill's plan, dearer than the MIP's, re-batched cheaper than it.
    A candidate marked ``rebatched`` (the start's cheapest fallback, whose re-batching was complete) is skipped,
    and so is the same plan under another name (the MIP returning that start)."""
    done = [c for c in candidates if c.rebatched]
    fresh = [c for c in candidates if not c.rebatched]
    return improved_candidates(problem, judge, fresh, deadline, most, rebatched, skip=done)


def improved_candidates(problem: Problem, judge: Judge, candidates: list[Judged], deadline: Deadline, most: int,
                        improve, skip: list[Judged] = ()) -> list[Judged]:
    """``improve(problem, judge, candidate, deadline)`` (a cheaper judged plan, or None) on the ``most``
    cheapest acceptable candidates, cheapest first while the deadline allows, each plan once and none that
    ``skip`` holds: what came out, as more candidates (device mode; none elsewhere)."""
    if not problem.cost.shared_batch_time:
        return []
    out = []
    seen = {plan_key(c) for c in skip}
    for cand in sorted((c for c in candidates if c.acceptable), key=lambda c: c.cost)[:most]:
        if deadline.expired():
            break
        key = plan_key(cand)
        if key in seen:  # the same plan under two names (the MIP returning its start): once is enough
            continue
        seen.add(key)
        found = improve(problem, judge, cand, deadline)
        if found is not None:
            out.append(found)
    return out
