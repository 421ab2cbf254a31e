"""The closing summary every command prints: what was chosen, what it costs, against what, how sure, what next.

A command's tables say everything; a person reading the end of the output needs six answers
first (issue 23): the choice, its cost in device-hours (and money when the profile has a
price), the reference it is measured against -- today's config or the rule a stack uses by
default, never shapeplan's own packer --, how sure the numbers are (the gap, what found the
plan, what proved the bound, in one sentence), why fewer shapes than allowed were used, and
the next command to run.  ``Summary`` holds those answers as data (tested as data, not as
text); ``summary_lines`` renders them for the terminal and ``summary_dict`` for ``--json``.
The builders that read runs, audits and sweeps live above the pipeline
(``model.deploy.summaries``); this module knows only numbers and words.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from model.cost.device import device_hours
from model.cost.model import CostModel
from model.report.tables import fmt

DEVICE_UNIT = "device-ms"
ANALYTIC_UNIT = "cost units"  # the reference and strict modes: a relative cost with no physical unit


@dataclass(frozen=True)
class Cost:
    """An amount of device time (or analytic cost) with its unit, device-hours and money where they exist."""

    value: float
    unit: str  # DEVICE_UNIT or ANALYTIC_UNIT
    device_hours: float | None = None
    money: float | None = None
    price_per_device_hour: float | None = None  # the profile's cost_per_device_hour

    def text(self) -> str:
        """'555,440.4 device-ms = 0.1543 device-hours = 0.79 at 5.12 per device-hour'."""
        out = f"{fmt(self.value)} {self.unit}"
        if self.device_hours is not None:
            out += f" = {self.device_hours:,.4g} device-hours"
        if self.money is not None:
            out += f" = {self.money:,.2f} at {self.price_per_device_hour:g} per device-hour (the profile's price)"
        return out


def cost_of(value: float, cost: CostModel | None) -> Cost:
    """``value`` in the unit of the cost model: device-ms with device-hours (and money) in device mode."""
    if cost is None or not cost.device_time:
        return Cost(float(value), ANALYTIC_UNIT)
    return device_cost(value, getattr(cost.params, "cost_per_device_hour", None))


def device_cost(ms: float, price: float | None) -> Cost:
    """Device milliseconds as a Cost, priced when a price per device-hour is known."""
    hours = float(device_hours(ms))
    return Cost(float(ms), DEVICE_UNIT, hours, None if price is None else hours * price, price)


@dataclass(frozen=True)
class Reference:
    """What the choice is measured against: today's config or a stack's default rule, at the same shape cap.

    ``saving`` is the reference's cost minus the chosen cost (positive: the choice is cheaper);
    ``note`` says what else a reader must know (the reference breaks a limit, cannot plan).
    """

    kind: str  # REF_STACK_RULE or REF_TODAY
    name: str
    cost: Cost | None
    saving: float | None = None
    saving_share: float | None = None
    meets_limits: bool | None = None
    note: str = ""

    def text(self) -> str:
        if self.cost is None:
            return f"{self.name}: {self.note or 'no plan'}"
        out = f"{self.name} costs {self.cost.text()}"
        if self.saving_share is not None:
            word = "less" if self.saving >= 0 else "more"
            out += f"; the choice costs {abs(self.saving_share):.1%} {word}"
        if self.meets_limits is False:
            out += " (the reference breaks a limit)"
        return out + (f"; {self.note}" if self.note else "")


REF_STACK_RULE = "stack_rule"  # a rule a serving stack compiles by default (pow2), at the same shape cap
REF_TODAY = "today"  # today's config, read from the stack's own file


def reference_of(kind: str, name: str, ref_value: float | None, chosen_value: float | None,
                 cost: CostModel | None, meets_limits: bool | None = None, note: str = "") -> Reference:
    """A Reference from two totals in the same unit (None: the reference has no plan, ``note`` says why)."""
    if ref_value is None:
        return Reference(kind, name, None, None, None, meets_limits, note)
    saving = share = None
    if chosen_value is not None:
        saving = ref_value - chosen_value
        share = saving / ref_value if ref_value else (0.0 if saving == 0 else None)
    return Reference(kind, name, cost_of(ref_value, cost), saving, share, meets_limits, note)


@dataclass(frozen=True)
class Certainty:
    """How sure the numbers are: the status, the gap to a certified lower bound, what gave the plan and the bound.

    ``kind``: "bound" (an optimiser with a certified bound), "heuristic" (a rule: nothing proven),
    "evaluation" (given plans judged exactly: nothing to prove), "fit" (a calibration's fit
    statistics), "simulation" (a replay: exact for its model, no optimisation).
    """

    kind: str
    status: str | None = None
    gap: float | None = None
    bound: float | None = None
    plan_by: str = ""
    bound_by: str | None = None
    detail: str = ""
    more_time: str | None = None  # the planner's own word on whether a longer run could help (SolveReport.more_time)
    on_shapes_gap: float | None = None  # how far the plan is from every plan on its own shapes (SolveReport.on_shapes)

    def sentence(self, unit: str = "") -> str:
        """The one sentence to read about how sure we are."""
        unit = f" {unit}" if unit else ""
        if self.kind == "bound" and self.gap is not None and self.bound is not None:
            if self.status == "optimal":
                text = (f"proven optimal (gap {self.gap:.2%}): the plan from {self.plan_by} meets the lower bound "
                        f"{fmt(self.bound)}{unit} from {self.bound_by or 'the solver'}")
            else:
                stop = "the search stopped at the time limit" if self.status == "time_limit" else \
                    "the search stopped before proving the plan optimal"
                text = (f"within {self.gap:.2%} of the best possible plan: the plan is from {self.plan_by}, the "
                        f"certified lower bound {fmt(self.bound)}{unit} from {self.bound_by or 'the solver'}; "
                        f"{stop}, so up to {self.gap:.2%} might still be saved ("
                        + (f"more time: {self.more_time}" if self.more_time else
                           "a longer --time-limit can narrow the gap") + ")")
                if self.on_shapes_gap is not None:
                    text += (f"; on its own shapes no plan is more than {self.on_shapes_gap:.2%} cheaper, so the rest "
                             "of the gap is the choice of shapes")
        elif self.kind == "heuristic":
            text = f"a heuristic plan from {self.plan_by}, with no lower bound: nothing is proven about how far " \
                   "it is from the best"
        else:
            text = self.detail or self.plan_by
        return text + (f"; {self.detail}" if self.detail and self.kind in ("bound", "heuristic") else "")


def report_sources(report, solver: str) -> tuple[str, str | None]:
    """What found the plan and what proved the bound, from a SolveReport's ``plan_by`` and ``bound_by`` (empty
    where the planner does not say: then the planner and backend, and its certified relaxations)."""
    plan_by = report.plan_by or None
    bound_by = report.bound_by or None
    planner = f"the {solver} planner ({report.backend} {report.version})" if solver == "mip" else \
        f"the {solver} packer"
    if bound_by is None and report.bound is not None:
        bound_by = f"the {solver} planner's certified relaxations"
    return plan_by or planner, bound_by


def certainty_of(report, solver: str) -> Certainty:
    """A SolveReport as a Certainty: a bound and gap when the planner proved one, else a heuristic."""
    plan_by, bound_by = report_sources(report, solver)
    if report.bound is None or report.gap is None or not math.isfinite(report.gap):
        return Certainty("heuristic", str(report.status.value), None, None, plan_by, None)
    on_shapes = getattr(report, "on_shapes", None)
    within = None
    if on_shapes is not None and report.objective and on_shapes > report.bound:
        within = max(0.0, (float(report.objective) - float(on_shapes)) / float(report.objective))
    return Certainty("bound", str(report.status.value), float(report.gap), float(report.bound), plan_by, bound_by,
                     more_time=report.more_time or None, on_shapes_gap=within)


@dataclass(frozen=True)
class Summary:
    """A command's closing answers (see the module docstring); None where a command has nothing to say."""

    command: str  # "solve", "evaluate", ...
    chosen: str
    ok: bool = True
    cost: Cost | None = None
    reference: Reference | None = None
    certainty: Certainty | None = None
    shapes: tuple[int, ...] | None = None
    shapes_allowed: int | None = None
    fewer_shapes: str | None = None  # why fewer shapes than allowed were used (None: all used, or no cap)
    next_command: str = ""


def summary_lines(s: Summary) -> list[str]:
    """The summary as the last lines a command prints."""
    unit = s.cost.unit if s.cost is not None else ""
    lines = ["summary", f"  chosen:      {s.chosen}"]
    if s.cost is not None:
        lines.append(f"  cost:        {s.cost.text()}")
    if s.reference is not None:
        lines.append(f"  against:     {s.reference.text()}")
    if s.certainty is not None:
        lines.append(f"  how sure:    {s.certainty.sentence(unit)}")
    if s.fewer_shapes:
        lines.append(f"  shapes:      {s.fewer_shapes}")
    if s.next_command:
        lines.append(f"  next:        {s.next_command}")
    return lines


def _plain(value):
    """A summary value as JSON: dataclasses as objects (field order kept), tuples as lists, floats finite or None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if hasattr(value, "__dataclass_fields__"):
        return {f.name: _plain(getattr(value, f.name)) for f in fields(value)}
    return value


def summary_dict(s: Summary) -> dict:
    """The summary as a JSON object (the keys of docs/json.md, "summary"), the certainty's sentence included."""
    doc = _plain(s)
    if s.certainty is not None:
        doc["certainty"]["sentence"] = s.certainty.sentence(s.cost.unit if s.cost is not None else "")
    return doc


SHIPPED_PROFILE = "data/profiles/opt13b-a100-tp1.toml"


def mode_note(cost: CostModel, from_scenario: bool, flag_given: bool) -> str:
    """Which cost model the run uses and why: request files without a cost-model flag are planned in the
    reference mode, whose costs have no unit (the embedded default scenario is in device mode), so say so."""
    if cost.device_time:
        return f"cost model: device (measured step times of {cost.params.name}): costs in device-ms"
    if from_scenario or flag_given:
        return f"cost model: {cost.name} (analytic): costs in cost units, not device time"
    return ("cost model: reference, the default for request files (analytic: costs in cost units, not device time; "
            f"the embedded default scenario uses device mode). Give --device-profile {SHIPPED_PROFILE} (or your "
            "own profile) to price shapes by measured step times in device-ms and device-hours")
