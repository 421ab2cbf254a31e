"""The planner contract: planners hand over judged candidates, and one selection step builds the report.

Every planner -- the MIP, the windowed planner, the planner on cells, the packers -- ends
the same way: the plans it found, each expanded and judged exactly by the one cost model
(a ``Judged``), the certified bound it proved, and what it wants said.  ``select`` then
chooses, sets the status by one rule (``plan_status``) and builds the ``SolveReport``, so
no planner keeps a status rule or a report of its own.

Planners never import the expansion or the evaluator: they are given a ``Judge``
(``model.pipeline.judge``: expand, then evaluate), which keeps the layers one way while
the planner still repairs what the exact judging finds broken.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

from model.base.runtime import Deadline
from model.domain.schema import (
    OPTIMAL_GAP,
    Batching,
    CellRuns,
    Evaluation,
    Plan,
    Problem,
    RunsJudged,
    SolveReport,
    Status,
    relative_gap,
)
from model.histogram.cells import Histogram


@dataclass(frozen=True, eq=False)
class Judged:
    """A candidate plan expanded and judged exactly: its plans, their evaluation, the total cost and each
    broken limit (bucket, metric, value, limit); ``notes`` are what the report says if this one is returned."""

    name: str
    batchings: tuple[Batching, ...]
    plans: tuple[Plan, ...]
    evaluation: Evaluation
    notes: tuple[str, ...] = ()
    method: str = ""  # what made this plan when it is not the candidate's name (a re-batching of it, say)
    rebatched: bool = False  # re-batched on its own shapes by a complete ``model.planning.rebatch`` search

    @property
    def cost(self) -> float:
        return self.evaluation.total_cost

    @property
    def broken(self) -> tuple[tuple[int, str, float, float], ...]:
        return tuple((b, c.metric, c.value, c.limit) for b, r in enumerate(self.evaluation.results)
                     for c in r.checks if not c.ok)

    @property
    def acceptable(self) -> bool:
        """Valid under every rule and within every limit."""
        return self.evaluation.ok


@dataclass(frozen=True, eq=False)
class JudgedRuns:
    """A plan by cells judged exactly (the planner on histograms): every bucket's runs, each judged (spike leads
    included), their evaluation, and the notes the report carries if it is returned."""

    runs: tuple[CellRuns, ...]
    judged: tuple[RunsJudged, ...]
    evaluation: Evaluation
    notes: tuple[str, ...] = ()

    @property
    def cost(self) -> float:
        return self.evaluation.total_cost


class RunsJudge(Protocol):
    """Judge runs of cells exactly by cells (``model.evaluation.cell_judge.evaluate_runs``)."""

    def __call__(self, problem: Problem, hists: list[Histogram], runs: tuple[CellRuns, ...]
                 ) -> tuple[Evaluation, tuple[RunsJudged, ...]]: ...


class Judge(Protocol):
    """Expand a candidate's batchings into plans (spikes placed) and evaluate them with the one cost model."""

    def __call__(self, problem: Problem, name: str, batchings: tuple[Batching, ...]) -> Judged: ...


class Priced(Protocol):
    """What ``select`` needs of a candidate: its exact total cost and the notes that come with it."""

    @property
    def cost(self) -> float: ...

    @property
    def notes(self) -> tuple[str, ...]: ...


@dataclass(frozen=True, eq=False)
class Candidates:
    """A planner's answer before the selection step.

    ``judged`` holds the acceptable candidates in the planner's order (ties go to the first);
    ``bound`` is certified for the whole problem (None: no bound, a heuristic); ``lead`` notes
    come before the chosen candidate's own, ``closing`` notes after; ``search_status`` is how
    the planner's last search ended (the status rule's input) and ``deadline`` the run's.
    """

    judged: tuple[Priced, ...]
    bound: float | None
    backend: str
    version: str
    started: float
    deadline: Deadline
    search_status: Status = Status.FEASIBLE
    bucket_bounds: tuple[float, ...] | None = None
    lead: tuple[str, ...] = ()
    closing: tuple[str, ...] = ()
    bound_by: str = ""  # the method that gave ``bound``
    stalled: bool = False  # the last search gave its time back (nothing better found for a while)
    start: tuple[str, float] | None = None  # the search's start plan: its method and exact cost
    on_shapes: float | None = None  # a bound on every plan compiling the shapes of the cheapest of ``judged``
    bound_open: bool = False  # the bound's search over shape sets was stopped before it ended (more time: higher)


def plan_status(gap: float, last: Status, clock: Deadline) -> Status:
    """A returned plan's status: optimal only at gap 0 (to rounding), "time limit" when the last search or the
    clock ran out, else feasible."""
    if gap <= OPTIMAL_GAP:
        return Status.OPTIMAL
    if last in (Status.TIME_LIMIT_FEASIBLE, Status.TIME_LIMIT_NO_SOLUTION) or clock.expired():
        return Status.TIME_LIMIT_FEASIBLE
    return Status.FEASIBLE


def plan_method(chosen: Priced, start: tuple[str, float] | None) -> str:
    """Which method found the returned plan: the candidate's own name, or the start's where the MIP returned
    a plan no cheaper than the start it was given (it found nothing better)."""
    name = getattr(chosen, "name", "")
    if getattr(chosen, "method", ""):
        return chosen.method
    if name == "mip" and start is not None and chosen.cost >= start[1] * (1 - 1e-12):
        return f"{start[0]} (the MIP's search found nothing cheaper)"
    return name


def how_it_ended(gap: float, found: Candidates) -> tuple[str, str]:
    """(why the run ended, whether more time could help), kept apart from the status: a search that stalled or
    finished gave its time back, and only one the clock stopped might still improve."""
    if gap <= OPTIMAL_GAP:
        return "the plan reached the bound", "no: the plan is optimal"
    if found.search_status in (Status.TIME_LIMIT_FEASIBLE, Status.TIME_LIMIT_NO_SOLUTION) or found.deadline.expired():
        return "the time limit", "possibly: the search was still running when the time limit came"
    if found.stalled:
        return ("the search stalled (no better plan for a while) and gave its time back",
                "for the bound, possibly: its search over shape sets was stopped before it ended; for the plan, "
                "unlikely: the search had stopped improving" if found.bound_open else
                "unlikely: the search had stopped improving; the gap is the bound's as much as the plan's")
    if found.bound_open:
        return ("the search finished (nothing left to try)",
                "for the bound, possibly: its search over shape sets was stopped before it ended")
    return "the search finished (nothing left to try)", "unlikely: every phase ended on its own"


def select(found: Candidates) -> tuple[Priced, SolveReport]:
    """The selection step: the cheapest candidate and the report that says what it is and how sure we are.

    A planner without a bound (a packer) reports a heuristic with no objective or gap; one with a bound
    reports the chosen cost against it, its status by ``plan_status``.
    """
    if not found.judged:
        raise ValueError("select needs at least one candidate (a planner with none raises its own error)")
    chosen = min(found.judged, key=lambda j: j.cost)
    notes = (*found.lead, *chosen.notes, *found.closing)
    elapsed = time.perf_counter() - found.started
    if found.bound is None:
        return chosen, SolveReport(Status.HEURISTIC, None, None, None, elapsed, found.backend, found.version,
                                   found.bucket_bounds, notes)
    gap = relative_gap(chosen.cost, found.bound)
    ended, more = how_it_ended(gap, found)
    return chosen, SolveReport(plan_status(gap, found.search_status, found.deadline), chosen.cost, found.bound,
                               gap, elapsed, found.backend, found.version, found.bucket_bounds, notes,
                               plan_method(chosen, found.start), found.bound_by, ended, more,
                               found.on_shapes)
