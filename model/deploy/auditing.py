"""Audit a deployed shape set: the same traffic planned under today's shapes and under optimised ones.

A serving stack compiles a fixed list of sequence lengths (read from its config by
``model.serving.formats``).  ``audit`` plans the traffic twice with the same planner
and shape cap: once restricted to the config's shapes (``Problem.allowed_shapes``),
once with a free choice.  The difference is what re-choosing the shapes would save.

With a hold-out fraction the optimised shapes are chosen on the first part of the
traffic only (``model.deploy.holdout``) and both sides are judged on the held-out
part, so the saving is one a deployment could actually have had.

Library code built on ``model.pipeline``; it parses nothing and prints nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from model import pipeline
from model.base.errors import InfeasibleError
from model.deploy.holdout import Holdout, holdout
from model.domain.schema import Problem
from model.domain.shapeset import check_fits, checked


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

    @classmethod
    def of(cls, label: str, run: pipeline.Run) -> Side:
        metrics = [r.metrics for r in run.evaluation.results]
        if any(m is None for m in metrics):
            return cls(label, None, None, None, None, (), False)
        real = sum(m.real_tokens for m in metrics)
        return cls(label, sum(m.cost for m in metrics), sum(m.pad_tokens for m in metrics) / real if real else 0.0,
                   max(m.p95_latency_ms for m in metrics), sum(m.sequential_ms for m in metrics),
                   tuple(sorted({int(s) for m in metrics for s in m.shapes})), run.evaluation.ok)

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

    @property
    def sides(self) -> tuple[Side, Side]:
        chosen = "shapes chosen on the first part" if self.holdout is not None else "optimised shapes"
        return Side.of("today's shapes", self.today), Side.of(chosen, self.optimised)

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
          backend: str = "highs", time_limit: float = 60.0, holdout_fraction: float | None = None) -> AuditResult:
    """Plan ``problem`` under today's shapes ``allowed`` and under a free choice, both with at most ``k`` shapes
    (default: as many as today's config has).

    An InputError if today's largest shape is shorter than some prompt (naming it);
    an InfeasibleError if either side cannot meet the limits.
    """
    config = checked(allowed, "--shapes-from")
    k = len(config) if k is None else k
    base = replace(problem, max_shapes=k, allowed_shapes=None)
    today_problem = replace(base, allowed_shapes=config)
    check_fits(today_problem)
    if holdout_fraction is None:
        today = pipeline.run(today_problem, solver, backend, time_limit)
        optimised = pipeline.run(base, solver, backend, time_limit)
        return AuditResult(base, config, k, solver, today, optimised)
    check, _ = holdout(base, holdout_fraction, solver, backend, time_limit)
    if check.fixed is None or check.compared is None:
        raise InfeasibleError("hold-out: the shapes chosen on the first part cannot plan the held-out part: "
                              + "; ".join(check.messages))
    today = pipeline.run(replace(check.compared, allowed_shapes=config), solver, backend, time_limit)
    return AuditResult(check.compared, config, k, solver, today, check.fixed, check)
