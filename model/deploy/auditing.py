"""Audit a deployed shape set: the same traffic planned under today's shapes and under optimised ones.

A serving stack compiles a fixed list of sequence lengths (read from its config by
``model.serving.formats``).  ``audit`` plans the traffic twice with the same planner
and shape cap: once restricted to the config's shapes (``Problem.allowed_shapes``),
once with a free choice.  The difference is what re-choosing the shapes would save.

With a hold-out fraction the optimised shapes are chosen on the first part of the
traffic only (``model.deploy.holdout``) and both sides are judged on the held-out
part, so the saving is one a deployment could actually have had.

Beside the shapes each side counts its compiled graphs, the unit of warm-up: for a
stack's format, today's are what the config makes the stack compile by its rules
(``model.serving.formats``) and the optimised side's what its export would (exactly
its plans' graphs); for shapeplan's own list and json formats, which name no stack,
each side's are the graphs its plans run, one per distinct (batch size, shape) and
decode context.

Library code built on ``model.pipeline``; it parses nothing and prints nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from model import pipeline
from model.base.errors import InfeasibleError, InputError
from model.base.runtime import Deadline, RunBudget
from model.deploy.holdout import PLANNER_RUNS, Holdout, holdout
from model.domain.schema import Problem
from model.domain.shapeset import check_fits, checked
from model.serving.formats import planned
from model.serving.plan_use import shape_uses
from model.serving.spec import ExportSpec

NEUTRAL_FORMATS = ("list", "json")  # shapeplan's own formats: no stack to compile them


@dataclass(frozen=True)
class Side:
    """One side of the audit, totalled over buckets (None where a bucket has no evaluated plan)."""

    label: str
    cost: float | None
    pad_ratio: float | None
    p95_latency_ms: float | None  # the worst bucket's
    sequential_ms: float | None
    shapes: tuple[int, ...]
    ok: bool
    graphs: int | None = None  # the graphs this side compiles (None: not countable)

    @classmethod
    def of(cls, label: str, run: pipeline.Run, graphs: int | None = None) -> Side:
        metrics = [r.metrics for r in run.evaluation.results]
        if any(m is None for m in metrics):
            return cls(label, None, None, None, None, (), False, graphs)
        real = sum(m.real_tokens for m in metrics)
        return cls(label, sum(m.cost for m in metrics), sum(m.pad_tokens for m in metrics) / real if real else 0.0,
                   max(m.p95_latency_ms for m in metrics), sum(m.sequential_ms for m in metrics),
                   tuple(sorted({int(s) for m in metrics for s in m.shapes})), run.evaluation.ok, graphs)

    @property
    def n_shapes(self) -> int:
        return len(self.shapes)


@dataclass(frozen=True, eq=False)
class AuditResult:
    """Today's shapes against optimised ones on the same requests, same planner, same shape cap."""

    problem: Problem  # the requests both sides were judged on (the held-out part with a hold-out)
    config: tuple[int, ...]  # today's shapes, as the config compiles them
    k: int
    solver: str
    today: pipeline.Run
    optimised: pipeline.Run
    holdout: Holdout | None = None
    fmt: str = "list"  # the config's format: the graphs are counted in its stack's notation
    config_graphs: int | None = None  # the graphs the config makes its stack compile (None: not counted)

    @property
    def sides(self) -> tuple[Side, Side]:
        chosen = "shapes chosen on the first part" if self.holdout is not None else "optimised shapes"
        neutral = self.fmt in NEUTRAL_FORMATS
        today = self.run_graphs(self.today) if neutral else self.config_graphs
        return Side.of("today's shapes", self.today, today), Side.of(chosen, self.optimised,
                                                                     self.run_graphs(self.optimised))

    def run_graphs(self, run: pipeline.Run) -> int | None:
        """The graphs a run's plans run, in the config's notation (json's for the neutral formats)."""
        if not run.evaluation.ok or len(run.plans) != len(self.problem.buckets):
            return None
        try:
            cost = pipeline.planned_problem(self.problem, run.planned).cost  # auto: the buckets this side chose
            uses = shape_uses(run.plans, self.problem.buckets, cost.batch_buckets if cost.device_time else None)
        except InputError:  # a plan that does not cover its requests has no graphs to count
            return None
        return len(planned("json" if self.fmt in NEUTRAL_FORMATS else self.fmt, ExportSpec(uses)))

    @property
    def compile_ms(self) -> float | None:
        """Device mode's compile time per graph (the warm-up estimate), else None."""
        return self.problem.cost.params.compile_ms if self.device else None

    @property
    def saving(self) -> float | None:
        """Today's cost minus the optimised cost (positive: optimising saves)."""
        today, opt = self.sides
        return today.cost - opt.cost if today.cost is not None and opt.cost is not None else None

    @property
    def saving_share(self) -> float | None:
        """The saving as a share of today's cost."""
        today, _ = self.sides
        return self.saving / today.cost if self.saving is not None and today.cost else None

    @property
    def device(self) -> bool:
        """Costs are device milliseconds, so device-hours are worth showing."""
        return self.problem.cost.device_time

    @property
    def ok(self) -> bool:
        return self.today.evaluation.ok and self.optimised.evaluation.ok and (
            self.holdout is None or self.holdout.ok)


def audit(problem: Problem, allowed: tuple[int, ...], k: int | None = None, solver: str = pipeline.MIP,
          backend: str = "highs", time_limit: float = 60.0, holdout_fraction: float | None = None,
          fmt: str = "list", config_graphs: int | None = None) -> AuditResult:
    """Plan ``problem`` under today's shapes ``allowed`` and under a free choice, both with at most ``k`` shapes
    (default: as many as today's config has).  ``fmt`` and ``config_graphs`` (the config's format and the
    graphs it makes its stack compile) let the result count both sides' graphs alike.

    An InputError if today's largest shape is shorter than some prompt (naming it);
    an InfeasibleError if either side cannot meet the limits.
    """
    config = checked(allowed, "--shapes-from")
    k = len(config) if k is None else k
    base = replace(problem, max_shapes=k, allowed_shapes=None)
    today_problem = replace(base, allowed_shapes=config)
    check_fits(today_problem)
    # one deadline for the whole audit: each planner run gets its share of what is left (it was the whole
    # limit each, so --time-limit 60 took two minutes)
    budget = RunBudget(Deadline.after(time_limit), 2 if holdout_fraction is None else PLANNER_RUNS + 1)
    if holdout_fraction is None:
        today = pipeline.run(today_problem, solver, backend, budget.next_limit())
        optimised = pipeline.run(base, solver, backend, budget.next_limit())
        return AuditResult(base, config, k, solver, today, optimised, None, fmt, config_graphs)
    check, _ = holdout(base, holdout_fraction, solver, backend, time_limit, budget)
    if check.fixed is None or check.compared is None:
        raise InfeasibleError("hold-out: the shapes chosen on the first part cannot plan the held-out part: "
                              + "; ".join(check.messages))
    today = pipeline.run(replace(check.compared, allowed_shapes=config), solver, backend, budget.next_limit())
    return AuditResult(check.compared, config, k, solver, today, check.fixed, check, fmt, config_graphs)
