"""Each command's closing summary (``model.report.summary.Summary``) built from what the command computed.

One builder per command: solve, evaluate, the hold-out check, audit, sweep, export, replay,
calibrate.  The reference is always a rule a serving stack uses or today's config: the pow2
rule (the power-of-two prompt buckets Neuron and JetStream compile by default) at the same
shape cap, or the config the audit read -- never shapeplan's own packers, which no stack
runs.  ``inputs`` is the command line's input part as words (the request files or scenario
and the cost-model flags), so the next command can be printed ready to run.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from model.cost.common import align
from model.cost.model import CostModel
from model.deploy.holdout import Holdout
from model.domain.schema import OPTIMAL_GAP, BucketResult, Evaluation, Problem, SolveReport
from model.report.summary import (
    REF_STACK_RULE,
    REF_TODAY,
    Certainty,
    Reference,
    Summary,
    certainty_of,
    cost_of,
    device_cost,
    reference_of,
)
from model.report.tables import fmt

STACK_RULE = "pow2"
STACK_RULE_TEXT = "the pow2 rule (power-of-two prompt buckets, what Neuron and JetStream compile by default)"


def command_line(module: str, *words: str | object) -> str:
    """A runnable command line: ``python -m model.X`` and the words, each quoted for the shell."""
    return shlex.join(["python", "-m", f"model.{module}", *(str(w) for w in words)])


def used_shapes(results: Sequence[BucketResult]) -> tuple[int, ...]:
    """Every shape the plans run, across buckets, sorted."""
    return tuple(sorted({int(s) for r in results if r.metrics for s in r.metrics.shapes}))


def total_cost(results: Sequence[BucketResult]) -> float | None:
    """The plans' total cost (None when a bucket has no evaluated plan)."""
    if any(r.metrics is None for r in results):
        return None
    return float(sum(r.metrics.cost for r in results))


def chosen_text(shapes: Sequence[int], k: int | None, problem: Problem) -> str:
    """'3 shapes (320, 1024, 2048) of K = 8 allowed, for 2 buckets (1600 requests)'."""
    n = sum(len(b) for b in problem.buckets)
    cap = f" of K = {k} allowed" if k is not None else ""
    return (f"{len(shapes)} shape{'s' if len(shapes) != 1 else ''} ({', '.join(map(str, shapes)) or 'none'})"
            f"{cap}, for {len(problem.buckets)} bucket{'s' if len(problem.buckets) != 1 else ''} ({n} requests)")


def distinct_prompt_lengths(problem: Problem) -> int:
    """Distinct aligned prompt lengths over all buckets: no plan gains from more shapes than these."""
    return int(len(np.unique(np.concatenate([align(b.prompt_len) for b in problem.buckets]))))


def fewer_shapes_reason(problem: Problem, shapes: Sequence[int], proven: bool) -> str | None:
    """Why the plans use fewer shapes than the cap allows (None when they use all of them)."""
    k, used = problem.max_shapes, len(shapes)
    if used >= k:
        return None
    head = f"{used} of the {k} allowed: "
    if problem.allowed_shapes is not None and len(problem.allowed_shapes) <= used:
        return head + f"only {len(problem.allowed_shapes)} shapes are allowed (--shapes / --shapes-from)"
    if not problem.cost.pads_to_shape:
        return head + (f"in the {problem.cost.name} mode a request costs the same at whatever shape it is declared "
                       "at (a batch runs at its longest member); only the compile charge grows with the shapes, so "
                       "more shapes never pay")
    distinct = distinct_prompt_lengths(problem)
    if distinct <= used:
        return head + f"the requests have only {distinct} distinct aligned prompt lengths, each with its own shape"
    charge = float(np.asarray(problem.cost.shape_charge(np.asarray([max(shapes or (64,))]))).ravel()[0])
    why = (f"each compiled shape adds its compile charge ({fmt(charge)} {unit_word(problem.cost)} for each bucket "
           "that runs it) to the cost, so a shape is added only where it saves more than that"
           if charge > 0 else "more shapes did not lower the cost")
    tail = ("; the plan is proven optimal, so no plan with more shapes is cheaper under these limits" if proven else
            "; not proven: with the gap above, a plan with more shapes might still be cheaper")
    return head + why + tail


def unit_word(cost: CostModel) -> str:
    return "device-ms" if cost.device_time else "cost units"


def stack_reference(problem: Problem, chosen: float | None, pow2: Evaluation | str | None) -> Reference | None:
    """pow2 at the same shape cap as the reference (its Evaluation, or why it could not plan)."""
    if pow2 is None:
        return None
    name = f"{STACK_RULE_TEXT} at the same K = {problem.max_shapes}"
    if isinstance(pow2, str):
        return reference_of(REF_STACK_RULE, name, None, chosen, problem.cost, None, f"cannot plan: {pow2}")
    return reference_of(REF_STACK_RULE, name, total_cost(pow2.results), chosen, problem.cost, pow2.ok)


def plan_next(ok: bool, out: str | None, inputs: Sequence[str], scenario: str | None, requests: Sequence[str]) -> str:
    """After a plan: export its graphs for a stack (with the requests, for the decode graphs), or what to loosen."""
    if not ok:
        return ("loosen the limit the FAIL line names (or raise --time-limit), then run again: "
                + command_line("solve", *inputs, "--out", out or "out"))
    given = ["--scenario", scenario] if scenario is not None else ["--requests", *requests]
    return command_line("export", "--plans", out or "out", "--format", "gaudi-file", "--out", "buckets.txt", *given)


def solve_summary(problem: Problem, results: Sequence[BucketResult], ok: bool, report: SolveReport, solver: str,
                  inputs: Sequence[str], out: str | None, scenario: str | None, requests: Sequence[str],
                  pow2: Evaluation | str | None) -> Summary:
    """model.solve: the shapes chosen, their cost, pow2 at the same K, the gap, why fewer shapes, the export."""
    shapes = used_shapes(results)
    total = total_cost(results)
    certainty = certainty_of(report, solver)
    proven = certainty.status == "optimal"
    return Summary("solve", chosen_text(shapes, problem.max_shapes, problem), ok,
                   None if total is None else cost_of(total, problem.cost),
                   stack_reference(problem, total, pow2), certainty, shapes, problem.max_shapes,
                   fewer_shapes_reason(problem, shapes, proven), plan_next(ok, out, inputs, scenario, requests))


def evaluate_summary(problem: Problem, results: Sequence[BucketResult], ok: bool, plan_files: Sequence[str],
                     inputs: Sequence[str], pow2: Evaluation | str | None) -> Summary:
    """model.evaluate: the plans judged, their cost, pow2 at the same K; an evaluation proves no bound."""
    shapes = used_shapes(results)
    total = total_cost(results)
    certainty = Certainty("evaluation", plan_by=", ".join(plan_files),
                          detail="the given plans judged exactly by the one cost model; an evaluation proves no "
                                 "bound: model.solve on the same input says how far from the best they are")
    nxt = command_line("solve", *inputs, "--limit-shapes", problem.max_shapes, "--out", "out")
    return Summary("evaluate", f"the plans in {', '.join(plan_files)}: " + chosen_text(shapes, problem.max_shapes,
                                                                                        problem), ok,
                   None if total is None else cost_of(total, problem.cost), stack_reference(problem, total, pow2),
                   certainty, shapes, problem.max_shapes, None, nxt)


def holdout_summary(check, inputs: Sequence[str], out: str | None) -> Summary:
    """solve --holdout: the shapes chosen on the first part, judged on the held-out part against pow2 there."""
    problem = check.compared if check.compared is not None else check.split.test
    fixed = Holdout.cost(check.fixed)
    pow2 = Holdout.cost(check.pow2)
    ref = reference_of(REF_STACK_RULE, f"{STACK_RULE_TEXT} on the held-out part, same K = {check.k}", pow2, fixed,
                       problem.cost,
                       None if check.pow2 is None else check.pow2.evaluation.ok,
                       "" if pow2 is not None else "no pow2 plan")
    if check.loss is None:
        detail = "no comparison could be made (see the notes)"
    else:
        detail = (f"out of sample the chosen shapes cost {check.loss:+.2%} against the held-out part's own optimum"
                  + (f" (at most {check.loss_vs_bound:+.2%} against its certified lower bound)"
                     if check.loss_vs_bound is not None else ""))
    return Summary("holdout", f"the shapes chosen on the first part ({', '.join(map(str, check.shapes))}), "
                   f"checked on the held-out part ({check.split.describe()})", check.ok,
                   None if fixed is None else cost_of(fixed, problem.cost), ref,
                   Certainty("holdout", plan_by=f"the {check.solver} planner on the first part", detail=detail),
                   tuple(check.shapes), check.k, None,
                   "the shapes hold up out of sample: plan the whole traffic and write the plans: "
                   + command_line("solve", *inputs, "--limit-shapes", check.k, "--out", out or "out")
                   if check.ok else "the held-out part breaks a limit: look at the notes above, loosen the "
                   "limit or widen K, and run the check again")


def audit_summary(result, inputs: Sequence[str], config: str) -> Summary:
    """model.audit: the optimised shapes against today's config (the reference), the gap of the optimised run."""
    today, opt = result.sides
    cost = result.problem.cost
    ref = reference_of(REF_TODAY, f"today's config ({config}: {len(result.config)} shapes)", today.cost, opt.cost,
                       cost,
                       today.ok)
    nxt = command_line("solve", *inputs, "--limit-shapes", result.k, "--out", "out") + \
        " (then model.export writes the shapes for the stack)"
    if result.holdout is not None:  # the optimised shapes were chosen on the first part, judged on the rest
        h = result.holdout
        certainty = Certainty("holdout", plan_by=f"the {result.solver} planner on the first part",
                              detail="both sides judged on the held-out part" + (
                                  f"; the chosen shapes cost {h.loss:+.2%} against that part's own optimum"
                                  if h.loss is not None else ""))
        fewer = None
    else:
        certainty = certainty_of(result.optimised.planned.report, result.solver)
        fewer = fewer_shapes_reason(result.problem, opt.shapes, certainty.status == "optimal") \
            if opt.cost is not None else None
    return Summary("audit", f"{opt.label}: " + chosen_text(opt.shapes, result.k, result.problem), result.ok,
                   None if opt.cost is None else cost_of(opt.cost, cost), ref, certainty, opt.shapes, result.k,
                   fewer, nxt)


def sweep_summary(rec, stack_rule, problem: Problem, inputs: Sequence[str], status: str | None = None) -> Summary:
    """model.sweep: the recommended K, its cost, pow2 at the same K, the gap there, the solve to run."""
    if rec.point is None:
        return Summary("sweep", "no K of the sweep: no planner met every limit", False,
                       next_command="loosen a limit or widen --k, and sweep again")
    cost = problem.cost
    ref = None
    if stack_rule is not None:
        ref = reference_of(REF_STACK_RULE, f"{STACK_RULE_TEXT} at the same K = {rec.point.k}", stack_rule.cost,
                           rec.cost, cost,
                           stack_rule.limits_met, "" if stack_rule.cost is not None else stack_rule.status)
    if rec.bound is not None and rec.gap is not None:
        certainty = Certainty("bound", status or ("optimal" if rec.gap <= OPTIMAL_GAP else "feasible"), rec.gap,
                              rec.bound,
                              f"the {rec.planner} planner at K = {rec.point.k}", f"the {rec.planner} planner's "
                              "certified relaxations")
    else:
        certainty = Certainty("heuristic", None, None, None, f"the {rec.planner} packer")
    fewer = (f"K = {rec.point.k} is the smallest cap within {rec.tolerance:.1%} of the cheapest swept (K = "
             f"{rec.cheapest_k}); more shapes buy less than that" if rec.cheapest_k != rec.point.k else None)
    if len(rec.shapes) < rec.point.k:
        why = fewer_shapes_reason(replace(problem, max_shapes=rec.point.k), rec.shapes, certainty.status == "optimal")
        fewer = "; ".join(w for w in (fewer, why) if w)
    return Summary("sweep", f"K = {rec.point.k} shapes ({', '.join(map(str, rec.shapes))}) with the {rec.planner} "
                   "plan", True, cost_of(rec.cost, cost), ref, certainty, tuple(rec.shapes), rec.point.k, fewer,
                   command_line("solve", *inputs, "--limit-shapes", rec.point.k, "--out", "out"))


def export_summary(out: str, fmt_name: str, shapes: Sequence[int], n_graphs: int, compile_ms: float | None,
                   stack: bool) -> Summary:
    """model.export: the graphs written, their warm-up (device-hours of compile per replica), the check to run."""
    warm = None if compile_ms is None else device_cost(n_graphs * compile_ms, None)
    certainty = Certainty("evaluation", plan_by=out, detail="the file holds exactly the graphs the plans run"
                          + ("" if compile_ms is not None else "; give --device-profile for the warm-up time"))
    nxt = command_line("export", "--check", out, "--format", fmt_name) + " (lists what the stack compiles from it)" \
        if stack else "read the file into your serving config"
    return Summary("export", f"{n_graphs} graphs over {len(shapes)} shapes ({', '.join(map(str, shapes))}) in "
                   f"{out} ({fmt_name}); cost below is the warm-up: compiling them once per replica", True, warm,
                   None, certainty, tuple(shapes), None, None, nxt)


def replay_summary(s, inputs: Sequence[str]) -> Summary:
    """model.replay: the replicas and graphs replayed, busy device time (and money), the SLO and what to try next."""
    busy = device_cost(s.busy_ms, s.cost_per_device_hour)
    slo = s.slo
    missed = slo is not None and (slo.ttft_met is False or slo.tpot_met is False)
    detail = ("a replay of the trace through the stack's scheduler model: exact for that model, no optimisation and "
              "no bound" + ("" if slo is None else f"; goodput {100 * slo.goodput:.2f}% of requests within the SLO, "
                            f"which is {'MISSED' if missed else 'met'}"))
    nxt = (command_line("replay", *inputs, "--replicas", 2 * s.replicas) + " (the SLO is missed: try more replicas)"
           if missed else command_line("replay", *inputs, "--replicas", max(1, s.replicas // 2)) +
           " (fewer replicas, to find the least that meets the SLO)" if slo is not None and s.replicas > 1 else
           "give --slo-ttft-ms and --slo-tpot-ms to judge the replay against objectives")
    return Summary("replay", f"{s.replicas} replica{'s' if s.replicas != 1 else ''} serving {s.requests} requests "
                   f"on {s.graphs} graphs each ({s.stack})", not missed, busy, None,
                   Certainty("simulation", detail=detail), None, None, None, nxt)


def calibrate_summary(cal, out: str) -> Summary:
    """model.calibrate: the fitted profile, how well each phase fits, and the solve that uses it."""
    worst = max(cal.fits, key=lambda f: f.max_rel_error)
    detail = ("least-squares fit of the measured step times: "
              + ", ".join(f"{f.phase} R^2 {f.r2:.4f} over {f.rows} rows, max error {100 * f.max_rel_error:.1f}%"
                          for f in cal.fits)
              + f"; the worst row is {100 * worst.max_rel_error:.1f}% off ({worst.phase})")
    return Summary("calibrate", f"a device profile for {cal.profile.name!r} in {out}", True, None, None,
                   Certainty("fit", detail=detail), None, None, None,
                   command_line("solve", "REQUESTS.jsonl", "--device-profile", out, "--out", "out")
                   + " (REQUESTS: your request log)")


def capacity_text(searches) -> str:
    """'rate 1x: 4 replicas (proved the fewest); rate 2x: none up to 64' for a capacity search's results."""
    parts = []
    for s in searches:
        if s.replicas is None:
            parts.append(f"rate {s.rate_scale:g}x: none up to {s.cap}")
        else:
            parts.append(f"rate {s.rate_scale:g}x: {s.replicas} replica{'s' if s.replicas != 1 else ''} "
                         f"({'proved the fewest' if s.proved else 'the fewest found; one fewer fails'})")
    return "; ".join(parts)


def capacity_summary(searches, graphs_source: str, price: float | None, inputs: Sequence[str]) -> Summary:
    """model.replay --replicas auto: the fewest replicas meeting the SLOs at each rate, what they are busy, how sure."""
    found = [s for s in searches if s.replicas is not None]
    first = found[0].chosen if found else None
    busy = None if first is None or first.busy_ms is None else device_cost(first.busy_ms, price)
    proved = all(s.proved for s in found) and len(found) == len(searches)
    detail = ("each count judged by replaying the whole trace through the stack's scheduler model; "
              + ("every answer is proved the fewest (every smaller count was replayed and failed)" if proved else
                 "an answer not marked proved is the fewest found (one fewer fails; a skipped smaller count might "
                 "pass, since meeting the SLOs need not be monotone)"))
    nxt = (command_line("replay", *inputs, "--replicas", found[-1].replicas, "--report", "replay")
           + " (the pictures at the largest answer)" if found else
           "no count meets the SLOs: loosen --slo-ttft-ms / --slo-tpot-ms, raise --max-replicas, or plan other graphs")
    return Summary("replay", f"replicas for the graphs of {graphs_source}: {capacity_text(searches)}", bool(found) and
                   len(found) == len(searches), busy, None, Certainty("simulation", detail=detail), None, None, None,
                   nxt)


def serving_audit_summary(audit, inputs: Sequence[str]) -> Summary:
    """model.audit --cost-model serving: the planned graphs (or today's alone) replayed, against today's config."""
    today = audit.sides[0]
    chosen = audit.sides[-1]
    price = chosen.summary.cost_per_device_hour
    ref = None
    if len(audit.sides) > 1:
        ref = reference_of(REF_TODAY, f"today's config ({today.source}: {today.summary.graphs} graphs)",
                           today.summary.busy_ms, chosen.summary.busy_ms, None, None)
        ref = replace(ref, cost=device_cost(today.summary.busy_ms, price))
    missed = [d.label for d in audit.sides if d.summary.slo is not None and
              (d.summary.slo.ttft_met is False or d.summary.slo.tpot_met is False)]
    detail = ("a replay of the trace through the stack's scheduler model on each side, same replicas and rate: exact "
              "for that model, no optimisation and no bound" + (f"; the SLO is MISSED by {', '.join(missed)}"
                                                                 if missed else ""))
    if audit.auto:
        detail += "; replicas: " + "; ".join(f"{d.label}: {capacity_text(d.capacity)}" for d in audit.sides)
    nxt = ("plan graphs for this traffic and export them, then audit them beside today's with --graphs: "
           + command_line("solve", "REQUESTS", "--device-profile", "PROFILE.toml", "--out", "out")
           if len(audit.sides) == 1 else
           command_line("replay", *inputs, "--report", "replay") + " (the planned graphs' pictures)")
    return Summary("audit", f"{chosen.label} ({chosen.source}): {chosen.summary.graphs} graphs, "
                   f"{audit.replicas} replica{'s' if audit.replicas != 1 else ''} at rate {audit.rate_scale:g}x",
                   not missed, device_cost(chosen.summary.busy_ms, price), ref, Certainty("simulation", detail=detail),
                   None, None, None, nxt)


def serving_plan_summary(best, requests: int, certificate: str, next_command: str) -> Summary:
    """model.solve --cost-model serving: the graph set chosen, the replay's busy device time (and money), what the
    MIP's gap certifies (the recorded demands only) and the command that compares it with today's config."""
    s, g = best.summary, best.graphs
    busy = device_cost(s.busy_ms, s.cost_per_device_hour)
    compiles = len(s.runtime_compiles)
    detail = (f"the reported numbers are a replay of the chosen set ({compiles} run-time compile"
              f"{'' if compiles == 1 else 's'}): exact for the scheduler model, not an optimum; {certificate}")
    return Summary("solve", f"{g.count} graphs for {g.stack} serving {requests} requests", True, busy, None,
                   Certainty("simulation", detail=detail), None, None, None, next_command)
