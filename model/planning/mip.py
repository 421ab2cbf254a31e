"""The MIP planner: histograms -> shapes -> column generation -> MIP -> batches, with a certified bound.

Flow (data one way):
  1. aggregate each bucket into (S, G) cells;
  2. settle the shapes: in reference mode they only move compile cost (one per bucket,
     exact DP); in strict mode an exact DP over a shape relaxation picks them and
     certifies a bound (``model.planning.shapes``);
  3. column generation over the box grid (``model.planning.colgen``): LP duals price every box,
     giving the boxes worth holding and a Lagrangian bound for the whole problem;
  4. MIP: first over the LP's support (seconds), then -- while the gap exceeds
     TARGET_GAP -- over every generated box that reduced costs cannot rule out,
     warm-started from the incumbent (``model.planning.search``);
  5. expansion and exact re-evaluation with the one cost model: the cheaper of the MIP
     plan and the greedy packer's plan that meets every limit is returned (when neither
     does, the simple packers' plans, every request alone first); if the MIP plan breaks
     a limit the model thought it met, the limit is tightened by the excess and the
     search repeated;
  6. the final shape pass (``model.planning.reshape``): the returned batches declare the
     shapes that cost least for them, if the exact evaluation finds that cheaper and
     still within every limit.

One deadline (``model.base.runtime.Deadline``) runs through every step, the final judging
included, so a run ends within its time limit.  No plan ends as InfeasibleError only
with a proof (a limit below what any plan reaches, or the whole model infeasible);
otherwise as NoPlanFound (a time limit, a solver failure).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace

import numpy as np

from model.base.errors import InfeasibleError, InputError, NoPlanFound
from model.base.runtime import Deadline
from model.cost.model import CostModel
from model.domain.schema import Batching, Planned, Problem, Status
from model.histogram.cells import Histogram, build_histogram
from model.packers import PACKERS
from model.planning.beside import raised
from model.planning.chain_shapes import chain_candidates
from model.planning.contract import Candidates, Judge, Judged, select
from model.planning.device_search import all_shapes, flow_search, shape_levels, shape_relaxation
from model.planning.diagnose import alone_message, explain_infeasible, single_limit, unmeetable
from model.planning.exact_runs import device_start
from model.planning.fixed_set import on_shapes_bound
from model.planning.move_up import moved_candidates
from model.planning.options import PlannerOptions
from model.planning.rebatch import rebatch_plan, rebatched_candidates
from model.planning.reshape import redeclared
from model.planning.shapes import ShapeChoice
from model.planning.stages import SearchOutcome, ShapeSetup, greedy_plan, search, shape_setup
from solvers.backends import get_backend
from solvers.backends.result import Feature

log = logging.getLogger("shapeplan")
LAST_RESORT = ("solo", "cells", "pow2", "exp", "baseline")  # analytic modes: tried when nothing else meets the limits
# when the clock ran out before any plan met every limit: a good packer first, then every request alone (the plan
# that meets most latency and pad limits); judged past the deadline, since a late plan beats none
OVERDUE = ("dpfill", "solo")


def tightened(problem: Problem, reserves: tuple[int, ...], broken: tuple[tuple[int, str, float, float], ...],
              options: PlannerOptions = PlannerOptions()) -> tuple[Problem, tuple[int, ...]]:
    """Tighten what the exact evaluation found broken: one more P95 member held back, or the limit lowered
    by its excess (a spike's worth at least for sequential time).  The model places spikes exactly, so this
    is a safety net (a search that held members back proves nothing, and the packers remain to try)."""
    limits, reserves = list(problem.limits), list(reserves)
    for b, metric, value, limit in broken:
        if metric == "p95_latency_ms":
            reserves[b] += 1
            continue
        excess = value - limit
        if metric == "sequential_ms":
            excess = max(excess, problem.cost.spike_ms)
        limits[b] = limits[b].with_limit(metric, limits[b].get(metric) - options.repair_margin * excess)
    return replace(problem, limits=tuple(limits)), tuple(reserves)


def device_fallbacks(problem: Problem, judge: Judge, deadline: Deadline = Deadline.never(),
                     options: PlannerOptions = PlannerOptions()) -> list[Judged]:
    """Device mode: the plans of the packers that meet every limit (dpfill, pow2, solo), judged exactly.

    The exact-batching start ignores the limits; when it breaks one, the cheapest packer
    plan that meets them starts the MIP instead, and every such plan stays a fallback, so
    the planner never returns a plan costlier than a packer's nor "no plan" when one has one --
    within ``deadline``: a packer is not started once it has passed (each takes seconds on 10^5
    long-context requests), so a short time limit may leave fewer fallbacks.
    """
    n = sum(len(b) for b in problem.buckets)
    return [j for j in packer_plans(problem, judge, ("dpfill", "pow2", "solo"), deadline,
                                    options.judge_s_per_request * n, options) if j.acceptable]


def rebatched_fallback(problem: Problem, judge: Judge, fallbacks: list[Judged], deadline: Deadline
                       ) -> list[Judged]:
    """The fallbacks with the cheapest re-batched exactly on its own shapes (``rebatch.rebatch_plan``) within
    ``deadline``, the cheaper plan added; where that search was complete the one tried is marked (the end's
    re-batching skips it), else the end tries it again with its own time.  Done at the start, with a share of
    the whole limit, not at the end with what the search leaves: "never costlier than the cheapest packer
    re-batched exactly" then holds whenever that DP fits the share (4 s on 12k long-context requests),
    whatever the search takes."""
    if not fallbacks or not problem.cost.shared_batch_time:
        return fallbacks
    k = min(range(len(fallbacks)), key=lambda i: fallbacks[i].cost)
    found, complete = rebatch_plan(problem, judge, fallbacks[k], deadline)
    out = [replace(f, rebatched=complete) if i == k else f for i, f in enumerate(fallbacks)]
    return out + ([found] if found is not None else [])


def packer_plans(problem: Problem, judge: Judge, names: tuple[str, ...], deadline: Deadline = Deadline.never(),
                 spent: float = 0.0, options: PlannerOptions = PlannerOptions()) -> list[Judged]:
    """The named packers' plans judged exactly, in order, while a judging (``spent``, with the margin) still
    fits before ``deadline``; a packer that cannot plan the problem is skipped."""
    out = []
    for name in names:
        if deadline.left() < options.judge_margin * spent:
            break
        try:
            out.append(judge(problem, name, PACKERS[name](problem)))
        except InfeasibleError:
            continue
    return out


def judge_reserve(spent: float, left: float, options: PlannerOptions = PlannerOptions()) -> float:
    """Seconds kept at the end for judging: the chosen plan's judging (with a margin) and, when that still
    leaves the search at least half the time, the final shape pass's.  At 10^7 requests a judging takes
    about 25 s: reserving the final pass too left a 60 s run no time to search, and no plan."""
    must = options.judge_margin * spent
    full = must + options.final_pass_judges * spent
    return full if full <= 0.5 * left else must


def last_resort(problem: Problem, judge: Judge, deadline: Deadline, spent: float,
                options: PlannerOptions = PlannerOptions()) -> list[Judged]:
    """Analytic modes, when neither the MIP nor greedy met every limit: the packers' plans, judged exactly
    while the time lasts (every request alone is one of them), for the caller to take those that meet every
    limit.  A search over part of the boxes, or a time limit, may miss a plan such a simple rule has; no plan
    should be given up for that."""
    return packer_plans(problem, judge, LAST_RESORT, deadline, spent, options)


def overdue_packers(problem: Problem, judge: Judge, tried: list[Judged]) -> list[Judged]:
    """The clock ran out before any plan met every limit (at 10^7 requests greedy is skipped, and the MIP had no
    time to start): the OVERDUE packers not tried yet, judged past the deadline until one meets every limit.
    A time limit too short for the MIP must not end in "no plan" when a packer's plan is seconds away; the
    report's status says the time limit ran out, and a note that the plan is the packer's."""
    seen = {j.name for j in tried}
    return until_acceptable(problem, judge, [n for n in OVERDUE if n not in seen])


def until_acceptable(problem: Problem, judge: Judge, names: list[str]) -> list[Judged]:
    """The named packers' plans judged in order until one meets every limit (a packer that cannot plan the
    problem is skipped): the fallback of a run whose clock left nothing else."""
    out: list[Judged] = []
    for name in names:
        try:
            out.append(judge(problem, name, PACKERS[name](problem)))
        except InfeasibleError:
            continue
        if out[-1].acceptable:
            break
    return out


def ran_out(clock: Deadline, spent: float, options: PlannerOptions) -> bool:
    """Whether the clock left too little for one more judging: the packers were then skipped, not tried."""
    return clock.left() < options.judge_margin * spent


def final_shapes(problem: Problem, judge: Judge, judged: Judged, deadline: Deadline, spent: float,
                 options: PlannerOptions = PlannerOptions()) -> tuple[Judged, str | None]:
    """The final shape pass (``model.planning.reshape``) on an acceptable plan: the cheapest re-declaration of
    its shapes for the same batches that the exact evaluation finds cheaper and within every limit (spikes
    move with the shapes), and a note saying what changed; else the plan as it was."""
    for what, batchings in redeclared(problem, judged.batchings):
        if deadline.left() < options.judge_margin * spent:
            break
        new = judge(problem, judged.name, batchings)
        if new.acceptable and new.cost < judged.cost:
            before = len(set().union(*(set(r.metrics.shapes) for r in judged.evaluation.results)))
            after = len(set().union(*(set(r.metrics.shapes) for r in new.evaluation.results)))
            made = judged.method or f"the {judged.name} plan"
            new = replace(new, method=f"{made}, its shapes re-declared by the final shape pass")
            return new, (f"final shape pass on the {judged.name} plan: {what} ({before} -> {after} shapes), cost "
                         f"{judged.cost:.6g} -> {new.cost:.6g}")
        # costs do not depend on where spikes land, so the candidates come cheapest first: the next is dearer
    return judged, None


@dataclass(frozen=True, eq=False)
class Start:
    """What a strategy starts the search from: a plan (or None) and its name, the packer plans that meet every
    limit (candidates whatever the search finds), and the device relaxation (its shapes and bound)."""

    batchings: tuple[Batching, ...] | None
    name: str
    fallbacks: list[Judged]
    relaxation: ShapeChoice | None = None


class BoxSearch:
    """The analytic modes (a member's cost is its box's): the shapes settled first -- the reference DP, or the
    strict relaxation with its certified bound -- then column generation and MIPs over (cell, box) arcs; the
    simple packers are a last resort when nothing meets the limits."""

    last_resort = True

    def start(self, problem: Problem, fine: list[Histogram], greedy: tuple[Batching, ...] | None, judge: Judge,
              options: PlannerOptions, clock: Deadline) -> Start:
        """The greedy packer's plan is the start."""
        return Start(greedy, "greedy", [])

    def matching_s(self, fine: list[Histogram], options: PlannerOptions) -> float:
        """Nothing to match: the box model's solution is runs of cells already."""
        return 0.0

    def rebatch_s(self, time_limit: float, options: PlannerOptions) -> float:
        """Nothing to re-batch: a member's cost is its box's, whatever batch it shares."""
        return 0.0

    def prepare(self, problem: Problem, fine: list[Histogram], start: Start, options: PlannerOptions,
                work: Deadline) -> ShapeSetup:
        """The shape choice and the bound it certifies."""
        return shape_setup(problem, fine, options, work)

    def search(self, problem: Problem, fine: list[Histogram], state: ShapeSetup, greedy, solver, work: Deadline,
               reserves: tuple[int, ...], options: PlannerOptions, want_bound: bool) -> SearchOutcome:
        """Column generation, then the restricted MIPs (``model.planning.stages.search``)."""
        return search(problem, fine, state, greedy, solver, work, reserves, options)


class FlowSearch:
    """Batch-size-priced models (a batch's time grows with its size, device mode): the shape relaxation and an
    exact-runs start, the packers that meet every limit as fallbacks, then the flow model
    (``model.planning.device_search``), whose solution is matched back to requests."""

    last_resort = False

    def start(self, problem: Problem, fine: list[Histogram], greedy: tuple[Batching, ...] | None, judge: Judge,
              options: PlannerOptions, clock: Deadline) -> Start:
        """The best of the relaxation's and greedy's shape sets, each batched exactly and improved by moves."""
        # the first start, and part of the flow search's bound
        relaxation = shape_relaxation(problem, fine, clock.share(options.relaxation_share))
        # the relaxation's shapes first when it finished (its cut-short answer is one shape covering all)
        starts = [np.asarray(relaxation.shapes)] if np.isfinite(relaxation.bound) else []
        if greedy is not None:
            starts.append(np.unique(np.concatenate([bt.shape_of for bt in greedy])))
        if not starts:
            starts.append(np.asarray(relaxation.shapes))
        name = "greedy"
        exact_start = device_start(problem, starts, all_shapes(problem, fine),
                                   shape_levels(problem, fine, options), clock.share(options.start_share).at,
                                   required=greedy is None)
        if exact_start is not None:
            greedy, name = exact_start, "exact-runs start"
        fallbacks = device_fallbacks(problem, judge, clock.share(options.fallback_share), options)
        if options.rebatch_share > 0 and options.start_rebatch_share > 0:  # 0: no re-batching (per-window MIPs)
            fallbacks = rebatched_fallback(problem, judge, fallbacks, clock.share(options.start_rebatch_share))
        return Start(greedy, name, fallbacks, relaxation)

    def matching_s(self, fine: list[Histogram], options: PlannerOptions) -> float:
        """The flow solution's matching to requests, kept back from the search."""
        return options.match_s_per_cell * sum(len(h) for h in fine)

    def rebatch_s(self, time_limit: float, options: PlannerOptions) -> float:
        """The candidates' exact re-batching (``model.planning.rebatch``), kept back from the search."""
        return options.rebatch_share * time_limit

    def prepare(self, problem: Problem, fine: list[Histogram], start: Start, options: PlannerOptions,
                work: Deadline) -> ShapeChoice:
        """The relaxation the start computed: part of the flow search's bound."""
        return start.relaxation

    def search(self, problem: Problem, fine: list[Histogram], state: ShapeChoice, greedy, solver, work: Deadline,
               reserves: tuple[int, ...], options: PlannerOptions, want_bound: bool) -> SearchOutcome:
        """The flow model, solved, matched and batched."""
        return flow_search(problem, fine, greedy, solver, work, reserves, options, want_bound=want_bound,
                           relaxation=state)


def strategy_for(cost: CostModel) -> BoxSearch | FlowSearch:
    """The one place the planner's strategy is chosen from the cost model: by whether a batch's size sets its
    price (then batches, not boxes, are what the model must count)."""
    return FlowSearch() if cost.shared_batch_time else BoxSearch()


def plan_mip(problem: Problem, backend: str = "highs", time_limit: float = 60.0,
             options: PlannerOptions = PlannerOptions(), *, judge: Judge) -> Planned:
    """Plan every bucket by optimisation; the report carries a certified lower bound and its gap.

    Everything -- the greedy warm start, the shape choice, column generation, the
    MIPs, the bound, the repairs and the final judging -- finishes within
    ``time_limit`` seconds (give or take a solver's reaction time).  Raises
    InfeasibleError only with a proof that the limits cannot all be met, NoPlanFound
    when no plan was found without one, and Interrupted on a signal.
    """
    searches: list[SearchOutcome] = []
    try:
        return planned_mip(problem, backend, time_limit, options, judge, searches)
    finally:  # a search forked beside the planner never outlives it
        for outcome in searches:
            if outcome.beside is not None:
                outcome.beside.stop()


def planned_mip(problem: Problem, backend: str, time_limit: float, options: PlannerOptions, judge: Judge,
                searches: list[SearchOutcome]) -> Planned:
    """``plan_mip``'s work; every search's outcome goes into ``searches`` as it comes."""
    t0 = time.perf_counter()
    clock = Deadline.after(time_limit)
    solver = get_backend(backend)
    if Feature.MIP not in solver.features:
        raise InputError("--backend", None, None, f"backend {backend!r} cannot solve integer models")
    n_requests = sum(len(b) for b in problem.buckets)
    fine = [build_histogram(b) for b in problem.buckets]
    strategy = strategy_for(problem.cost)
    start = strategy.start(problem, fine, greedy_plan(problem, options, clock.share(options.greedy_share)), judge,
                           options, clock)
    greedy, fallbacks = start.batchings, start.fallbacks
    t_judge = time.perf_counter()
    judged_greedy = judge(problem, start.name, greedy) if greedy is not None else None
    if fallbacks and not judged_greedy.acceptable:
        greedy = min(fallbacks, key=lambda j: j.cost).batchings  # a start that meets the limits
    # the final judging of the MIP's plan must fit too: keep about what judging greedy's took
    spent = time.perf_counter() - t_judge if greedy is not None else options.judge_s_per_request * n_requests
    work = Deadline(clock.at - judge_reserve(spent, clock.left(), options) - strategy.matching_s(fine, options)
                    - min(options.solver_stop_s, options.solver_stop_share * time_limit)
                    - strategy.rebatch_s(time_limit, options))
    state = strategy.prepare(problem, fine, start, options, work)
    first, mip_ok, judged, attempt_problem, attempt = None, None, None, problem, 0
    reserves = (0,) * len(fine)  # the model places every compile spike exactly (arrays.spike_rows)
    for attempt in range(options.max_repairs + 1):
        outcome = strategy.search(attempt_problem, fine, state, greedy, solver, work, reserves, options,
                                  want_bound=first is None)
        searches.append(outcome)
        first = first or outcome  # its bound is for the original limits: the only one certified
        if outcome.batchings is None:
            break
        judged = judge(problem, "mip", outcome.batchings)
        if judged.acceptable:
            mip_ok = judged
            break
        if attempt == options.max_repairs or work.expired():
            break
        log.info("exact re-evaluation: the MIP plan breaks %s; tightening and solving again",
                 ", ".join(f"{problem.buckets[b].name} {m}" for b, m, _, _ in judged.broken))
        attempt_problem, reserves = tightened(attempt_problem, reserves, judged.broken, options)
    candidates = ([mip_ok] if mip_ok else []) + fallbacks
    if judged_greedy is not None and judged_greedy.acceptable:
        candidates.append(judged_greedy)
    tried = [j for j in (judged_greedy, judged) if j is not None] + fallbacks
    if not candidates and strategy.last_resort:
        resort = last_resort(problem, judge, clock, spent, options)
        tried += resort
        candidates = [j for j in resort if j.acceptable]
    overdue = False
    if not candidates and not first.proven_infeasible and ran_out(clock, spent, options):
        late = overdue_packers(problem, judge, tried)
        tried += late
        candidates = [j for j in late if j.acceptable]
        overdue = bool(candidates)
    if not candidates:
        raise no_plan(problem, judge, solver.name, first, outcome, judged, judged_greedy, tried, attempt, clock)
    if options.rebatch_share > 0:
        candidates += rebatched_candidates(problem, judge, candidates, Deadline(clock.at - judge_reserve(
            spent, clock.left(), options)))
        if options.chain_shapes_share > 0:  # before the moves: they then take the cheapest, wherever it came from
            candidates += chain_candidates(problem, judge, candidates, Deadline(clock.at - judge_reserve(
                spent, clock.left(), options)).share(options.chain_shapes_share))
        candidates += moved_candidates(problem, judge, candidates, Deadline(clock.at - judge_reserve(
            spent, clock.left(), options)))
    said = []
    for cand in sorted(candidates, key=lambda j: j.cost):
        passed, pass_note = final_shapes(problem, judge, cand, clock, spent, options)
        notes = []  # what the report says if this candidate is returned
        if overdue:
            notes.append(f"the time limit ran out before the MIP found a plan meeting every limit ({solver.name}: "
                         f"{outcome.status.text}); the {passed.name} packer's plan, judged after the time limit, "
                         "is returned")
        elif passed.name != "mip":
            notes.append(f"the {passed.name} plan is cheaper under the exact cost model than the MIP's and is "
                         "returned (the MIP searched a coarsened or time-limited space)" if mip_ok else
                         f"the MIP found no plan meeting every limit ({solver.name}: {outcome.status.text}); the "
                         f"{passed.name} plan is returned")
        if attempt:
            notes.append(f"repaired: re-solved {attempt} time(s) with limits tightened by what the exact "
                         "evaluation found the model had missed")
        notes += cand.notes
        if pass_note:
            notes.append(pass_note)
        said.append(replace(passed, notes=tuple(notes)))
    # the backend asked for, whichever candidate won (the notes say when it is not the MIP's plan): the last
    # search's own record may name the LP backend column generation used instead
    start_cost = (start.name, judged_greedy.cost) if judged_greedy is not None and judged_greedy.acceptable else None
    on_shapes = None
    if options.on_shapes_share > 0 and first.bound is not None:
        on_shapes = on_shapes_bound(problem, min(said, key=lambda j: j.cost).batchings,
                                    clock.share(options.on_shapes_share))
    # the search beside the planner, waited for a little while it could still close the gap, then stopped
    cheapest = min(j.cost for j in said)
    bound, bound_by, bound_open = raised(
        first.bound, first.bound_by, first.beside, first.bound_open,
        Deadline(clock.at - options.solver_stop_s).within(options.beside_wait_s), cheapest * (1 - options.target_gap))
    chosen, report = select(Candidates(tuple(said), bound, solver.name, solver.version(), t0, clock,
                                       outcome.status, first.bucket_bounds, tuple(first.notes),
                                       bound_by=bound_by, stalled=outcome.stalled, start=start_cost,
                                       on_shapes=on_shapes, bound_open=bound_open))
    return Planned(chosen.batchings, report, chosen.plans, chosen.evaluation)


def no_plan(problem: Problem, judge: Judge, backend: str, first: SearchOutcome, last: SearchOutcome,
            judged: Judged | None, judged_greedy: Judged | None, tried: list[Judged], repairs: int,
            clock: Deadline) -> Exception:
    """Why no plan came out: InfeasibleError with a proof, else NoPlanFound saying what happened instead.

    With a single limit in the whole problem, that limit alone is what no plan met: the
    message names it, with the best value known (from every plan tried, and a search
    without it) -- proven unmeetable only when the failed search held the whole exact model.
    """
    proofs = unmeetable(problem, clock)
    if proofs:
        return InfeasibleError("the limits cannot all be met; " + "; ".join(proofs))
    single = single_limit(problem)
    known = {}
    if single is not None:
        b, metric, _ = single
        known = {j.name: j.evaluation.results[b].metrics.value(metric) for j in tried
                 if j.evaluation.results[b].metrics is not None}
    if first.proven_infeasible:
        proof = f"{backend} proved the whole exact model infeasible"
        if single is not None:
            return InfeasibleError("the limits cannot all be met; " + alone_message(problem, proof, known, clock,
                                                                                     judge))
        return InfeasibleError(explain_infeasible(problem, judge, clock, proof))
    if last.batchings is not None and judged is not None:
        broken = ", ".join(f"{problem.buckets[b].name} {m}" for b, m, _, _ in judged.broken)
        what = f"the MIP's plan still breaks {broken} under the exact evaluation after {repairs} repair(s)"
    elif last.status is Status.TIME_LIMIT_NO_SOLUTION or (last.status is Status.ERROR and clock.expired()):
        what = f"no plan found within the time limit ({backend}: {last.status.text})"
    elif last.status is Status.INFEASIBLE:
        what = (f"no plan found: the MIP over the boxes the search kept is infeasible ({backend}), which does not "
                "prove the limits unmeetable")
    else:
        what = f"no plan found ({backend}: {last.status.text}{f': {last.native}' if last.native else ''})"
    if single is not None:
        return NoPlanFound(f"{what}; {alone_message(problem, None, known, clock, judge)}; not proven infeasible")
    greedy = ("" if judged_greedy is None else "; the greedy packer's plan breaks "
              + ", ".join([f"{problem.buckets[b].name} {m}" for b, m, _, _ in judged_greedy.broken]
                          + [str(v) for r in judged_greedy.evaluation.results for v in r.violations]
                          + [str(v) for v in judged_greedy.evaluation.global_problems]))  # a graph cap is global
    return NoPlanFound(f"{what}{greedy}; not proven infeasible")
