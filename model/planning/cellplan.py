"""The MIP planner on histograms alone, for request sets too large to hold (the Dask engine at 10^8).

The steps of ``model.planning.mip.plan_mip`` that work on cells -- shape setup, column
generation, the MIP search with its certified bound, exact judging, repairs -- run here on
exact histograms built from counts (``model.histogram.cells.from_counts``); the plan comes
out as runs (``CellRuns``), judged exactly by ``model.evaluation.cell_judge``.  Memory and time
grow with cells, arcs and batches, never with requests.

Left out, because they work request by request: the greedy packer's warm start and
fallback, the last-resort packers and the final shape pass (``plan_mip`` has them); and
device mode, whose exact runs DP and flow search batch sorted requests.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from model.base.errors import InfeasibleError, InputError, NoPlanFound
from model.base.runtime import Deadline
from model.domain.schema import CellRuns, Evaluation, Problem, RunsJudged, SolveReport, Status
from model.histogram.cells import Histogram
from model.planning.contract import Candidates, JudgedRuns, RunsJudge, select
from model.planning.mip import tightened
from model.planning.options import PlannerOptions
from model.planning.stages import search, shape_setup
from solvers.backends import get_backend
from solvers.backends.result import Feature

log = logging.getLogger("shapeplan")
JUDGE_RESERVE_S = 1.0  # judging runs takes milliseconds; a second is kept for it and the report


@dataclass(frozen=True, eq=False)
class CellPlanned:
    """The planner's answer by cells: every bucket's runs, each judged (spike leads included), the evaluation and
    the solver's report."""

    runs: tuple[CellRuns, ...]
    judged: tuple[RunsJudged, ...]
    evaluation: Evaluation
    report: SolveReport


def plan_cells(problem: Problem, fine: list[Histogram], backend: str = "highs", time_limit: float = 60.0,
               options: PlannerOptions = PlannerOptions(), *, judge_runs: RunsJudge) -> CellPlanned:
    """Plan every bucket from its exact histogram; ``problem`` carries the settings and bucket names (its buckets
    need hold no request).  Raises InfeasibleError only with a proof, NoPlanFound otherwise."""
    t0 = time.perf_counter()
    clock = Deadline.after(time_limit)
    if problem.cost.shared_batch_time:
        raise InputError("--cost-model", None, None, "device mode batches requests by their exact gens (runs per "
                         "shape), so it needs every request's lengths; planning from histograms takes the "
                         "reference and strict modes")
    solver = get_backend(backend)
    if Feature.MIP not in solver.features:
        raise InputError("--backend", None, None, f"backend {backend!r} cannot solve integer models")
    work = Deadline(clock.at - min(JUDGE_RESERVE_S, 0.1 * clock.left()))
    setup = shape_setup(problem, fine, options, work)
    attempt_problem, reserves = problem, (0,) * len(fine)
    first = outcome = None
    chosen: tuple[Evaluation, tuple[RunsJudged, ...], tuple[CellRuns, ...]] | None = None
    broken: tuple = ()
    attempt = 0
    for attempt in range(options.max_repairs + 1):
        outcome = search(attempt_problem, fine, setup, None, solver, work, reserves, options)
        first = first or outcome
        if outcome.runs is None:
            break
        evaluation, judged = judge_runs(problem, fine, list(outcome.runs))
        rules = [v for r in evaluation.results for v in r.violations] + list(evaluation.global_problems)
        if rules:
            raise RuntimeError(f"the MIP's runs break a rule of the contract: {rules[0].message}")
        broken = tuple((b, c.metric, c.value, c.limit) for b, r in enumerate(evaluation.results)
                       for c in r.checks if not c.ok)
        if not broken:
            chosen = (evaluation, judged, outcome.runs)
            break
        if attempt == options.max_repairs or work.expired():
            break
        log.info("exact re-evaluation: the MIP plan breaks %s; tightening and solving again",
                 ", ".join(f"{problem.buckets[b].name} {m}" for b, m, _, _ in broken))
        attempt_problem, reserves = tightened(attempt_problem, reserves, broken, options)
    if chosen is None:
        raise _no_plan(solver.name, first, outcome, broken, attempt)
    evaluation, judged, runs = chosen
    notes = ["planned from histograms alone (no request held): no greedy start or fallback, no final shape pass"]
    if attempt:
        notes.append(f"repaired: re-solved {attempt} time(s) with limits tightened by what the exact evaluation "
                     "found the model had missed")
    candidate = JudgedRuns(runs, judged, evaluation, tuple(notes))
    _, report = select(Candidates((candidate,), first.bound, solver.name, solver.version(), t0, clock,
                                  outcome.status, first.bucket_bounds, tuple(first.notes)))
    return CellPlanned(runs, judged, evaluation, report)


def _no_plan(backend: str, first, last, broken: tuple, repairs: int) -> Exception:
    """InfeasibleError with a proof (the whole exact model infeasible), else NoPlanFound saying what happened."""
    if first is not None and first.runs is None and first.exact and first.status is Status.INFEASIBLE:
        return InfeasibleError(f"the limits cannot all be met: {backend} proved the whole exact model infeasible")
    if last is not None and last.runs is not None and broken:
        what = (f"the MIP's plan still breaks {', '.join(sorted({m for _, m, _, _ in broken}))} under the exact "
                f"evaluation after {repairs} repair(s)")
    elif last is not None:
        what = f"no plan found ({backend}: {last.status.text}{f': {last.native}' if last.native else ''})"
    else:
        what = "no plan found"
    return NoPlanFound(f"{what}; not proven infeasible (planning from histograms has no packer fallback)")

