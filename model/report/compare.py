"""Every heuristic packer beside the chosen planner, on the same problem and by the same evaluator.

A plan's cost means little alone; beside the rules serving stacks use today it
shows what the planner buys.  Packers run through the same pipeline as the chosen
planner (``pipeline.compare_run``), so the numbers are directly comparable, and a
packer that cannot plan says why instead of a row.
"""

from __future__ import annotations

from model.domain.schema import BucketResult, Evaluation, Violation
from model.report.tables import fmt

HEADER = f"  {'planner':<18}{'cost':>12}{'ratio':>8}{'pad':>8}{'p95 ms':>12}{'seq ms':>12}  limits met"
UNITS = "cost in the cost model's unit (device-ms in device mode), pad = pad/real tokens"


def failures(result: BucketResult, global_problems: list[Violation]) -> list[str]:
    """Names of the limits a bucket's plan breaks, then the rules it breaks (cross-bucket ones too)."""
    return ([c.metric for c in result.checks if not c.ok]
            + [v.rule for v in (*result.violations, *global_problems)])


def row(label: str, result: BucketResult, global_problems: list[Violation], reference_cost: float | None) -> str:
    """One table line: cost, its ratio to the chosen plan, pad, P95, sequential time, limits met."""
    m = result.metrics
    if m is None:
        return f"  {label:<18}invalid: {', '.join(failures(result, global_problems))}"
    ratio = f"{m.cost / reference_cost:.3f}" if reference_cost else "-"
    failed = failures(result, global_problems)
    met = f"NO ({', '.join(failed)})" if failed else "yes"
    return (f"  {label:<18}{fmt(m.cost):>12}{ratio:>8}{m.pad_ratio:>8.4f}"
            f"{fmt(m.p95_latency_ms):>12}{fmt(m.sequential_ms):>12}  {met}")


def compare_table(results: tuple[BucketResult, ...], chosen_solver_name: str,
                  others: dict[str, Evaluation | str]) -> str:
    """Per bucket, the chosen planner's plan and every other planner's, cost ratios to the chosen one.

    ``others`` maps a planner to its evaluation, or to the reason it cannot plan.
    """
    lines = []
    for i, chosen in enumerate(results):
        reference = chosen.metrics.cost if chosen.metrics else None
        lines += [f"comparison, bucket {chosen.name} (ratio = cost / cost of {chosen_solver_name}; {UNITS})", HEADER,
                  row(f"{chosen_solver_name} (chosen)", chosen, [], reference)]
        for name, outcome in others.items():
            if isinstance(outcome, str):
                lines.append(f"  {name:<18}cannot plan: {outcome}")
            else:
                lines.append(row(name, outcome.results[i], list(outcome.global_problems), reference))
    return "\n".join(lines)
