"""``--json``: a command's summary and tables as one JSON document with a stable, documented schema.

Every command writes the same top level (docs/json.md): ``schema_version``, ``command``,
``summary`` (``model.report.summary.summary_dict``) and ``tables`` (name -> a table with its
column names, each column's unit and the rows).  A command may add keys of its own after
those (the replay's numbers, which it wrote before the schema existed), listed in docs/json.md
too.  ``schema_version`` changes only when a documented key changes meaning or goes away; a
new key does not change it.  Numbers are written as Python writes them (they read back
exactly); a non-finite number, which JSON cannot hold, is written as null.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from model.cost.device import device_hours
from model.cost.model import CostModel
from model.domain.schema import BucketResult
from model.report.summary import ANALYTIC_UNIT, DEVICE_UNIT, Summary, summary_dict

SCHEMA_VERSION = 1
TOP_KEYS = ("schema_version", "command", "summary", "tables")
TABLE_KEYS = ("columns", "units", "rows")


@dataclass(frozen=True)
class DataTable:
    """A table as data: column names, each column's unit ("" for a name, a count or a flag) and the rows."""

    columns: tuple[str, ...]
    units: tuple[str, ...]
    rows: tuple[tuple, ...]

    def as_dict(self) -> dict:
        return {"columns": list(self.columns), "units": list(self.units),
                "rows": [[finite(v) for v in row] for row in self.rows]}


def finite(value):
    """A cell as JSON holds it: floats finite or None, tuples as lists."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (tuple, list)):
        return [finite(v) for v in value]
    return value


def cost_unit(cost: CostModel | None) -> str:
    """The unit of a cost model's cost: device-ms in device mode, else the analytic modes' cost units."""
    return DEVICE_UNIT if cost is not None and cost.device_time else ANALYTIC_UNIT


def bucket_rows(results: Sequence[BucketResult], cost: CostModel | None) -> DataTable:
    """Every bucket's metrics, one row each, with units (device-hours in device mode)."""
    unit = cost_unit(cost)
    device = unit == DEVICE_UNIT
    columns = ("bucket", "requests", "batches", "shapes", "graphs", "cost", "device_hours", "prefill_cost",
               "decode_cost", "overhead_cost", "compile_cost", "pad_ratio", "p95_latency_ms", "sequential_ms",
               "ok")
    units = ("", "requests", "batches", "tokens", "graphs", unit, "device-hours", unit, unit, unit, unit,
             "pad tokens / real tokens", "ms", "ms", "")
    rows = []
    for r in results:
        m = r.metrics
        if m is None:
            rows.append((r.name, *([None] * (len(columns) - 2)), r.ok))
            continue
        rows.append((r.name, m.n_requests, m.n_batches, [int(s) for s in m.shapes], len(m.graphs), m.cost,
                     float(device_hours(m.cost)) if device else None, m.prefill_cost, m.decode_cost,
                     m.overhead_cost, m.compile_cost, m.pad_ratio, m.p95_latency_ms, m.sequential_ms, r.ok))
    return DataTable(columns, units, tuple(rows))


def document(command: str, summary: Summary, tables: Mapping[str, DataTable],
             extra: Mapping[str, object] | None = None) -> dict:
    """The whole document in the documented key order (``extra``: a command's own keys, after the common ones)."""
    doc = {"schema_version": SCHEMA_VERSION, "command": command, "summary": summary_dict(summary),
           "tables": {name: t.as_dict() for name, t in tables.items()}}
    for key, value in (extra or {}).items():
        if key in doc:
            raise ValueError(f"{key!r} is a key every document has")
        doc[key] = finite(value) if not isinstance(value, dict) else value
    return doc


def document_bytes(doc: Mapping) -> bytes:
    """The document as UTF-8 JSON text, indented, ending in a newline (no NaN: the writer refuses it)."""
    return (json.dumps(doc, indent=2, allow_nan=False) + "\n").encode("utf-8")
