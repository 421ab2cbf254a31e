"""Request I/O: read one bucket from JSONL, CSV or Parquet, validating every field.

The fast path hands the file to pyarrow (a million rows in about a second); checks
are vectorised and only the first offending row is turned into a message, so bad
input costs no more than good input.  Every error names file, line and field, and
it is always the FIRST bad line of the file, so fixing errors top to bottom works.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from decimal import Decimal
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.json as pajson
import pyarrow.parquet as pq

from model.base.errors import InputError, unknown_name
from model.base.numbers import DECIMAL_TEXT, NONFINITE_TEXT, SHOWN_CHARS, as_float
from model.base.numbers import shown as spelled
from model.domain.schema import Bucket
from model.load.files import check_utf8, read_input
from model.load.names import check_name

FORMATS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".csv": "csv",
           ".parquet": "parquet", ".pq": "parquet"}

# The cost model sums squares of lengths in int64 (``model.cost.common.sq``); at 2**20 tokens
# of prompt and of generation the largest term is ~2.7e18, safely below 2**63.  A longer
# "length" is a corrupt row, not a request, and would otherwise overflow silently.
MAX_LEN = 1 << 20

PARQUET_MAGIC = b"PAR1"
_WHITESPACE = b" \t\r\n\f\v"


@dataclass(frozen=True)
class Columns:
    """Which source columns hold the id, prompt length and generation length.

    ``request_id=None`` numbers the rows in file order (0, 1, ...), as the Azure
    traces need.  ``time`` names an arrival-time column (seconds, or ISO 8601
    timestamps), read into ``Bucket.arrival_s`` when the file has it.
    """

    prompt_len: str = "prompt_len"
    gen_len: str = "gen_len"
    request_id: str | None = "request_id"
    time: str | None = None

    @classmethod
    def parse(cls, spec: str) -> Columns:
        """Parse ``--columns``: a preset name (``azure``, ``default``) or ``PROMPT,GEN[,ID]``."""
        if spec in PRESETS:
            return PRESETS[spec]
        parts = [s.strip() for s in spec.split(",")]
        if len(parts) not in (2, 3) or not all(parts):
            raise InputError("--columns", None, None,
                             f"expected a preset ({', '.join(PRESETS)}) or PROMPT,GEN[,ID], got {spec!r}")
        if len(set(parts)) != len(parts):  # one column read twice: pyarrow's KeyError traceback
            raise InputError("--columns", None, None, f"a column is named twice in {spec!r}; name each role's own")
        return cls(parts[0], parts[1], parts[2] if len(parts) == 3 else None)

    def wanted(self) -> list[str]:
        """The source columns to read, id first (absent when rows are numbered), the time column last."""
        return [c for c in (self.request_id, self.prompt_len, self.gen_len, self.time) if c]


PRESETS = {
    "default": Columns(),
    "azure": Columns("ContextTokens", "GeneratedTokens", None, "TIMESTAMP"),
}


@dataclass(frozen=True)
class _Problem:
    """The first bad row of one column: its 0-based row, the field and what is wrong."""

    row: int
    field: str | None
    message: str


def detect_format(path: Path, fmt: str | None = None) -> str:
    """The file format, from an explicit name or the file's suffix."""
    if fmt:
        if fmt not in set(FORMATS.values()):
            raise InputError(str(path), None, None, unknown_name("format", fmt, ("jsonl", "csv", "parquet")))
        return fmt
    try:
        return FORMATS[path.suffix.lower()]
    except KeyError:
        raise InputError(str(path), None, None, f"cannot tell the format from suffix {path.suffix!r}; use .jsonl, "
                         ".csv or .parquet, or say it with --format jsonl|csv|parquet") from None


def _is_folder(path: Path) -> bool:
    """Whether ``path`` is a folder (a name the file system refuses is not one)."""
    try:
        return path.is_dir()
    except (OSError, ValueError):
        return False


def load_requests(path: str | Path, name: str | None = None, columns: Columns | None = None,
                  fmt: str | None = None, time_column: str | None = None, time_default: str | None = None) -> Bucket:
    """Read and validate one bucket of requests.

    Raises InputError for an unreadable or empty file, malformed rows, missing fields,
    non-integer, non-positive or absurdly large lengths, and duplicate ids.  The
    columns' time column is read when the file has it; ``time_column`` names one that
    must be there (a missing or unparsable time is an error naming its line);
    ``time_default`` names one to read when the file has it and the columns name none
    (the replay's ``arrival_s``).
    """
    path = Path(path)
    if name is None:  # the bucket is named after the file, and the name becomes a plan file's name
        name = check_name(path.stem, str(path), None, None, derived=True)
    if _is_folder(path):  # before the suffix: "cannot tell the format from suffix ''" said nothing useful
        raise InputError(str(path), None, None, f"is a folder, not a request file; name the files in it (e.g. "
                         f"{path / '*.jsonl'}), one bucket each")
    kind = detect_format(path, fmt)
    raw = _read_bytes(path)
    if kind == "jsonl":
        columns = _with_time(columns or Columns(), time_column, time_default)
        frame, lines, pending = _read_jsonl(path, raw, columns)
    elif kind == "csv":
        columns = _with_time(columns or _auto_columns(_csv_header(raw)), time_column, time_default)
        frame, lines, pending = _read_csv(path, raw, columns)
    else:
        frame, lines, columns = _read_parquet(path, raw, columns, time_column, time_default)
        pending = None
    del raw
    bucket = _to_bucket(path, name, frame, lines, columns, pending, time_required=time_column is not None)
    del frame
    pa.default_memory_pool().release_unused()  # the parsed table's memory, back to the system, not kept pooled
    return bucket


def _with_time(columns: Columns, time_column: str | None, time_default: str | None = None) -> Columns:
    """The mapping with its time column replaced by the one asked for (if any; an empty name is no column), or
    the default where it has none."""
    if time_column is not None and not time_column:
        raise InputError("--time-column", None, None, "expected a column name, got ''")
    if time_column is not None:
        if time_column in (columns.prompt_len, columns.gen_len, columns.request_id):  # pyarrow's KeyError traceback
            raise InputError("--time-column", None, None, f"{time_column!r} is already the id or a length column")
        return replace(columns, time=time_column)
    return replace(columns, time=time_default) if columns.time is None and time_default is not None else columns


def _read_bytes(path: Path) -> bytes:
    """The whole file (``read_input``: a regular file, recorded as an input); one read serves line numbering,
    sniffing and parsing."""
    return read_input(path)


def _auto_columns(names: list[str]) -> Columns:
    """Default columns, switching to the Azure preset when the header says so."""
    if "ContextTokens" in names and "GeneratedTokens" in names and "prompt_len" not in names:
        return PRESETS["azure"]
    return Columns()


ROLE_WORDS = (("prompt", "input", "context", "ctx", "query"), ("gen", "output", "completion", "response", "decode"),
              ("id",))  # what a column holding the prompt length, the generation length or the id tends to be called


def check_columns_present(path: Path, found: list[str], columns: Columns, line: int | None, what: str = "column"
                          ) -> None:
    """A mapped column the file does not have at all is named at once, with the columns it has and the flag that
    maps them (``field 'request_id': missing`` on line 2 said neither)."""
    absent = [c for c in (columns.request_id, columns.prompt_len, columns.gen_len) if c and c not in found]
    if not absent:
        return
    shown_found = ", ".join(found[:12]) + (f", ... ({len(found)} in all)" if len(found) > 12 else "")
    raise InputError(str(path), line, absent[0], f"no such {what} (the file has: {shown_found or 'none'}); "
                     f"map yours with --columns PROMPT,GEN[,ID], e.g. --columns {column_guess(found)}"
                     " (or --columns azure for the Azure traces)")


def column_guess(found: list[str]) -> str:
    """An example ``--columns`` value built from the file's own column names: by what they say they hold, else
    the first columns in file order (only an example: the message says "e.g.")."""
    ident = next((name for name in found if any(w in name.lower() for w in ROLE_WORDS[2])), None)
    rest = [name for name in found if name != ident]
    picked: list[str] = []
    for words in ROLE_WORDS[:2]:
        hit = next((n for n in rest if n not in picked and any(w in n.lower() for w in words)), None)
        hit = hit if hit is not None else next((n for n in rest if n not in picked), None)
        if hit is None:
            return "input_tokens,output_tokens,id"  # too few columns to build one from: the form, spelt out
        picked.append(hit)
    return ",".join(picked + ([ident] if ident else []))


def _csv_header(raw: bytes) -> list[str]:
    """Column names on the first line of a CSV (for choosing the column preset)."""
    first = raw.split(b"\n", 1)[0].decode("utf-8-sig", errors="replace")
    return [h.strip().strip('"') for h in first.split(",")]


LINE_CHUNK = 1 << 24


def line_numbers(raw: bytes) -> np.ndarray:
    """1-based line number of each non-blank line (pyarrow skips blank ones).

    Vectorised over the newline positions; only lines that START with whitespace are
    looked at one by one, and well-formed files have none.
    """
    buf = np.frombuffer(raw, dtype=np.uint8)
    # newline positions chunk by chunk: a comparison over the whole buffer would hold a byte per byte of it
    ends = np.concatenate([np.zeros(0, np.int64)] + [np.flatnonzero(buf[lo:lo + LINE_CHUNK] == 10) + lo
                                                     for lo in range(0, len(buf), LINE_CHUNK)])
    if len(buf) and buf[-1] != 10:
        ends = np.append(ends, len(buf))
    starts = np.concatenate(([0], ends[:-1] + 1)).astype(np.int64) if len(ends) else np.zeros(0, np.int64)
    nonblank = ends > starts
    first = buf[np.minimum(starts, max(len(buf) - 1, 0))] if len(buf) else np.zeros(0, np.uint8)
    suspect = np.flatnonzero(nonblank & np.isin(first, np.frombuffer(_WHITESPACE, np.uint8)))
    for i in suspect:
        nonblank[i] = bool(raw[starts[i]:ends[i]].strip())
    return np.flatnonzero(nonblank).astype(np.int64) + 1


def json_table(source) -> pa.Table:
    """JSON lines as a table, column-wise by pyarrow.  The parser's scratch memory (about twice the table at
    10^7 records) stays in the allocator's pool unless handed back: it is, so the arrays built next can use it."""
    table = pajson.read_json(source, read_options=pajson.ReadOptions(block_size=1 << 24))
    pa.default_memory_pool().release_unused()
    return table


def _read_jsonl(path: Path, raw: bytes, columns: Columns) -> tuple[pd.DataFrame, np.ndarray, InputError | None]:
    """JSONL via pyarrow; on any parse trouble, a line-by-line pass finds the exact line."""
    lines = line_numbers(raw)
    if len(lines) == 0:
        raise InputError(str(path), None, None, "no requests (empty file)")
    check_utf8(path, raw)
    try:
        table = json_table(pa.BufferReader(raw))
        # A float column may hold 1e3 (refused) or 12.0 (accepted): only the text tells them apart.
        floats = any(pa.types.is_floating(table.column(c).type) for c in columns.wanted() if c in table.column_names)
        check_columns_present(path, table.column_names, columns, None, "key in any line")
        if table.num_rows == len(lines) and not floats:
            return _project(table, columns), lines, None
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        pass
    return _read_jsonl_slow(path, raw, columns)


def _reject_constant(name: str):
    """json.loads hook: NaN and Infinity are not JSON, whatever Python accepts."""
    raise ValueError(f"{name} is not valid JSON")


class JsonFieldError(ValueError):
    """A JSON text that parses but is not acceptable input: a duplicate key, a string that is not Unicode."""

    def __init__(self, field: str | None, message: str):
        super().__init__(message)
        self.field = field
        self.message = message


_SURROGATE = re.compile("[\ud800-\udfff]")


def _strict_object(pairs: list[tuple[str, object]]) -> dict:
    """json.loads object hook: refuse a key given twice (JSON leaves it open; Python keeps the last) and
    strings holding a lone surrogate ("\\ud800" parses, but no UTF-8 file or terminal can carry it)."""
    seen: set[str] = set()
    for key, value in pairs:
        if _SURROGATE.search(key):
            raise JsonFieldError(None, f"key {key!r} is not valid Unicode (a lone surrogate)")
        if key in seen:
            raise JsonFieldError(key, "duplicate key: given twice in one record")
        seen.add(key)
        if isinstance(value, str) and _SURROGATE.search(value):
            raise JsonFieldError(key, f"not valid Unicode (a lone surrogate in {value!r})")
    return dict(pairs)


class Spelled:
    """A JSON number written with an exponent (1e3): a float to JSON, never an integer length or id here."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _float_literal(text: str) -> float | Spelled:
    """json.loads float hook: 12.0 is the float 12.0 (an integral length); 1e3 keeps its spelling (refused)."""
    return Spelled(text) if "e" in text or "E" in text else float(text)


def strict_json(line: str, numbers: bool = True):
    """Parse one JSON text strictly: no NaN/Infinity, no duplicate keys, no lone surrogates.

    With ``numbers``, floats written with an exponent come back as ``Spelled`` (request files,
    where lengths and ids are integers).  Raises json.JSONDecodeError, JsonFieldError or ValueError.
    """
    try:
        return json.loads(line, parse_constant=_reject_constant, object_pairs_hook=_strict_object,
                          parse_float=_float_literal if numbers else float)
    except RecursionError:  # "[[[[..." 100,000 deep: the decoder's recursion, not a message
        raise ValueError("nested too deeply") from None


def _read_jsonl_slow(path: Path, raw: bytes, columns: Columns) -> tuple[pd.DataFrame, np.ndarray, InputError | None]:
    """Python pass used only when pyarrow refuses the file.

    It stops at the first line that is not a JSON object and returns that error as
    pending, together with the rows before it, so a field error on an EARLIER line is
    still the one reported.  Splits on "\\n" only: str.splitlines would also split on
    U+2028 and friends, which are legal inside JSON strings.
    """
    records, lines, pending = [], [], None
    text = raw.decode("utf-8-sig", errors="replace")
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            obj = strict_json(line)
        except json.JSONDecodeError as exc:
            pending = InputError(str(path), number, None, f"malformed JSON: {exc.msg} (column {exc.colno})")
        except JsonFieldError as exc:
            pending = InputError(str(path), number, exc.field, exc.message)
        except ValueError as exc:
            pending = InputError(str(path), number, None, f"malformed JSON: {exc}")
        else:
            if isinstance(obj, dict):
                records.append(obj)
                lines.append(number)
                continue
            pending = InputError(str(path), number, None, f"expected a JSON object, got {_json_kind(obj)}")
        break
    frame = pd.DataFrame({c: pd.Series([r.get(c) for r in records], dtype=object) for c in columns.wanted()})
    return frame, np.asarray(lines, dtype=np.int64), pending


def _json_kind(value) -> str:
    """The JSON name of a value's type, for messages a JSON author recognises."""
    names = {list: "an array", str: "a string", bool: "a boolean", int: "a number", float: "a number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def _read_csv(path: Path, raw: bytes, columns: Columns) -> tuple[pd.DataFrame, np.ndarray, InputError | None]:
    """CSV via pyarrow; each data row keeps its physical line number.

    Lengths are left to pyarrow's type inference (int64 on good files, so no Python
    work per row); the id column is read as text so "007" stays "007".
    """
    lines = line_numbers(raw)
    if len(lines) < 2:
        raise InputError(str(path), None, None, "no requests (empty file)" if len(lines) == 0
                         else "no requests (only a header)")
    check_utf8(path, raw)
    check_columns_present(path, _csv_header(raw), columns, 1)
    types = {c: pa.string() for c in columns.wanted()}  # ids stay text ("007"); lengths are checked as text below
    try:
        table = pacsv.read_csv(pa.BufferReader(raw), convert_options=pacsv.ConvertOptions(
            column_types=types, include_columns=columns.wanted(), include_missing_columns=True))
    except (pa.ArrowInvalid, pa.ArrowKeyError) as exc:
        raise _csv_error(path, raw, exc) from None
    rows = lines[1:] if table.num_rows == len(lines) - 1 else _csv_row_lines(path, raw)
    frame = _project(table, columns)
    for name in (columns.prompt_len, columns.gen_len):
        frame[name] = _csv_integers(table.column(name))
    return frame, rows, None


_INTEGER_TEXT = r"^-?[0-9]+(\.0+)?$"  # 12 and 12.0 (as in JSONL); not 1e3, " 12", "+12" or 12.5


def _csv_integers(column: pa.ChunkedArray) -> pd.Series:
    """A CSV length column: cells that spell an integer (``12``, ``12.0``, ``-3``) as integers, empty cells
    as missing, and every other cell (``1e3``, `` 12``, ``12.5``, ``x``) kept as its text so the error shows it.

    Vectorised (pyarrow's regex and cast) when every cell is a plain integer, as in every good file.
    """
    plain = pc.match_substring_regex(column, _INTEGER_TEXT)
    if column.null_count == 0 and pc.all(plain).as_py() is not False:
        try:
            return column.cast(pa.int64()).to_pandas()
        except (pa.ArrowInvalid, OverflowError):  # "12.0", or more digits than int64 holds
            pass
    cells = column.to_pylist()
    return pd.Series([None if v is None or v == "" else _integer_cell(v) if ok else v
                      for v, ok in zip(cells, plain.to_pylist(), strict=True)], dtype=object)


LONG_DIGITS = 19  # more digits than any int64: far above MAX_LEN, and (past 4,300) more than int() converts


class LongInteger(str):
    """A CSV cell spelling an integer of more than ``LONG_DIGITS`` digits, kept as its text: Python's int()
    refuses 4,300 digits and more (a ValueError, not a message), and no length is anywhere near this long."""


def _integer_cell(text: str) -> int | LongInteger:
    """A cell matching ``_INTEGER_TEXT`` as its integer, or as a ``LongInteger`` when too long to be a length."""
    digits = text.partition(".")[0]
    return LongInteger(text) if len(digits.lstrip("-")) > LONG_DIGITS else int(digits)


def _csv_row_lines(path: Path, raw: bytes) -> np.ndarray:
    """Line of each data row when quoted newlines make rows span lines (rare: Python pass)."""
    reader = csv.reader(io.StringIO(raw.decode("utf-8-sig", errors="replace"), newline=""))
    starts, previous = [], 0
    try:
        for row in reader:
            if row:
                starts.append(previous + 1)
            previous = reader.line_num
    except csv.Error as exc:  # a field past the csv module's limit (pyarrow read it)
        raise _python_csv_error(path, reader.line_num, exc) from None
    return np.asarray(starts[1:], dtype=np.int64)


def _python_csv_error(path: Path, line: int, exc: csv.Error) -> InputError:
    """The csv module's own refusal (a field longer than its limit, 131,072 characters), at its line."""
    return InputError(str(path), line or None, None, f"malformed CSV: {exc}")


def _csv_error(path: Path, raw: bytes, exc: Exception) -> InputError:
    """Turn a pyarrow CSV failure into a message with the line it happened on.

    pyarrow names no line for a ragged row, so a Python pass (error path only) finds the
    first row whose field count differs from the header's.
    """
    reader = csv.reader(io.StringIO(raw.decode("utf-8-sig", errors="replace"), newline=""))
    width = None
    try:
        for row in reader:
            if not row:
                continue
            if width is None:
                width = len(row)
            elif len(row) != width:
                return InputError(str(path), reader.line_num, None,
                                  f"malformed CSV: expected {width} fields, got {len(row)}")
    except csv.Error as exc:  # a field of megabytes: pyarrow cannot place it in a block, the csv module refuses it
        return _python_csv_error(path, reader.line_num, exc)
    return InputError(str(path), _csv_error_line(str(exc)), None, f"malformed CSV: {_first_line(exc)}")


def _read_parquet(path: Path, raw: bytes, columns: Columns | None, time_column: str | None = None,
                  time_default: str | None = None) -> tuple[pd.DataFrame, np.ndarray, Columns]:
    """Parquet via pyarrow; 'line' means 1-based row number.

    The magic bytes are checked first so a file that is not Parquet at all gets a
    stable message rather than whatever the installed pyarrow says.
    """
    if len(raw) < 8 or raw[:4] != PARQUET_MAGIC or raw[-4:] != PARQUET_MAGIC:
        raise InputError(str(path), None, None, "not a Parquet file (no PAR1 magic bytes)")
    try:
        source = pq.ParquetFile(pa.BufferReader(raw))
        columns = _with_time(columns or _auto_columns(source.schema_arrow.names), time_column, time_default)
        check_columns_present(path, list(source.schema_arrow.names), columns, None)
        present = [c for c in columns.wanted() if c in source.schema_arrow.names]
        table = source.read(columns=present)
    except (OSError, pa.ArrowException) as exc:
        raise InputError(str(path), None, None, f"corrupt Parquet file: {_first_line(exc)}") from None
    return _project(table, columns), np.arange(table.num_rows, dtype=np.int64) + 1, columns


def _first_line(exc: Exception) -> str:
    """The first line of an exception's text (pyarrow appends multi-line context)."""
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def _csv_error_line(message: str) -> int | None:
    """pyarrow says 'Row #N' (1-based, header included) for some errors."""
    m = re.search(r"[Rr]ow #(\d+)", message)
    return int(m.group(1)) if m else None


def _project(table: pa.Table, columns: Columns) -> pd.DataFrame:
    """The mapped columns as pandas, an all-missing column standing in for any absent one (the time column as
    seconds where the file types it as a time: see ``_time_values``)."""
    return pd.DataFrame({c: _time_values(table, c) if c == columns.time else _pandas_column(table, c)
                         for c in columns.wanted()})


_TIME_UNITS = {"s": 1.0, "ms": 1e3, "us": 1e6, "ns": 1e9}


def _time_values(table: pa.Table, name: str) -> pd.Series:
    """A time column with a time type (Parquet timestamps and dates, durations; JSON's inferred timestamps) as
    float seconds since the Unix epoch, computed from the stored integers: pandas would hold them as nanoseconds
    and raise OutOfBoundsDatetime on the year 3000.  Nulls stay None ("missing"); other columns as they are."""
    if name not in table.column_names:
        return _pandas_column(table, name)
    column = table.column(name)
    kind = column.type
    if pa.types.is_dictionary(kind):
        column, kind = column.cast(kind.value_type), kind.value_type
    if pa.types.is_timestamp(kind) or pa.types.is_duration(kind):
        per_second = _TIME_UNITS[kind.unit]
    elif pa.types.is_date32(kind):
        per_second = 1.0 / 86400.0  # days
    elif pa.types.is_date64(kind):
        per_second = 1e3  # milliseconds
    else:
        return _pandas_column(table, name)
    ticks = column.cast(pa.int32() if pa.types.is_date32(kind) else pa.int64())  # the stored integers
    stored = ticks.to_numpy(zero_copy_only=False)  # nulls become NaN (float) here
    seconds = np.asarray(stored, dtype=np.float64) / per_second
    if column.null_count:
        return pd.Series(np.where(column.is_null().to_numpy(zero_copy_only=False), None, seconds), dtype=object)
    return pd.Series(seconds)


def _pandas_column(table: pa.Table, name: str) -> pd.Series:
    """One column, keeping "null" apart from everything else.

    pandas would turn an integer column with a null into floats, and a float null into
    NaN (indistinguishable from a NaN literal); such columns, which only bad files
    have, become Python objects so "missing" means missing.
    """
    if name not in table.column_names:
        return pd.Series([None] * table.num_rows, dtype=object)
    column = table.column(name)
    kind = column.type
    if pa.types.is_dictionary(kind):
        column, kind = column.cast(kind.value_type), kind.value_type
    if (column.null_count and pa.types.is_floating(kind)) or pa.types.is_nested(kind) or pa.types.is_binary(kind) \
            or pa.types.is_large_binary(kind) or pa.types.is_fixed_size_binary(kind):
        return pd.Series(column.to_pylist(), dtype=object)  # lists and bytes as Python values, one per row
    return column.to_pandas(integer_object_nulls=True)


def _to_bucket(path: Path, name: str, frame: pd.DataFrame, lines: np.ndarray, columns: Columns,
               pending: InputError | None = None, time_required: bool = False) -> Bucket:
    """Validate the columns and build the Bucket, reporting the first bad line of the file.

    ``pending`` is a whole-line error (malformed JSON) that lies after every row in
    ``frame``, so it is reported only when those rows are all good.  A time column with
    no value at all counts as absent unless ``time_required``.
    """
    prompt, bad_prompt = _length_column(frame[columns.prompt_len], columns.prompt_len)
    gen, bad_gen = _length_column(frame[columns.gen_len], columns.gen_len)
    if columns.request_id is None:
        ids, bad_id = np.arange(len(frame)).astype(str).astype(object), None
    else:
        ids, bad_id = _id_column(frame[columns.request_id], columns.request_id, lines)
    arrival, bad_time = None, None
    if columns.time is not None and (time_required or frame[columns.time].notna().any()):
        arrival, bad_time = _time_column(frame[columns.time], columns.time)
    problems = [p for p in (bad_id, bad_prompt, bad_gen, bad_time) if p is not None]
    if problems:
        first = min(problems, key=lambda p: p.row)
        raise InputError(str(path), int(lines[first.row]), first.field, first.message)
    if pending is not None:
        raise pending
    if len(frame) == 0:
        raise InputError(str(path), None, None, "no requests (empty file)")
    return Bucket(name=name, source=str(path), request_ids=ids, prompt_len=prompt, gen_len=gen, lines=lines,
                  arrival_s=arrival)


def _plain(value):
    """A numpy scalar as the Python value it holds (so messages never say np.float64(...))."""
    return value.item() if isinstance(value, np.generic) else value


def shown(value) -> str:
    """A length cell as the user wrote it: integral floats without '.0', text quoted."""
    value = _plain(value)
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e16:
        return str(int(value))
    text = repr(value)  # cut past SHOWN_CHARS: a 4,000-digit length stays a one-line message
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS - 3] + "..."


def _length_column(col: pd.Series, field: str) -> tuple[np.ndarray, _Problem | None]:
    """A length column as int64, or the first row that is missing, not an integer or out of range."""
    values = col.to_numpy()
    n = len(values)
    kind = values.dtype.kind
    if kind in "iu":
        numeric, missing, nonint = values, np.zeros(n, bool), np.zeros(n, bool)
    elif kind == "f":  # nulls arrive as objects (see _pandas_column): a NaN here was written as NaN
        numeric, missing = values, np.zeros(n, bool)
        with np.errstate(invalid="ignore"):
            nonint = ~(np.isfinite(values) & (values == np.floor(values)))
    elif kind == "b":
        numeric, missing, nonint = np.zeros(n), np.zeros(n, bool), np.ones(n, bool)
    else:
        numeric, missing, nonint = _object_numbers(col)
    long = np.fromiter((isinstance(v, LongInteger) for v in values), bool, n) if kind == "O" else np.zeros(n, bool)
    nonint &= ~long
    ok = ~missing & ~nonint & ~long
    with np.errstate(invalid="ignore"):
        low = ok & (numeric < 1)
        high = ok & (numeric > MAX_LEN)
    problem = _first_problem(field, [
        (missing, lambda k: "missing"),
        (nonint, lambda k: f"expected an integer, got {shown(values[k])}"),
        (low, lambda k: f"must be a positive integer, got {shown(values[k])}"),
        (high, lambda k: f"must be at most {MAX_LEN}, got {shown(values[k])}"),
        (long, lambda k: ("must be a positive integer" if values[k].startswith("-") else f"must be at most {MAX_LEN}")
                         + f", got {spelled(str(values[k]))} ({len(values[k].partition('.')[0].lstrip('-'))} digits)"),
    ])
    return (numeric.astype(np.int64), None) if problem is None else (np.zeros(0, np.int64), problem)


def _first_problem(field: str, checks: list[tuple[np.ndarray, Callable[[int], str]]]) -> _Problem | None:
    """The first row any check flags, described by the first check (in priority order) that flags it.

    Only that one row's message is ever built, so a million bad rows cost no more
    than one.
    """
    bad = np.logical_or.reduce([mask for mask, _ in checks])
    if not bad.any():
        return None
    k = int(np.argmax(bad))
    return _Problem(k, field, next(describe(k) for mask, describe in checks if mask[k]))


def _object_numbers(col: pd.Series) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(numbers, missing, not-an-integer) for a column of Python objects.

    Only the slow JSON path and CSV columns with a non-numeric cell get here; an
    all-integer column is recognised by pandas' C-level type inference and converted
    without looking at each cell from Python.
    """
    missing = col.isna().to_numpy()
    if pd.api.types.infer_dtype(col, skipna=True) == "integer":
        return _floats(col.where(~missing, 0)), missing, np.zeros(len(col), bool)
    values = col.to_numpy()
    # Only numbers are lengths: not text ("12"), bytes, booleans or exponent-spelled floats (1e3).
    number = np.fromiter((isinstance(v, (int, float, Decimal, np.number)) and not isinstance(v, (bool, np.bool_))
                          for v in values), bool, len(values))
    numeric = _floats(col.where(number & ~missing, np.nan))
    whole = np.fromiter((isinstance(v, (int, np.integer)) for v in values), bool, len(values))  # +-inf: too large
    with np.errstate(invalid="ignore"):
        nonint = ~missing & (~number | (~whole & (~np.isfinite(numeric) | (numeric != np.floor(numeric)))))
    return numeric, missing, nonint


def _floats(col: pd.Series) -> np.ndarray:
    """Numbers of an object column as float64; an integer past float range (a JSON length of 400 digits) is
    +-inf, as ``as_float`` makes it, so the range check names it (pandas raises OverflowError)."""
    try:
        return pd.to_numeric(col, errors="coerce").to_numpy(dtype=np.float64)
    except OverflowError:
        return np.fromiter((np.nan if (f := as_float(v)) is None else f for v in col.to_numpy()), np.float64,
                           len(col))


# Arrival times are seconds since the Unix epoch within what the time library holds (pandas' nanosecond
# timestamps: 1677-09-21 to 2262-04-11), so every one can be shown as a date and window arithmetic stays far
# from float64's and int64's ends.
MAX_ARRIVAL_S = float(pd.Timestamp.max.value // 10**9)
NUMBER_TEXT = f"(?:{DECIMAL_TEXT})|(?i:{NONFINITE_TEXT})"  # seconds as text, by the one number grammar


def _time_column(col: pd.Series, field: str) -> tuple[np.ndarray | None, _Problem | None]:
    """The one arrival-time parser: float64 seconds since the Unix epoch, or the first bad row in file order.

    Numbers are seconds; text is seconds spelled by the one number grammar (``model.base.numbers``: ASCII
    digits, so ``1_0`` is no time) or an ISO 8601 timestamp (a timestamp without a zone counts as UTC); typed
    times come as seconds from ``_time_values``.  A time must be finite after its conversion and within
    +-``MAX_ARRIVAL_S``; how far apart the times lie is the window builder's check
    (``model.domain.windowing.windowed``).
    """
    n = len(col)
    kind = col.dtype.kind
    if kind == "M":  # a pandas datetime column
        missing = col.isna().to_numpy()
        seconds = _epoch_seconds(col)
        bad = np.zeros(n, bool)
    elif kind in "iuf":
        seconds = col.to_numpy(dtype=np.float64)
        missing = np.zeros(n, bool)
        bad = ~np.isfinite(seconds)
    else:
        seconds, missing, bad = _object_times(col)
    with np.errstate(invalid="ignore"):
        far = ~missing & ~bad & ~(np.abs(seconds) <= MAX_ARRIVAL_S)
    problem = _first_problem(field, [
        (missing, lambda k: "missing"),
        (bad, lambda k: f"expected a time in seconds or an ISO 8601 timestamp, got {spelled(col.iloc[k])}"),
        (far, lambda k: f"must lie within {MAX_ARRIVAL_S:.0f} s of 1970-01-01 (the years 1677 to 2262; seconds, "
                        f"not milliseconds), got {spelled(col.iloc[k])}"),
    ])
    return (seconds, None) if problem is None else (None, problem)


def _epoch_seconds(stamps: pd.Series) -> np.ndarray:
    """Seconds since the epoch of a datetime Series in whatever unit pandas chose (it keeps seconds for the year
    3000, where nanoseconds would overflow; subtracting a nanosecond epoch raised OutOfBoundsDatetime); NaN for
    NaT."""
    values = stamps.dt.tz_convert(None).to_numpy() if stamps.dt.tz is not None else stamps.to_numpy()
    unit = np.datetime_data(values.dtype)[0]
    ticks = values.view(np.int64)
    out = ticks.astype(np.float64) / _TIME_UNITS[unit]
    out[np.isnat(values)] = np.nan
    return out


def _object_times(col: pd.Series) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(seconds, missing, unreadable) of a time column of Python values: ASCII decimal text or ISO 8601 text
    (vectorised: a CSV's times are all text), and numbers (the JSON slow path; a float spelled with an
    exponent too)."""
    n = len(col)
    values = col.to_numpy()
    is_text = np.fromiter((isinstance(v, str) for v in values), bool, n)
    at = np.flatnonzero(is_text)  # positions of the text cells
    text = pd.Series(values[at], dtype=object).astype(str)
    blank = text.str.strip().str.lower().isin(("", "nan", "null", "none")).to_numpy()
    missing = col.isna().to_numpy().copy()
    missing[at[blank]] = True
    seconds = np.full(n, np.nan)
    at, text = at[~blank], text[~blank]
    decimal = text.str.fullmatch(NUMBER_TEXT).to_numpy(dtype=bool)
    if decimal.any():
        seconds[at[decimal]] = text[decimal].astype(np.float64).to_numpy()  # float(): 400 digits are inf, no error
    if (~decimal).any():
        seconds[at[~decimal]] = _epoch_seconds(pd.to_datetime(text[~decimal], format="ISO8601", utc=True,
                                                              errors="coerce"))
    for i in np.flatnonzero(~is_text & ~missing):  # rare: numbers from the JSON slow path
        v = values[i]
        value = as_float(v.text if isinstance(v, Spelled) else v, text=True)
        if isinstance(v, Decimal) and v.is_finite():
            value = float(v)
        if value is not None:
            seconds[i] = value
    with np.errstate(invalid="ignore"):
        bad = ~missing & ~np.isfinite(seconds)
    return seconds, missing, bad


def _integral_id(value):
    """An integral float id as the integer it spells (the fast path reads [1, 2.5] as 1.0, 2.5)."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _id_column(col: pd.Series, field: str, lines: np.ndarray) -> tuple[np.ndarray, _Problem | None]:
    """Ids as strings; integers are accepted and stringified, as plan files do.

    Fractional numbers, booleans and nested values are refused (they have no one
    spelling as text), and so are missing, empty and duplicate ids.
    """
    kind = col.dtype.kind
    missing = col.isna().to_numpy() if kind == "O" else np.zeros(len(col), bool)
    text = col
    if kind in "iu" or (kind == "O" and pd.api.types.infer_dtype(col, skipna=True) in ("string", "integer", "empty")):
        odd = np.zeros(len(col), bool)
    elif kind == "f":  # pyarrow reads [1, 2.5] as doubles: only the 2.5 is wrong
        values = col.to_numpy()
        with np.errstate(invalid="ignore"):
            odd = ~(np.isfinite(values) & (values == np.floor(values)))
        text = pd.Series(np.where(odd, 0, values).astype(np.int64))
    elif kind == "O":
        values = np.empty(len(col), dtype=object)  # filled cell by cell: equal-length lists must stay cells
        for i, v in enumerate(col.to_numpy()):
            values[i] = _integral_id(v)
        odd = ~missing & np.fromiter((not isinstance(v, (str, int)) or isinstance(v, bool) for v in values),
                                     bool, len(values))
        text = pd.Series(values)
    else:
        odd = np.ones(len(col), bool)
    ids = text.astype(str)
    if not (missing.any() or odd.any()) and pd.Index(ids).is_unique and not (ids.str.len() == 0).any():
        return ids.to_numpy(dtype=object), None
    problem = _first_problem(field, [
        (missing, lambda k: "missing"),
        (odd, lambda k: f"expected a string or integer id, got {_plain(col.iloc[k])!r}"),
        ((ids.str.len() == 0).to_numpy(), lambda k: "must not be empty"),
        (ids.duplicated().to_numpy() & ~missing & ~odd, lambda k: f"duplicate id {ids.iloc[k]!r} "
                                                                 f"(first on line {int(lines[_first_equal(ids, k)])})"),
    ])
    return (ids.to_numpy(dtype=object), None) if problem is None else (np.zeros(0, object), problem)


def _first_equal(values: pd.Series, k: int) -> int:
    """Row of the first value equal to row k's (where a duplicate was first seen)."""
    return int(np.argmax((values == values.iloc[k]).to_numpy()))


HASH_CHUNK = 1 << 20


def id_hash(ids: np.ndarray) -> np.ndarray:
    """A 64-bit hash of each id's text (pandas' SipHash); equal ids hash alike, different ids rarely do: a match
    by hash is a candidate, confirmed by comparing the text.  Hashed a chunk at a time: the hasher encodes every
    string of its input at once (0.8 GB of scratch for 10^7 ids)."""
    ids = np.asarray(ids, dtype=object)
    return np.concatenate([np.zeros(0, np.uint64)] + [pd.util.hash_array(ids[lo:lo + HASH_CHUNK], categorize=False)
                                                      for lo in range(0, len(ids), HASH_CHUNK)])
