"""The sweep's tidy table: CSV rows written and read back exactly, and per-planner totals over buckets."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path

from model.load.outputs import write_together
from model.sweeping.grid import SweepPoint
from model.sweeping.runner import SweepRow


def csv_value(value) -> str:
    """A cell as text: empty for None, repr for floats (round-trips exactly, deterministic)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def csv_bytes(rows: Sequence[SweepRow]) -> bytes:
    """The tidy CSV's bytes, columns in SweepRow field order."""
    names = [f.name for f in fields(SweepRow)]
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(names)
    for row in rows:
        writer.writerow([csv_value(getattr(row, n)) for n in names])
    return buf.getvalue().encode("utf-8")


def write_csv(rows: Sequence[SweepRow], path: Path) -> None:
    """The tidy CSV at path, written whole or not at all (``model.load.outputs.write_together``)."""
    write_together({path: [csv_bytes(rows)]})


def csv_cell(text: str, kind: str):
    """Parse one CSV cell back into a SweepRow field of the given annotated type (inverse of csv_value)."""
    if text == "" and "None" in kind:
        return None
    if kind.startswith("bool"):
        return text == "true"
    if kind.startswith("int"):
        return int(text)
    if kind.startswith("float"):
        return float(text)
    return text


def read_csv(path: Path) -> list[SweepRow]:
    """Rows back from a sweep CSV, so a report can be redrawn (or checked) without solving again."""
    kinds = {f.name: str(f.type) for f in fields(SweepRow)}
    with path.open(newline="", encoding="utf-8") as fh:
        return [SweepRow(**{k: csv_cell(v, kinds[k]) for k, v in rec.items()}) for rec in csv.DictReader(fh)]


@dataclass(frozen=True)
class PlannerTotal:
    """A planner's totals over all buckets at one point, read back from its rows."""

    point: SweepPoint
    planner: str
    status: str
    cost: float | None
    bound: float | None
    gap: float | None
    ratio_to_mip: float | None
    limits_met: bool
    prefill_cost: float | None
    decode_cost: float | None
    overhead_cost: float | None
    compile_cost: float | None
    sequential_ms: float | None
    shapes: tuple[int, ...]
    solve_s: float
    wall_s: float


def planner_totals(rows: Iterable[SweepRow]) -> list[PlannerTotal]:
    """Each (point, planner)'s totals, in first-appearance order, summed from its bucket rows."""
    groups: dict[tuple[SweepPoint, str], list[SweepRow]] = {}
    for row in rows:
        groups.setdefault((row.point, row.planner), []).append(row)
    return [total_of(point, planner, group) for (point, planner), group in groups.items()]


def _sum(values: Iterable[float | None]) -> float | None:
    values = list(values)
    return None if any(v is None for v in values) else float(sum(values))


def total_of(point: SweepPoint, planner: str, group: Sequence[SweepRow]) -> PlannerTotal:
    """A planner's totals at a point from its bucket rows (the cost breakdown summed over buckets)."""
    first = group[0]
    shapes = sorted({int(s) for r in group for s in r.shapes.split()})
    return PlannerTotal(point, planner, first.status, first.total_cost, first.total_bound, first.total_gap,
                        first.total_ratio_to_mip, all(r.limits_met for r in group),
                        _sum(r.prefill_cost for r in group), _sum(r.decode_cost for r in group),
                        _sum(r.overhead_cost for r in group), _sum(r.compile_cost for r in group),
                        _sum(r.sequential_ms for r in group), tuple(shapes), first.solve_s, first.wall_s)
