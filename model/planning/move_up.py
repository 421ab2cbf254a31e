"""Device mode: a judged plan's longest-gen members moved up a shape, each bucket re-batched with its P95 count exact.

Re-batching on fixed shapes (``model.planning.rebatch``) keeps every member on the shape it
was declared at.  But a long-gen member sets its batch's longest gen, and so every decode
step that batch pays; at the next larger shape of its window the batches of long gens are
already long (or over the P95 limit anyway), and the member adds only its per-member time
there.  The set-partitioning LP on the main job's own shapes (``model.planning.shape_lp``)
does exactly that: its optimum moves the 7 longest-gen members of the short bucket from 320
to 704, into the one batch that is over the limit.

The family searched: in each window, for each pair of consecutive groups (members sharing a
window and a shape), the k longest-gen members of the lower group join the upper one.  Each
trial is priced by ``count_runs.counted_runs`` -- the bucket's best batching with its P95
count exact, compile spikes included -- where the lower group's DP is its own prefix (the DP
runs over the gen-sorted prefixes), so a trial costs the upper group's DP and the fold.  k
runs over a doubling ladder (1, 2, 4, ... the lower group's size: moving all of them drops
the lower shape from the window) and is refined by a pattern search around the best; pairs are
taken from the largest shape down, and passes repeat while one lowers the total, to the
deadline.  A bucket with a P95 limit and more than ``MOST_GROUPS`` groups is not searched (the
fold grows with them); without a limit the groups' own optima simply add up (``counted_runs``
folds nothing then), so windows of any number are searched, pair by pair, to the deadline.
Every result is judged exactly; a plan, never a bound.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace

import numpy as np

from model.base.runtime import Deadline, check_interrupt
from model.cost.common import allowed_above
from model.domain.schema import Batching, Problem
from model.planning.contract import Judge, Judged
from model.planning.count_runs import counted_runs, dp_seconds, unit_for, work
from model.planning.groups import Group, groups_of, moved_up
from model.planning.rebatch import counted, improved_candidates

log = logging.getLogger("shapeplan")

MOST_GROUPS = 48  # groups of one bucket with a P95 limit the search takes on (its folds grow with them)
PASSES = 2
REFINE = 2  # pattern-search steps around the best rung of the ladder
TRIAL_SHARE = 0.02  # of the time left, what the search's first fold may take (its count unit is chosen to fit)


def ladder(size: int) -> list[int]:
    """1, 2, 4, ... up to ``size`` (and ``size`` itself)."""
    out, k = [], 1
    while k < size:
        out.append(k)
        k *= 2
    return out + [size] if size >= 1 else out


def pairs(groups: list[Group]) -> list[tuple[int, int]]:
    """(lower, upper) indices of every window's consecutive groups by shape, the largest shapes first."""
    by_window: dict[int, list[int]] = {}
    for i, g in enumerate(groups):
        by_window.setdefault(g.window, []).append(i)
    out = []
    for members in by_window.values():
        members = sorted(members, key=lambda i: groups[i].shape)
        out += [(a, b) for a, b in zip(members, members[1:], strict=False)]
    return sorted(out, key=lambda p: -groups[p[1]].shape)


class Search:
    """One bucket's move search: its groups now, the least counted objective, and the DP of each current group
    (valid for one count and no pad weight).  A trial's tables are kept only while it is the pair's best, and
    only the current groups' stay cached, so memory stays at one bucket's tables (up to ``MAX_ENTRIES`` states
    a group) plus one trial's."""

    def __init__(self, problem: Problem, groups: list[Group], most: int, unit: int = 1):
        self.problem, self.groups, self.most, self.unit = problem, list(groups), most, unit
        self.tables: dict = {}
        found = counted_runs(problem, self.groups, most, 0.0, self.tables, unit)
        self.value = found[0] if found is not None else np.inf

    def trial(self, a: int, b: int, k: int) -> tuple[float, list[Group], dict]:
        """(objective, the groups, the tables of the two changed groups) with the k longest of group a moved to
        group b (a's DP reused as its prefix where its limit is unchanged)."""
        lower = self.groups[a]
        stay, grown = moved_up(lower, self.groups[b], k)
        local = dict(self.tables)
        entry = local.get(id(lower))
        if entry is not None and entry[0] is lower and stay.limit == lower.limit:
            local[id(stay)] = (stay, entry[1].prefix(len(stay)))
        trial = list(self.groups)
        trial[a], trial[b] = stay, grown
        found = counted_runs(self.problem, trial, self.most, 0.0, local, self.unit)
        value = found[0] if found is not None else np.inf
        fresh = {id(g): local[id(g)] for g in (stay, grown) if id(g) in local}
        return value, trial, fresh

    def improve(self, a: int, b: int, deadline: Deadline) -> bool:
        """The best k on the ladder for the pair (a, b), refined; kept when it lowers the objective."""
        size = len(self.groups[a])
        if not size or not len(self.groups[b]):
            return False
        tried: dict[int, float] = {}
        kept: list = [np.inf, None, None]  # the best trial's value, groups and tables

        def at(k: int) -> None:
            if k in tried:
                return
            check_interrupt()
            value, groups, fresh = self.trial(a, b, k)
            tried[k] = value
            if value < kept[0]:
                kept[:] = [value, groups, fresh]

        rungs = ladder(size)
        for k in rungs:
            if deadline.expired():
                break
            at(k)
        if not tried:
            return False
        best = min(tried, key=lambda k: (tried[k], k))
        step = max(1, best // 4)
        for _ in range(REFINE):  # a pattern search around the best rung: either side, then half the step
            if deadline.expired():
                break
            for k in (best - step, best + step):
                if 1 <= k <= size:
                    at(k)
            new = min(tried, key=lambda k: (tried[k], k))
            if new == best:
                if step == 1:
                    break
                step = max(1, step // 2)
            best = new
        value, groups, fresh = kept
        if groups is None or not value < self.value * (1 - 1e-12):
            return False
        for old in (self.groups[a], self.groups[b]):
            self.tables.pop(id(old), None)
        self.tables.update(fresh)
        self.groups, self.value = groups, value
        return True


def moved_bucket(problem: Problem, b: int, judged: Judged, judge: Judge, deadline: Deadline
                 ) -> tuple[Batching, float] | None:
    """Bucket b's cheapest plan found by moving members up (see module docstring), judged on the bucket alone,
    or None when no move lowered the counted objective or none was accepted."""
    groups = groups_of(problem, b, judged.batchings[b])
    if len(groups) < 2 or (len(groups) > MOST_GROUPS and problem.limits[b].max_p95_latency_ms is not None):
        return None
    n = len(problem.buckets[b])
    allowed = allowed_above(n) if problem.limits[b].max_p95_latency_ms is not None else 0
    works = [work(problem, g) for g in groups]
    unit = unit_for(works, allowed, TRIAL_SHARE * deadline.left())  # a search is a few dozen folds
    if 4.0 * dp_seconds(works, allowed // unit) > deadline.left():
        return None  # the first fold (it cannot stop part-way), three more held back for the end: no time
    t0 = time.perf_counter()
    search = Search(problem, groups, allowed // unit, unit)
    if not np.isfinite(search.value):
        return None
    # the final counted cut and its judging take about what the first fold took, twice: keep that back
    until = Deadline(deadline.at - 3.0 * (time.perf_counter() - t0))
    moved = False
    for _ in range(PASSES):
        better = False
        for a, bb in pairs(search.groups):
            if until.expired():
                break
            better |= search.improve(a, bb, until)
        moved |= better
        if not better or until.expired():
            break
    if not moved:
        return None
    found = counted(problem, b, [g for g in search.groups if len(g)], 0.0, judge, judged.name, deadline)
    return None if found is None else found[:2]


def moved(problem: Problem, judge: Judge, judged: Judged, deadline: Deadline) -> Judged | None:
    """The judged plan with every bucket's members moved up where that is cheaper (``moved_bucket``), judged
    whole; None unless it is cheaper and meets every limit."""
    if not problem.cost.shared_batch_time or not judged.acceptable:
        return None
    out = list(judged.batchings)
    for b in range(len(problem.buckets)):
        found = moved_bucket(problem, b, judged, judge, deadline)
        own = judged.evaluation.results[b].metrics
        if found is not None and (own is None or found[1] < float(own.cost) * (1 - 1e-12)):
            out[b] = found[0]
    if all(new is old for new, old in zip(out, judged.batchings, strict=True)):
        return None
    found = judge(problem, judged.name, tuple(out))
    if not found.acceptable or found.cost >= judged.cost * (1 - 1e-12):
        return None
    log.info("moving the %s plan's longest-gen members up a shape: %.6e -> %.6e", judged.name, judged.cost,
             found.cost)
    what = judged.method or f"the {judged.name} plan"
    return replace(found, notes=(*judged.notes, f"longest-gen members moved up a shape where that was cheaper, each "
                                 f"bucket re-batched with its P95 count exact: cost {judged.cost:.6g} -> "
                                 f"{found.cost:.6g}"),
                   method=f"{what}, its longest-gen members moved up a shape (the counted runs DP)")


def moved_candidates(problem: Problem, judge: Judge, candidates: list[Judged], deadline: Deadline,
                     most: int = 1) -> list[Judged]:
    """The ``most`` cheapest acceptable candidates with members moved up (``moved``), cheapest first while the
    deadline allows: the ones that came out cheaper, as more candidates (device mode; none elsewhere)."""
    return improved_candidates(problem, judge, candidates, deadline, most, moved)
