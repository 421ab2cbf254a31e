"""Plan files: read them strictly, render them in chunks, write them all or nothing (``model.load.outputs``)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from model.base.errors import InputError
from model.cost.common import GRANULARITY, HEADS, HIDDEN
from model.domain.schema import Plan
from model.load.files import check_utf8, read_input
from model.load.outputs import write_together
from model.load.requests import MAX_LEN, JsonFieldError, json_table, line_numbers, strict_json

SHAPE_KEYS = ("seq_align", "heads_align", "hidden_align")
RECORD_KEYS = ("request_id", "batch_id", "shape")
CHUNK_RECORDS = 1 << 20  # records rendered and written at a time


def read_plan(path: str | Path) -> Plan:
    """Parse a plan JSONL file; every structural problem is an InputError with its line.

    Shape rules that are purely about one record (exact keys, heads 32, hidden 4096,
    seq_align a positive multiple of 64) are checked here; rules that relate records to
    each other or to the requests live in ``model.validate``.

    A good file is read and checked column-wise by pyarrow; anything the fast checks
    do not accept goes through the strict line-by-line pass, which names the first
    offending line (or, for exotic but valid files, accepts them).
    """
    path = Path(path)
    raw = read_input(path)  # a regular file (a FIFO would have blocked), recorded as an input
    lines = line_numbers(raw)
    if len(lines) == 0:
        raise InputError(str(path), None, None, "empty plan")
    check_utf8(path, raw)
    del raw  # read again by pyarrow, so its bytes (1.2 GB at 10^7) are not held too
    table = _parse(str(path), path)
    fast = _read_plan_fast(table, lines, str(path)) if table is not None else None
    if fast is not None:
        del table
        pa.default_memory_pool().release_unused()  # the table's memory, back to the system, not kept pooled
        return fast
    del table
    return _read_plan_slow(path, read_input(path))


def _parse(source, path: Path) -> pa.Table | None:
    """The records as a table, read column-wise in blocks, or None if pyarrow cannot read them (the slow pass
    explains)."""
    try:
        return json_table(source)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        return None
    except OSError as exc:  # changed or gone since it was read
        raise InputError(str(path), None, None, f"cannot read: {exc.strerror or exc}") from exc


def shared_strings(column: pa.ChunkedArray) -> np.ndarray:
    """A column as an object array of str in which equal values are one Python object (a batch id repeats for
    every member: 10^7 records hold a few 10^4 distinct ids, not 10^7 strings)."""
    column = column.cast(pa.string())
    distinct = column.unique()
    index = pc.index_in(column, value_set=distinct).to_numpy(zero_copy_only=False)
    return np.asarray(distinct.to_pylist(), dtype=object)[index]


def _read_plan_fast(table: pa.Table, lines: np.ndarray, source: str) -> Plan | None:
    """The plan if every record passes the column-wise checks, else None (let the slow pass explain)."""
    if table.num_rows != len(lines) or not all(k in table.column_names for k in RECORD_KEYS):
        return None
    shape = table.column("shape")
    ids = [table.column(k) for k in ("request_id", "batch_id")]
    if (not pa.types.is_struct(shape.type) or sorted(f.name for f in shape.type) != sorted(SHAPE_KEYS)
            or any(c.null_count or not (pa.types.is_string(c.type) or pa.types.is_int64(c.type)) for c in ids)):
        return None
    shape = shape.combine_chunks()
    fields = {k: shape.field(k) for k in SHAPE_KEYS}
    if shape.null_count or any(f.null_count or not pa.types.is_int64(f.type) for f in fields.values()):
        return None
    seq, heads, hidden = (np.asarray(fields[k].to_numpy()) for k in SHAPE_KEYS)
    if not ((heads == HEADS).all() and (hidden == HIDDEN).all() and (seq > 0).all() and (seq % GRANULARITY == 0).all()
            and (seq <= MAX_LEN).all()):
        return None
    rid = np.asarray(ids[0].cast(pa.string()).to_numpy(zero_copy_only=False), dtype=object)
    return Plan(rid, shared_strings(ids[1]), seq.astype(np.int64), source, lines)


def _read_plan_slow(path: Path, raw: bytes) -> Plan:
    """The strict line-by-line pass: raises on the first bad record, else builds the plan.

    Splits on "\\n" only (str.splitlines would also split on U+2028, legal in JSON strings).
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(str(path), None, None, f"cannot read: not UTF-8 text ({exc.reason})") from None
    ids, batches, seqs, lines = [], [], [], []
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        rec = _plan_record(str(path), number, line)
        ids.append(str(rec["request_id"]))
        batches.append(str(rec["batch_id"]))
        seqs.append(rec["shape"]["seq_align"])
        lines.append(number)
    return Plan(np.asarray(ids, dtype=object), np.asarray(batches, dtype=object),
                np.asarray(seqs, dtype=np.int64), str(path), np.asarray(lines, dtype=np.int64))


def _exact_int(value) -> bool:
    """True for a JSON integer (not a boolean, not 32.0): shapes are compiled, not approximated."""
    return isinstance(value, int) and not isinstance(value, bool)


def _plan_record(source: str, number: int, line: str) -> dict:
    """One plan line parsed and checked on its own, or an InputError naming line and field."""
    try:
        rec = strict_json(line, numbers=False)
    except json.JSONDecodeError as exc:
        raise InputError(source, number, None, f"malformed JSON: {exc.msg} (column {exc.colno})") from None
    except JsonFieldError as exc:
        raise InputError(source, number, exc.field, exc.message) from None
    except ValueError as exc:  # NaN / Infinity
        raise InputError(source, number, None, f"malformed JSON: {exc}") from None
    if not isinstance(rec, dict):
        raise InputError(source, number, None, "expected a JSON object")
    for key in RECORD_KEYS:
        if rec.get(key) is None:
            raise InputError(source, number, key, "missing")
    for key in ("request_id", "batch_id"):
        if not (_exact_int(rec[key]) or isinstance(rec[key], str)):
            raise InputError(source, number, key, f"expected a string or integer, got {rec[key]!r}")
    shape = rec["shape"]
    if not isinstance(shape, dict):
        raise InputError(source, number, "shape", f"expected an object with {', '.join(SHAPE_KEYS)}, got {shape!r}")
    missing = [k for k in SHAPE_KEYS if k not in shape]
    extra = sorted(k for k in shape if k not in SHAPE_KEYS)
    if missing or extra:
        found = "; ".join(part for part in (missing and f"missing {', '.join(missing)}",
                                            extra and f"unexpected {', '.join(extra)}") if part)
        raise InputError(source, number, "shape", f"must hold exactly {', '.join(SHAPE_KEYS)} ({found})")
    for key, want in (("heads_align", HEADS), ("hidden_align", HIDDEN)):
        if not _exact_int(shape[key]) or shape[key] != want:
            raise InputError(source, number, f"shape.{key}", f"must be {want}, got {shape[key]!r}")
    s = shape["seq_align"]
    if not _exact_int(s) or s <= 0 or s % GRANULARITY:
        raise InputError(source, number, "shape.seq_align", f"must be a positive multiple of {GRANULARITY}, got {s!r}")
    if s > MAX_LEN:  # no request is longer, and larger shapes would overflow the cost model's int64 sums
        raise InputError(source, number, "shape.seq_align", f"must be at most {MAX_LEN}, got {s}")
    return rec


def plan_text(plan: Plan) -> str:
    """The JSONL text of a plan, one record per request in plan order."""
    return b"".join(plan_chunks(plan)).decode("utf-8")


def plan_chunks(plan: Plan, size: int = CHUNK_RECORDS) -> Iterator[bytes]:
    """The plan's JSONL bytes, ``size`` records at a time (a 10^7-record text held whole cost 4 GB).

    Built column-wise by pyarrow (a million records in about a second instead of
    several); ids that need JSON escaping go through json.dumps, so the text is
    always exactly what json.dumps would have written.
    """
    for lo in range(0, len(plan), size):
        hi = lo + size
        records = concat_strings('{"request_id": ', json_strings(plan.request_ids[lo:hi]), ', "batch_id": ',
                                 json_strings(plan.batch_ids[lo:hi]), ', "shape": {"seq_align": ',
                                 int_strings(plan.seq_align[lo:hi]),
                                 f', "heads_align": {HEADS}, "hidden_align": {HIDDEN}}}}}\n')
        yield joined_bytes(records)


def concat_strings(*parts) -> pa.Array:
    """Element-wise concatenation of large_string arrays and literal strings."""
    args = [pa.scalar(p, pa.large_string()) if isinstance(p, str) else p for p in parts]
    return pc.binary_join_element_wise(*args, pa.scalar("", pa.large_string()))


def int_strings(values: np.ndarray) -> pa.Array:
    """Integers as their decimal text (a large_string array)."""
    return pc.cast(pa.array(np.asarray(values, dtype=np.int64)), pa.large_string())


def json_strings(values: np.ndarray) -> pa.Array:
    """Each value as a JSON string literal, spelled as json.dumps(str(v)) spells it."""
    try:
        text = pa.array(values, type=pa.large_string())
    except (pa.ArrowInvalid, pa.ArrowTypeError):  # non-str ids: stringify them first
        text = pa.array([str(v) for v in values], type=pa.large_string())
    quoted = concat_strings('"', text, '"')
    escape = pc.or_(pc.invert(pc.string_is_ascii(text)), pc.match_substring_regex(text, r'["\\\x00-\x1f\x7f]'))
    rows = np.flatnonzero(escape.to_numpy(zero_copy_only=False))
    if len(rows) == 0:
        return quoted
    escaped = pa.array([json.dumps(v) for v in text.take(pa.array(rows)).to_pylist()], type=pa.large_string())
    return pc.replace_with_mask(quoted, escape, escaped)


def joined_bytes(strings: pa.Array) -> bytes:
    """All values of a large_string array concatenated, read straight from its data buffer."""
    _, offsets, data = strings.buffers()
    bounds = np.frombuffer(offsets, dtype=np.int64)[strings.offset:strings.offset + len(strings) + 1]
    return data.to_pybytes()[int(bounds[0]):int(bounds[-1])]


def joined_text(strings: pa.Array) -> str:
    """All values of a large_string array concatenated, as text."""
    return joined_bytes(strings).decode("utf-8")


def check_inside(targets: Iterable[Path], folder: Path) -> None:
    """Every target must be a plain file name directly inside folder (symlinks in the folder's path resolved).

    The last line of defence against a plan landing elsewhere: raised before anything is staged.
    """
    home = Path(folder).resolve()
    for target in targets:
        target = Path(target)
        name = target.name
        if (target.parent.resolve() != home or name in ("", ".", "..") or "\x00" in name
                or "/" in name or os.sep in name):
            raise InputError(str(target), None, None, f"refusing to write outside the output folder {folder}")


def write_plans(plans: dict[Path, Plan], inside: Path | None = None,
                also: Mapping[Path, Iterable[bytes]] | None = None) -> None:
    """Write several plans -- and ``also`` the other files of the same result, a report say -- so that either
    all of them land or none changes (``model.load.outputs.write_together``).

    With ``inside``, every plan must lie directly in that folder (else nothing is written).
    """
    if inside is not None:
        check_inside(plans, inside)
    write_together({**{path: plan_chunks(plan) for path, plan in plans.items()}, **(also or {})})
