"""Audit in serving mode: today's compiled graphs (and, when given, planned ones) replayed on the same trace.

Each side is a graph set the stack would compile (today's read by today's rules,
``model.serving.replay_graphs``), replayed through the one scheduler and cost model
(``model.evaluation.replay_run``) under the same server settings, replica count and
rate: warm-up, run-time compiles, busy device time, latency quantiles, goodput.  With
the capacity search (``replicas`` None) each side also gets its fewest replicas at every
rate scale (``model.evaluation.capacity``), and the side-by-side replays run at the
larger of the sides' counts at the first rate scale, so both sides are compared at a
count that serves both (the cap when neither meets the SLOs).

Library code; it parses nothing and prints nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from model.cost.serving import ServingCost
from model.domain.server import GraphSet, ServerSettings
from model.evaluation.capacity import Search, capacity, scaled
from model.evaluation.replay_metrics import ReplaySummary, Slo, summarize
from model.evaluation.replay_run import ReplayResult, Trace, replay


@dataclass(frozen=True, eq=False)
class ServingSide:
    """One graph set, replayed; ``capacity`` holds its search's rows (None without ``--replicas auto``)."""

    label: str
    source: str
    graphs: GraphSet
    result: ReplayResult
    summary: ReplaySummary
    capacity: tuple[Search, ...] | None = None


@dataclass(frozen=True, eq=False)
class ServingAudit:
    """Every side on the same trace, settings, replicas and rate; ``sides[0]`` is today's."""

    requests: int
    settings: ServerSettings
    replicas: int
    rate_scale: float
    slo: Slo | None
    sides: tuple[ServingSide, ...]

    @property
    def auto(self) -> bool:
        return self.sides[0].capacity is not None

    @property
    def busy_saving(self) -> tuple[float, float] | None:
        """(today's busy ms - the planned side's, as a share of today's), with two sides."""
        if len(self.sides) < 2:
            return None
        today, planned = self.sides[0].summary.busy_ms, self.sides[1].summary.busy_ms
        return today - planned, (today - planned) / today if today else 0.0


def compared_count(searches: Sequence[tuple[Search, ...]]) -> int:
    """The replica count the side-by-side replays run at: the largest first-rate answer (the cap for a side
    without one), so that every side meets the SLOs there if it can at all."""
    return max(s[0].replicas if s[0].replicas is not None else s[0].cap for s in searches)


def serving_audit(trace: Trace, settings: ServerSettings, sides: Sequence[tuple[str, str, GraphSet]],
                  cost: ServingCost, replicas: int | None, rate_scales: Sequence[float], slo: Slo | None,
                  cap: int = 1, record: bool = False, tick: Callable[[], None] | None = None,
                  scan_below: int = 0) -> ServingAudit:
    """Replay every side (label, source, graphs) of ``trace`` (at rate scale 1) and, with ``replicas`` None, search
    each side's capacity at every rate scale first.  ``record`` keeps the step rows the report draws."""
    searches: list[tuple[Search, ...] | None] = [None] * len(sides)
    if replicas is None:
        if slo is None:
            raise ValueError("the capacity search needs an SLO")
        searches = [capacity(trace, rate_scales, settings, graphs, cost, slo, cap, tick, scan_below)
                    for _, _, graphs in sides]
        replicas = compared_count(searches)  # type: ignore[arg-type]
    at = scaled(trace, rate_scales[0])
    out = []
    for (label, source, graphs), search in zip(sides, searches, strict=True):
        result = replay(at, settings, graphs, cost, replicas, record=record, tick=tick)
        out.append(ServingSide(label, source, graphs, result, summarize(result, cost, slo), search))
    return ServingAudit(len(trace), settings, replicas, rate_scales[0], slo, tuple(out))
