"""Plan files: read them strictly, write them atomically (temporary file + rename)."""

from __future__ import annotations

import errno
import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from model.base.errors import InputError
from model.base.runtime import shielded
from model.cost.common import GRANULARITY, HEADS, HIDDEN
from model.domain.schema import Plan
from model.load.files import check_utf8, read_input
from model.load.requests import MAX_LEN, JsonFieldError, json_table, line_numbers, strict_json

SHAPE_KEYS = ("seq_align", "heads_align", "hidden_align")
RECORD_KEYS = ("request_id", "batch_id", "shape")
# mkstemp makes private (0600) files; a plan is an ordinary output file, and a
# replaced plan keeps the mode its target had.
PLAN_MODE = 0o644
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


def write_plans(plans: dict[Path, Plan], inside: Path | None = None) -> None:
    """Write several plans so that either all of them land or none changes (see ``write_together``).

    With ``inside``, every target must lie directly in that folder (else nothing is written).
    """
    if inside is not None:
        check_inside(plans, inside)
    write_together({path: plan_chunks(plan) for path, plan in plans.items()})


def write_together(files: dict[Path, Iterable[bytes]]) -> None:
    """Write several files so that either all of them land or none changes.

    Each goes to a temporary file in its target folder first and is flushed to disk.
    Only then are they renamed over their targets; an existing target is first
    hard-linked aside, so if a later rename fails the earlier ones are rolled back
    and every target is left as it was.  (A crash of the machine in the middle of
    the renames can still leave a mix; an exception cannot.)  Folders created for
    the outputs are removed again if the write fails.  A failure is reported as an
    InputError naming the target, after the rollback.
    """
    made = _missing_dirs(files)
    staged: list[tuple[Path, Path]] = []
    backups: dict[Path, Path | None] = {}
    done: list[Path] = []
    current = next(iter(files), Path("."))
    ok = False
    try:
        for current, chunks in files.items():
            staged.append((_stage(current, chunks), current))
        for tmp, current in staged:
            backups[current] = _keep_aside(current)
            done.append(current)  # before the rename: an interrupt right after it must still roll it back
            os.replace(tmp, current)
        for folder in {t.parent for t in files}:
            _fsync_dir(folder)
        ok = True
    except OSError as exc:
        with shielded():
            _roll_back(done, backups)
        raise InputError(str(current), None, None, f"cannot write: {exc.strerror or exc}") from exc
    except BaseException:  # an interrupt (SIGINT, SIGTERM) too: every target goes back as it was
        with shielded():
            _roll_back(done, backups)
        raise
    finally:
        with shielded():
            for tmp, _ in staged:
                _remove(tmp)
            for aside in backups.values():
                if aside is not None:
                    _remove(aside)
            if not ok:
                for folder in made:
                    try:
                        os.rmdir(folder)
                    except OSError:
                        pass


def _missing_dirs(files: dict[Path, object]) -> list[Path]:
    """Folders that writing these files would create, deepest first (removed again on failure)."""
    missing: set[Path] = set()
    for target in files:
        folder = target.parent
        while not folder.exists() and folder != folder.parent:
            missing.add(folder)
            folder = folder.parent
    return sorted(missing, key=lambda p: len(p.parts), reverse=True)


def _stage(target: Path, chunks: Iterable[bytes]) -> Path:
    """Write the chunks to a fresh temporary file beside target, flushed to disk; return its path.

    A target that is a folder fails here, before any plan has been replaced.
    """
    if target.is_dir():
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(target))
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        os.fchmod(fd, target.stat().st_mode & 0o777 if target.exists() else PLAN_MODE)
        with os.fdopen(fd, "wb") as fh:
            for chunk in chunks:
                fh.write(chunk)
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        with shielded():
            _remove(Path(tmp))
        raise
    return Path(tmp)


def _keep_aside(target: Path) -> Path | None:
    """A hard link to target's current file (None if there is none), for rollback."""
    if not target.exists():
        return None
    fd, aside = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".old", dir=target.parent)
    os.close(fd)
    os.unlink(aside)  # the name is ours; the link takes its place so the target never goes missing
    os.link(target, aside)
    return Path(aside)


def _roll_back(done: list[Path], backups: dict[Path, Path | None]) -> None:
    """Put every already-replaced target back as it was (or remove it if it was new)."""
    for target in reversed(done):
        aside = backups.get(target)
        try:
            if aside is None:
                os.unlink(target)
            else:
                os.replace(aside, target)
        except OSError:
            pass


def _remove(path: Path) -> None:
    """Delete a leftover temporary file; it may already be gone (renamed into place)."""
    try:
        os.unlink(path)
    except OSError:
        pass


def _fsync_dir(folder: Path) -> None:
    """Make the renames durable (POSIX); harmless where directories cannot be opened."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
