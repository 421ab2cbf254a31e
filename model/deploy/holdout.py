"""Out-of-sample check: choose shapes on the first part of the traffic, judge them on the rest.

Shapes are compiled once and then serve traffic that was not seen when they were
chosen.  ``split`` holds out the last ``fraction`` of each bucket -- by arrival time
when the bucket has one (``Bucket.arrival_s``), else in file order -- and ``holdout``
plans the first part, takes the shapes its plan uses, and plans the held-out part
three ways: under those fixed shapes (``Problem.allowed_shapes``, same K), under its
own free choice (what hindsight would have compiled), and with the ``pow2`` rule.
What the chosen shapes lose out of sample is their cost over the held-out part's own
optimum; the own run's certified bound caps that loss from above.

Absolute limits (``max_cost``, ``max_sequential_ms``) are scaled to each part's share
of its bucket's requests; ratio and latency limits are kept as they are.

A held-out request longer than the largest chosen shape cannot run under those
shapes at all.  Such requests are counted and said; the three held-out plans are
then all made for the requests that can run (so they stay comparable).

Library code built on ``model.pipeline``; it parses nothing and prints nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from model import pipeline
from model.base.errors import InfeasibleError, InputError, NoPlanFound
from model.base.numbers import counted
from model.base.runtime import Deadline, RunBudget
from model.cost.common import align
from model.domain.schema import Bucket, Limits, Problem
from model.planning.bucket_choice import with_buckets

POW2 = "pow2"
PLANNER_RUNS = 3  # a hold-out plans with the solver three times: the first part, under the chosen shapes, its own
SCALED = ("max_cost", "max_sequential_ms")  # limits that grow with the number of requests


@dataclass(frozen=True, eq=False)
class Split:
    """A problem cut in two: ``train`` (shapes are chosen on it) and ``test`` (held out)."""

    train: Problem
    test: Problem
    fraction: float
    by: str  # "arrival time", "file order", or "arrival time / file order" when buckets differ

    def describe(self) -> str:
        n_train = sum(len(b) for b in self.train.buckets)
        n_test = sum(len(b) for b in self.test.buckets)
        return (f"the last {self.fraction:.0%} of each bucket by {self.by} held out: shapes chosen on "
                f"{counted(n_train, 'request')}, checked on {n_test}")


def subset(bucket: Bucket, rows: np.ndarray) -> Bucket:
    """The bucket's requests at ``rows`` (file order kept): same name and source, the same line numbers."""
    return Bucket(bucket.name, bucket.source, bucket.request_ids[rows], bucket.prompt_len[rows],
                  bucket.gen_len[rows], bucket.lines[rows],
                  None if bucket.arrival_s is None else bucket.arrival_s[rows])


def split_rows(bucket: Bucket, fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """Rows of the first part and of the held-out part (each in file order, neither empty).

    The held-out part is the ``fraction * n`` (rounded, half up) latest arrivals (ties in file order),
    or the last rows of the file when the bucket has no arrival times.
    """
    n = len(bucket)
    if n < 2:
        raise InputError(bucket.source, None, None, f"{n} request: a hold-out needs at least 2 in each bucket")
    n_test = int(np.clip(math.floor(fraction * n + 0.5), 1, n - 1))  # half rounds up
    order = np.argsort(bucket.arrival_s, kind="stable") if bucket.arrival_s is not None else np.arange(n)
    return np.sort(order[:n - n_test]), np.sort(order[n - n_test:])


def scaled(limits: Limits, share: float) -> Limits:
    """A bucket's limits for a part holding ``share`` of its requests (absolute limits scaled)."""
    return replace(limits, **{f: getattr(limits, f) * share for f in SCALED if getattr(limits, f) is not None})


def split(problem: Problem, fraction: float) -> Split:
    """Hold out the last ``fraction`` of every bucket (see ``split_rows``)."""
    if not 0 < fraction < 1:
        raise InputError("--holdout", None, None, f"must lie strictly between 0 and 1, got {fraction!r}")
    parts: tuple[list[Bucket], list[Bucket]] = ([], [])
    limits: tuple[list[Limits], list[Limits]] = ([], [])
    for bucket, lim in zip(problem.buckets, problem.limits, strict=True):
        for i, rows in enumerate(split_rows(bucket, fraction)):
            parts[i].append(subset(bucket, rows))
            limits[i].append(scaled(lim, len(rows) / len(bucket)))
    kinds = {"arrival time" if b.arrival_s is not None else "file order" for b in problem.buckets}
    train, test = (replace(problem, buckets=tuple(parts[i]), limits=tuple(limits[i])) for i in (0, 1))
    return Split(train, test, fraction, " / ".join(sorted(kinds)))


def used_shapes(run: pipeline.Run) -> tuple[int, ...]:
    """Every shape the run's plans declare, over all buckets."""
    return tuple(sorted({int(s) for r in run.evaluation.results if r.metrics for s in r.metrics.shapes}))


def covered(problem: Problem, top: int) -> tuple[Problem | None, int]:
    """The problem without the requests longer than ``top`` (None if a bucket would be left empty),
    and how many were dropped."""
    keep = [align(b.prompt_len) <= top for b in problem.buckets]
    dropped = int(sum((~k).sum() for k in keep))
    if not dropped:
        return problem, 0
    if any(not k.any() for k in keep):
        return None, dropped
    buckets = tuple(subset(b, np.flatnonzero(k)) for b, k in zip(problem.buckets, keep, strict=True))
    limits = tuple(scaled(lim, k.mean()) for lim, k in zip(problem.limits, keep, strict=True))
    return replace(problem, buckets=buckets, limits=limits), dropped


@dataclass(frozen=True, eq=False)
class Holdout:
    """The out-of-sample check at one shape cap.

    ``fixed``, ``own`` and ``pow2`` are runs on ``compared`` (the held-out part, less any
    request too long for the chosen shapes); a run that could not be made is None and
    its reason is in ``messages``.
    """

    split: Split
    solver: str
    k: int
    shapes: tuple[int, ...]
    in_sample: float | None  # the solver's cost on the first part
    pow2_in_sample: float | None
    compared: Problem | None
    fixed: pipeline.Run | None
    own: pipeline.Run | None
    pow2: pipeline.Run | None
    uncovered: int
    messages: tuple[str, ...] = ()

    @staticmethod
    def cost(run: pipeline.Run | None) -> float | None:
        return run.evaluation.total_cost if run is not None else None

    @property
    def own_bound(self) -> float | None:
        """The certified lower bound on the held-out part's optimum (None for a heuristic)."""
        return self.own.planned.report.bound if self.own is not None else None

    @property
    def loss(self) -> float | None:
        """What the chosen shapes lose out of sample: fixed cost / own optimum - 1."""
        return _excess(self.cost(self.fixed), self.cost(self.own))

    @property
    def loss_vs_bound(self) -> float | None:
        """The same against the own part's certified bound: an upper bound on the true loss."""
        return _excess(self.cost(self.fixed), self.own_bound)

    @property
    def pow2_excess(self) -> float | None:
        """pow2 on the held-out part over the held-out part's own optimum."""
        return _excess(self.cost(self.pow2), self.cost(self.own))

    @property
    def ok(self) -> bool:
        """The held-out part could be planned under the chosen shapes, validly and within its limits (the own
        and pow2 runs are reference points: a limit they break is shown, not a failure of the check)."""
        return self.fixed is not None and self.fixed.evaluation.ok


def _excess(cost: float | None, reference: float | None) -> float | None:
    if cost is None or reference is None or reference <= 0:
        return None
    return cost / reference - 1


def run_limit(budget: RunBudget | None, time_limit: float, mip: bool = True) -> float:
    """The time limit of the next planner run: with one ``budget`` for the whole run, its share of what is left
    (``RunBudget``); without, ``time_limit`` itself (library use)."""
    return time_limit if budget is None else budget.next_limit(mip)


def _attempt(problem: Problem, solver: str, backend: str, time_limit: float,
             messages: list[str], what: str) -> pipeline.Run | None:
    try:
        return pipeline.run(problem, solver, backend, time_limit)
    except (InfeasibleError, NoPlanFound) as exc:
        if isinstance(exc, NoPlanFound) and solver == pipeline.MIP:  # not proven: the check cannot go on
            raise
        messages.append(f"{what}: {exc}")  # a proof, or a packer's rule with no plan (pow2 where it does not fit)
        return None


def check_shapes(split_: Split, shapes: tuple[int, ...], in_sample: float | None, solver: str = pipeline.MIP,
                 backend: str = "highs", time_limit: float = 60.0, pow2_in_sample: float | None = None,
                 k: int | None = None, budget: RunBudget | None = None,
                 buckets: tuple[int, ...] | None = None) -> Holdout:
    """Plan the held-out part under ``shapes`` (chosen on the first part), under its own choice, and with pow2,
    all with at most ``k`` shapes (default: the split's K).  With ``budget`` the two planner runs take their
    shares of the run's one deadline (``run_limit``); without, each gets ``time_limit``.  ``buckets``: the batch
    buckets chosen on the first part (``--batch-buckets auto``), which the deployed config compiles with the
    shapes."""
    k = split_.test.max_shapes if k is None else k
    messages: list[str] = []
    compared, uncovered = covered(split_.test.with_shapes(k), max(shapes)) if shapes else (None, 0)
    if compared is None:
        raise nothing_to_compare(split_, shapes)
    if uncovered:
        messages.append(f"{uncovered} held-out request(s) are longer than the largest chosen shape {max(shapes)} "
                        "and cannot run under the chosen shapes; the held-out plans cover the others")
    # the own run and pow2 keep the problem's own allowed set (if any): hindsight, under the same rules
    deployed = compared if buckets is None else with_buckets(compared, buckets)
    fixed = _attempt(replace(deployed, allowed_shapes=shapes), solver, backend, run_limit(budget, time_limit),
                     messages, "held-out part under the chosen shapes")
    own = _attempt(compared, solver, backend, run_limit(budget, time_limit), messages,
                   "held-out part, its own shapes")
    pow2 = _attempt(compared, POW2, backend, run_limit(budget, time_limit, mip=False), messages,
                    "pow2, held-out part")
    return Holdout(split_, solver, k, shapes, in_sample, pow2_in_sample, compared, fixed, own, pow2, uncovered,
                   tuple(messages))


def nothing_to_compare(split_: Split, shapes: tuple[int, ...]) -> InputError:
    """The check asked for cannot be made: some bucket's held-out part has no request the chosen shapes can run.

    That is the input and the fraction (the held-out part holds only prompts longer than any the first part
    had), not a plan that breaks a rule (exit 1) nor limits proven unmeetable (exit 3): bad input, exit 2,
    with the same words from solve, sweep and audit.
    """
    top = max(shapes, default=0)
    empty = next((b for b in split_.test.buckets if not (align(b.prompt_len) <= top).any()), split_.test.buckets[0])
    return InputError("--holdout", None, None,
                      f"every held-out request of bucket {empty.name} ({len(empty)}) is longer than the largest shape "
                      f"chosen on the first part ({top}): nothing to compare; hold out a smaller fraction")


def pow2_cost(problem: Problem) -> float | None:
    """The pow2 rule's cost on a problem (None if it cannot plan it)."""
    try:
        return pipeline.run(problem, POW2).evaluation.total_cost
    except (InfeasibleError, NoPlanFound):
        return None


def sweep_checks(split_: Split, chosen: Sequence[tuple[int, tuple[int, ...], float | None]], backend: str = "highs",
                 time_limit: float = 60.0, progress: Callable[[int], None] | None = None,
                 budget: RunBudget | None = None) -> list[Holdout]:
    """The check for each (K, MIP shapes chosen on the first part at that K, their in-sample cost) of a sweep;
    with ``budget`` (the sweep's one deadline) their MIP runs share what the sweep left."""
    out = []
    for k, shapes, cost in chosen:
        out.append(check_shapes(split_, shapes, cost, pipeline.MIP, backend, time_limit,
                                pow2_cost(split_.train.with_shapes(k)), k, budget))
        if progress is not None:
            progress(k)
    return out


def holdout(problem: Problem, fraction: float, solver: str = pipeline.MIP, backend: str = "highs",
            time_limit: float = 60.0, budget: RunBudget | None = None) -> tuple[Holdout, pipeline.Run]:
    """Split, plan the first part (its shapes are the choice), and check them on the held-out part.

    Returns the check and the first part's run.  The first part's limits must be
    met (an InfeasibleError otherwise, as for any plan).  ``time_limit`` bounds the whole check: its three
    planner runs share one deadline (each had the whole limit, so --time-limit 5 took 15 s); ``budget`` is a
    deadline shared with more runs (the audit plans today's shapes after the check).
    """
    budget = RunBudget(Deadline.after(time_limit), PLANNER_RUNS) if budget is None else budget
    part = split(problem, fraction)
    train = pipeline.run(part.train, solver, backend, run_limit(budget, time_limit))
    check = check_shapes(part, used_shapes(train), train.evaluation.total_cost, solver, backend, time_limit,
                         pow2_cost(part.train), budget=budget, buckets=train.planned.chosen_buckets)
    return check, train
