"""The MIP planner: histograms -> shapes -> column generation -> MIP -> batches, with a certified bound.

Flow (data one way):
  1. aggregate each bucket into (S, G) cells;
  2. settle the shapes: in reference mode they only move compile cost (one per bucket,
     exact DP); in strict mode an exact DP over a shape relaxation picks them and
     certifies a bound (``model.shapes``);
  3. column generation over the box grid (``model.colgen``): LP duals price every box,
     giving the boxes worth holding and a Lagrangian bound for the whole problem;
  4. MIP: first over the LP's support (seconds), then -- while the gap exceeds
     TARGET_GAP -- over every generated box that reduced costs cannot rule out,
     warm-started from the incumbent (``model.search``);
  5. expansion and exact re-evaluation with the one cost model: the cheaper of the MIP
     plan and the greedy packer's plan that meets every limit is returned; if the MIP
     plan breaks a limit the model thought it met (a compile spike it could not place
     harmlessly), the limit is tightened by the excess and the search repeated.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace

import numpy as np

from model.errors import InfeasibleError
from model.evaluation.validate import evaluate_plans
from model.expand.assemble import assemble_all
from model.histogram.cells import build_histogram
from model.planning.diagnose import explain_infeasible
from model.planning.flow import all_shapes, flow_search, shape_levels, shape_relaxation
from model.planning.options import PlannerOptions
from model.planning.runs import device_start
from model.planning.stages import greedy_plan, search, shape_setup, spike_reserves
from model.schema import Batching, Evaluation, Plan, Planned, Problem, SolveReport
from solvers.backends import get_backend

log = logging.getLogger("shapeplan")


@dataclass(frozen=True, eq=False)
class Judged:
    """A candidate plan expanded and judged exactly: its plans, their evaluation, the total cost
    and each broken limit (bucket, metric, value, limit)."""

    name: str
    batchings: tuple[Batching, ...]
    plans: tuple[Plan, ...]
    evaluation: Evaluation

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


def judge(problem: Problem, name: str, batchings: tuple[Batching, ...]) -> Judged:
    """Expand a candidate (spike placement included) and evaluate it with the one cost model."""
    plans = assemble_all(problem, batchings)
    results, global_problems = evaluate_plans(problem, plans)
    return Judged(name, batchings, plans, Evaluation(tuple(results), tuple(global_problems)))


def tightened(problem: Problem, reserves: tuple[int, ...], broken: tuple[tuple[int, str, float, float], ...],
              options: PlannerOptions = PlannerOptions()) -> tuple[Problem, tuple[int, ...]]:
    """Tighten what the exact evaluation found broken: one more P95 member held back for a spike,
    or the limit lowered by its excess (a spike's worth at least for sequential time)."""
    limits, reserves = list(problem.limits), list(reserves)
    for b, metric, value, limit in broken:
        if metric == "p95_latency_ms":
            reserves[b] += 1
            continue
        excess = value - limit
        if metric == "sequential_ms":
            excess = max(excess, problem.params.Tshape_compile_ms)
        limits[b] = limits[b].with_limit(metric, limits[b].get(metric) - options.repair_margin * excess)
    return replace(problem, limits=tuple(limits)), tuple(reserves)


def plan_mip(problem: Problem, backend: str = "highs", time_limit: float = 60.0,
             options: PlannerOptions = PlannerOptions()) -> Planned:
    """Plan every bucket by optimisation; the report carries a certified lower bound and its gap."""
    t0 = time.perf_counter()
    deadline = t0 + time_limit
    solver = get_backend(backend)
    fine = [build_histogram(b) for b in problem.buckets]
    flow = problem.mode == "device"
    setup = None if flow else shape_setup(problem, fine, options)
    greedy = greedy_plan(problem, options)
    if flow:
        starts = [np.asarray(shape_relaxation(problem, fine).shapes)]
        if greedy is not None:
            starts.append(np.unique(np.concatenate([bt.shape_of for bt in greedy])))
        greedy = device_start(problem, starts, all_shapes(problem, fine), shape_levels(problem, fine, options),
                              t0 + options.start_share * time_limit)
    first, mip_ok, attempt_problem = None, None, problem
    reserves = spike_reserves(problem, fine)
    for attempt in range(options.max_repairs + 1):
        if flow:
            outcome = flow_search(attempt_problem, fine, greedy, solver, deadline, reserves, options,
                                  want_bound=first is None)
        else:
            outcome = search(attempt_problem, fine, setup, greedy, solver, deadline, reserves, options)
        first = first or outcome  # its bound is for the original limits: the only one certified
        if outcome.batchings is None:
            break
        judged = judge(problem, "mip", outcome.batchings)
        if judged.acceptable:
            mip_ok = judged
            break
        if attempt == options.max_repairs or time.perf_counter() > deadline:
            break
        log.info("exact re-evaluation: the MIP plan breaks %s; tightening and solving again",
                 ", ".join(f"{problem.buckets[b].name} {m}" for b, m, _, _ in judged.broken))
        attempt_problem, reserves = tightened(attempt_problem, reserves, judged.broken, options)
    options_ = [mip_ok] if mip_ok else []
    if greedy is not None:
        judged_greedy = judge(problem, "dpfill+runs" if flow else "greedy", greedy)
        if judged_greedy.acceptable:
            options_.append(judged_greedy)
    if not options_:
        raise InfeasibleError(explain_infeasible(problem, deadline_s=max(10.0, 0.5 * time_limit)))
    chosen = min(options_, key=lambda j: j.cost)
    notes = list(first.notes)
    if chosen.name != "mip":
        notes.append(f"the {chosen.name} packer's plan is cheaper under the exact cost model than the MIP's and is "
                     "returned (the MIP searched a coarsened or time-limited space)")
    if attempt:
        notes.append(f"repaired: re-solved {attempt} time(s) with limits tightened by what the exact evaluation "
                     "found the model had missed")
    gap = (chosen.cost - first.bound) / chosen.cost if chosen.cost > 0 else 0.0
    status = "optimal" if gap <= 1e-4 else ("time_limit" if outcome.status == "time_limit" else "feasible")
    report = SolveReport(status, chosen.cost, first.bound, gap, time.perf_counter() - t0, outcome.backend,
                         outcome.version, first.bucket_bounds, tuple(notes))
    return Planned(chosen.batchings, report, chosen.plans, chosen.evaluation)
