"""Device mode: a cheaper shape set for each bucket, searched by the rider chain's bound, then planned on exactly.

Why.  The planner's shape choice comes from the flow model and the exact-runs start, and the
batches on those shapes are then re-batched exactly; what nothing measured is whether another set
would batch cheaper.  The rider chain (``model.planning.rider_chain``) prices a bucket's batches on
any shape set in about 0.03 s, within 2 % of what the plan achieves there on the embedded default, so
it can rank many sets: on the chat bucket the plan's (320, 1024, 2048) price at 321,948 with their
compiles, (192, 1088, 2048) at 311,982, and planned on the latter the main job costs 455,720 instead
of 465,198.

How.  Per bucket, costliest first, a local search from the plan's own shapes: each shape moved to one
of the ``STEPS`` nearest candidates either side, removed, or a shape added in the middle of a gap,
always covering the bucket's longest prompt and at most K shapes across every bucket; a set is scored
by its chain price (the bound before its certification) plus its compiles, at the P95 multiplier
the chain found for the start set (any multiplier gives a bound; re-tuning it per set would cost 14
evaluations).  The first
cheaper neighbour, nearest first, is taken until none is.  A bucket whose first pricing shows that
its neighbours cannot all be priced in the time left is not searched (a set of the Azure conv trace
takes over a second).  A set found is a guess, not a plan: every request goes alone to its
smallest shape of the set, the exact re-batching (``rebatch``) plans on it and the judge decides; it
comes before the moves up a shape (``move_up``), which take the cheapest candidate (a second or two
each on the main job: one run of them, not two).  A candidate, never a bound.
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from model.base.runtime import Deadline, check_interrupt
from model.cost.common import align, allowed_above
from model.domain.schema import Batching, Problem
from model.domain.shapeset import usable
from model.planning.contract import Judge, Judged
from model.planning.rebatch import rebatch_plan
from model.planning.rider_chain import chain_bound, chain_duals
from model.planning.shape_lp import all_boxes, cells_of

STEPS = 2  # a shape moves to one of this many candidates on either side
MU_STEPS = (1.0, 2.0, 4.0, 8.0)  # the multiplier for a bucket's search: its best step (a ranking needs no more)


def entry_candidates(problem: Problem, b: int) -> np.ndarray:
    """The shapes a set of bucket b may hold: with a fixed set of allowed shapes, those; else its requests' own
    entry shapes (a shape between two of them can be lowered to the one below without raising any cost), within
    the longest allowed."""
    allowed = usable(problem)
    if allowed is not None:
        return allowed
    S = np.unique(align(problem.buckets[b].prompt_len))
    return S[S <= problem.max_seq_len] if problem.max_seq_len is not None else S


def set_value(problem: Problem, b: int, shapes: tuple[int, ...], mu: float,
              deadline: Deadline = Deadline.never()) -> float:
    """Bucket b's chain price of ``shapes`` at multiplier mu, plus the shapes' compiles (a ranking); inf where
    ``deadline`` cut the pricing (a part-priced set would rank too cheap)."""
    bucket = problem.buckets[b]
    S, G = align(bucket.prompt_len), np.asarray(bucket.gen_len, dtype=np.int64)
    limit = problem.limits[b].max_p95_latency_ms
    arr = np.asarray(shapes, dtype=np.int64)
    cells = cells_of(S, G, arr)
    boxes = all_boxes(problem.cost, cells, arr, limit, problem.max_batch_size)
    allowed = allowed_above(len(S)) if limit is not None else None
    mu = mu if limit is not None else 0.0
    pi = chain_duals(cells, boxes, mu, deadline)
    if deadline.expired():
        return np.inf
    # the chain's own sum, not certified: a ranking needs no proof, and the certified bound was equal to 1e-6 on the
    # sets measured while costing a third more
    return float(cells.n @ pi) - mu * (allowed or 0) + float(np.sum(problem.cost.shape_charge(arr)))


def neighbours(shapes: tuple[int, ...], cands: np.ndarray, top: int, room: int) -> list[tuple[int, ...]]:
    """Every set one step from ``shapes`` (see module docstring), nearest first: each shape moved one candidate
    either way, then two, ..., then each removed, then (with ``room`` for more shapes) one added per gap; each
    covers ``top``, and none twice."""
    idx = [int(np.searchsorted(cands, s)) for s in shapes]
    out: list[tuple[int, ...]] = []
    for d in range(1, STEPS + 1):
        for k, i in enumerate(idx):
            rest = shapes[:k] + shapes[k + 1:]
            for j in (i - d, i + d):
                if 0 <= j < len(cands):
                    out.append(tuple(sorted({*rest, int(cands[j])})))
    out += [shapes[:k] + shapes[k + 1:] for k in range(len(shapes))]
    if room > 0:
        out += [tuple(sorted({*shapes, int(cands[(lo + hi) // 2])}))
                for lo, hi in zip([-1, *idx[:-1]], idx, strict=True) if hi - lo > 1]
    seen = {tuple(shapes)}
    return [s for s in out if s and max(s) >= top and not (s in seen or seen.add(s))]


def searched_sets(problem: Problem, judged: Judged, deadline: Deadline) -> tuple[tuple[int, ...], ...] | None:
    """Each bucket's best shape set found from the judged plan's own (see module docstring), the costliest bucket
    first, before ``deadline``; None where no bucket's set changed."""
    sets = [tuple(sorted({int(s) for s in bt.shape_of})) for bt in judged.batchings]
    start = list(sets)
    cost = problem.cost
    order = sorted(range(len(sets)), key=lambda b: -judged.evaluation.results[b].metrics.cost)
    for b in order:
        check_interrupt()
        if deadline.expired():
            break
        bucket = problem.buckets[b]
        limit = problem.limits[b].max_p95_latency_ms
        S, G = align(bucket.prompt_len), np.asarray(bucket.gen_len, dtype=np.int64)
        mu = chain_bound(cost, S, G, sets[b], limit, problem.max_batch_size, deadline, steps=MU_STEPS,
                         bisections=0).mu if limit is not None else 0.0
        cands = entry_candidates(problem, b)
        top = int(S.max())
        seen: dict[tuple[int, ...], float] = {}

        def value(shapes: tuple[int, ...]) -> float:
            if shapes not in seen:
                seen[shapes] = set_value(problem, b, shapes, mu, deadline)
            return seen[shapes]

        t0 = time.perf_counter()
        best = value(sets[b])
        each = time.perf_counter() - t0
        room = problem.max_shapes - len({s for u in sets for s in u})
        if each * len(neighbours(sets[b], cands, top, room)) > deadline.left():
            continue  # not even one round of neighbours fits: the time is the moves' and the judging's
        while not deadline.expired():
            others = {s for k, u in enumerate(sets) if k != b for s in u}
            found = None
            for cand in neighbours(sets[b], cands, top, problem.max_shapes - len(others | set(sets[b]))):
                if deadline.expired():
                    break
                if len(others | set(cand)) > problem.max_shapes:
                    continue
                if value(cand) < best * (1 - 1e-9):
                    best, found = value(cand), cand
                    break  # the first cheaper neighbour, nearest first: fewer sets priced than the best one
            if found is None:
                break
            sets[b] = found
    return tuple(sets) if sets != start else None


def on_sets(problem: Problem, sets: tuple[tuple[int, ...], ...]) -> tuple[Batching, ...]:
    """Every request alone at its smallest shape of its bucket's set (the re-batching's start)."""
    out = []
    for bucket, shapes in zip(problem.buckets, sets, strict=True):
        arr = np.asarray(shapes, dtype=np.int64)
        S = align(bucket.prompt_len)
        out.append(Batching(np.arange(len(S)), arr[np.searchsorted(arr, S)]))
    return tuple(out)


def chain_candidates(problem: Problem, judge: Judge, candidates: list[Judged], deadline: Deadline
                     ) -> list[Judged]:
    """The cheapest acceptable candidate's buckets on the shape sets ``searched_sets`` finds, planned by the exact
    re-batching (device mode with a free batch, no windows): the plan, as one more candidate, if it came out
    cheaper (the moves up a shape, which follow in the planner, then take the cheapest candidate)."""
    cost = problem.cost
    if not (cost.shared_batch_time and cost.batch_buckets is None and problem.windowing is None):
        return []
    ok = [c for c in candidates if c.acceptable]
    if not ok:
        return []
    best = min(ok, key=lambda c: c.cost)
    search = deadline.share(0.5)
    sets = searched_sets(problem, best, search)
    if sets is None or deadline.expired():
        return []
    solo = judge(problem, "chain", on_sets(problem, sets))
    planned, _ = rebatch_plan(problem, judge, solo, deadline)
    if planned is None or not planned.cost < best.cost * (1 - 1e-12):
        return []
    where = "; ".join(",".join(map(str, s)) for s in sets)
    return [replace(planned, method="the shapes the rider chain's bound ranks cheapest near the plan's, planned on by "
                                    "the exact re-batching",
                    notes=(f"shape sets searched by the rider chain's bound from the {best.name} plan's: {where} "
                           f"(per bucket); planned on them: cost {best.cost:.6g} -> {planned.cost:.6g}",))]
