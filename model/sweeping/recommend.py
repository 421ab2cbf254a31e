"""What to compile: the smallest K near the cheapest, and what it saves over the rule a stack uses (pow2)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from model.sweeping.grid import SweepPoint, base_factor
from model.sweeping.runner import MIP, SweepRow
from model.sweeping.table import PlannerTotal, planner_totals

STACK_RULE = "pow2"  # the power-of-two buckets Neuron and JetStream compile by default: what a stack runs today


@dataclass(frozen=True)
class Recommendation:
    """What to compile: the chosen point and planner, its cost, and what it saves over the packers.

    ``k`` is the smallest shape cap whose cost is within ``tolerance`` of the
    cheapest K in the sweep: more shapes than that buy less than the tolerance.
    ``largest_k`` is the largest K the planner met the limits at, so the report can
    say when the answer sits at the edge of the sweep.
    ``rule`` is the cheapest packer meeting every limit at any K of the sweep (the
    best a fixed rule can do if its K is tuned too); ``same_k_rule`` the cheapest at
    the recommended K.
    """

    planner: str | None
    point: SweepPoint | None
    cost: float | None
    bound: float | None
    gap: float | None
    shapes: tuple[int, ...]
    cheapest_k: int | None
    cheapest_cost: float | None
    largest_k: int | None
    tolerance: float
    rule: PlannerTotal | None
    same_k_rule: PlannerTotal | None
    stack_rule: PlannerTotal | None = None  # pow2 (a stack's default rule) at the recommended K, limits met or not
    stack_rule_best: PlannerTotal | None = None  # pow2 at its cheapest K meeting every limit

    @property
    def stack_savings(self) -> float | None:
        """1 - cost / cost of the stack's default rule (pow2) at the same K."""
        return _saving(self.cost, self.stack_rule)

    @property
    def savings(self) -> float | None:
        """1 - cost / cost of the best fixed rule at any K."""
        return _saving(self.cost, self.rule)

    @property
    def same_k_savings(self) -> float | None:
        """1 - cost / cost of the best fixed rule at the same K."""
        return _saving(self.cost, self.same_k_rule)


def _saving(cost: float | None, rule: PlannerTotal | None) -> float | None:
    """1 - cost / the rule's cost; 0 when both cost nothing (all-zero coefficients), None when unknown."""
    if rule is None or cost is None or rule.cost is None:
        return None
    if rule.cost == 0:
        return 0.0 if cost == 0 else None
    return 1 - cost / rule.cost


def recommend(rows: Sequence[SweepRow], tolerance: float = 0.005) -> Recommendation:
    """Pick K at the base limits: the MIP if it ran (else the cheapest planner), smallest K near the cheapest."""
    totals = planner_totals(rows)
    factor = base_factor(t.point for t in totals)
    at_base = [t for t in totals if t.point.factor == factor and t.limits_met and t.cost is not None]
    planners = {t.planner for t in at_base}
    chosen = MIP if MIP in planners else min(at_base, key=lambda t: t.cost).planner if at_base else None
    mine = sorted((t for t in at_base if t.planner == chosen), key=lambda t: t.point.k)
    if not mine:
        return Recommendation(None, None, None, None, None, (), None, None, None, tolerance, None, None)
    cheapest = min(mine, key=lambda t: (t.cost, t.point.k))
    pick = next(t for t in mine if t.cost <= cheapest.cost * (1 + tolerance))
    rules = [t for t in at_base if t.planner != chosen]
    rule = min(rules, key=lambda t: (t.cost, t.point.k), default=None)
    same = min((t for t in rules if t.point.k == pick.point.k), key=lambda t: t.cost, default=None)
    stack = next((t for t in totals if t.planner == STACK_RULE and t.point == pick.point), None)
    stack_best = min((t for t in rules if t.planner == STACK_RULE), key=lambda t: (t.cost, t.point.k), default=None)
    return Recommendation(chosen, pick.point, pick.cost, pick.bound, pick.gap, pick.shapes, cheapest.point.k,
                          cheapest.cost, mine[-1].point.k, tolerance, rule, same, stack, stack_best)
