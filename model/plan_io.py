"""Plan files: read them strictly, write them atomically (temporary file + rename)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import numpy as np

from model.costs import HEADS, HIDDEN
from model.errors import InputError
from model.schema import Plan

SHAPE_KEYS = {"seq_align", "heads_align", "hidden_align"}


def read_plan(path: str | Path) -> Plan:
    """Parse a plan JSONL file; every structural problem is an InputError with its line.

    Shape rules that are purely about one record (exact keys, heads 32, hidden 4096,
    seq_align a positive multiple of 64) are checked here; rules that relate records to
    each other or to the requests live in ``model.validate``.
    """
    path = Path(path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(str(path), None, None, f"cannot read: {getattr(exc, 'strerror', None) or exc}") from exc
    ids, batches, seqs, lines = [], [], [], []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(str(path), number, None, f"malformed JSON: {exc.msg} (column {exc.colno})") from None
        if not isinstance(rec, dict):
            raise InputError(str(path), number, None, "expected a JSON object")
        for key in ("request_id", "batch_id", "shape"):
            if rec.get(key) is None:
                raise InputError(str(path), number, key, "missing")
        for key in ("request_id", "batch_id"):
            if isinstance(rec[key], (bool, dict, list, float)):
                raise InputError(str(path), number, key, f"expected a string or integer, got {rec[key]!r}")
        shape = rec["shape"]
        if not isinstance(shape, dict) or set(shape) != SHAPE_KEYS:
            raise InputError(str(path), number, "shape",
                             f"must hold exactly seq_align, heads_align, hidden_align; got {shape!r}")
        if shape["heads_align"] != HEADS or isinstance(shape["heads_align"], bool):
            raise InputError(str(path), number, "shape.heads_align", f"must be {HEADS}, got {shape['heads_align']!r}")
        if shape["hidden_align"] != HIDDEN or isinstance(shape["hidden_align"], bool):
            raise InputError(str(path), number, "shape.hidden_align",
                             f"must be {HIDDEN}, got {shape['hidden_align']!r}")
        s = shape["seq_align"]
        if isinstance(s, bool) or not isinstance(s, int) or s <= 0 or s % 64:
            raise InputError(str(path), number, "shape.seq_align", f"must be a positive multiple of 64, got {s!r}")
        ids.append(str(rec["request_id"]))
        batches.append(str(rec["batch_id"]))
        seqs.append(s)
        lines.append(number)
    if not ids:
        raise InputError(str(path), None, None, "empty plan")
    return Plan(np.asarray(ids, dtype=object), np.asarray(batches, dtype=object),
                np.asarray(seqs, dtype=np.int64), str(path), np.asarray(lines, dtype=np.int64))


def plan_text(plan: Plan) -> str:
    """The JSONL text of a plan, one record per request in plan order."""
    head = '{"request_id": '
    out = []
    for rid, bid, s in zip(plan.request_ids, plan.batch_ids, plan.seq_align.tolist()):
        out.append(f'{head}{json.dumps(rid)}, "batch_id": {json.dumps(bid)}, '
                   f'"shape": {{"seq_align": {s}, "heads_align": {HEADS}, "hidden_align": {HIDDEN}}}}}\n')
    return "".join(out)


def write_plans(plans: dict[Path, Plan]) -> None:
    """Write several plans so that either all of them land or none changes.

    Each goes to a temporary file in its target folder first; only when every one is
    complete and flushed are they renamed over their targets.
    """
    staged: list[tuple[str, Path]] = []
    try:
        for target, plan in plans.items():
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
            staged.append((tmp, target))
            with os.fdopen(fd, "w") as fh:
                fh.write(plan_text(plan))
                fh.flush()
                os.fsync(fh.fileno())
        for tmp, target in staged:
            os.replace(tmp, target)
        staged = []
    finally:
        for tmp, _ in staged:
            try:
                os.unlink(tmp)
            except OSError:
                pass
