"""Measured step times: the CSV a profiler writes and the calibration fits.

One row per timed step::

    phase,batch_size,seq_len,ms[,weight]
    prefill,4,512,231.7        # prefill of 4 members, each padded to 512 tokens
    decode,64,1024,61.2        # one decode step of 64 members at context length 1024

``seq_len`` is the padded length of every member for a prefill row and the context
length of the step for a decode row.  ``weight`` (optional, blank = 1) scales a
row's say in the fit, e.g. the number of repeats it averages.  Columns may come in
any order; unknown columns are refused so a misspelt ``weight`` is not ignored.
Every bad value is an InputError naming the file and the line.

A per-step timing log with its own column names is read with a column map
(``--columns phase=kind,batch_size=num_seqs,seq_len=context,seconds=elapsed``):
the map names the file's column for each field (``seconds`` instead of ``ms`` for
times in seconds), the file's other columns are ignored, and the phase may be
spelt as the stacks log it (``prompt``, ``context_encoding``, ``token_generation``, ...).
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from model.base.errors import InputError
from model.base.numbers import Where, as_float, read_count, read_number, shown
from model.load.files import read_text

PHASES = ("prefill", "decode")
REQUIRED = ("phase", "batch_size", "seq_len", "ms")
OPTIONAL = ("weight",)
# how serving logs and benchmarks name the two phases (a column map accepts any of these)
PHASE_NAMES = {"prefill": "prefill", "prompt": "prefill", "context": "prefill", "context_encoding": "prefill",
               "cte": "prefill", "decode": "decode", "decoding": "decode", "generate": "decode",
               "token_generation": "decode", "tkg": "decode"}
MAP_FIELDS = REQUIRED + OPTIONAL + ("seconds",)
MAX_INT = 2**20  # batch sizes and lengths far beyond any device; keeps n*s^2 (< 2**60) exact in int64
# A timed step between a nanosecond and about eleven days: outside that the number is a unit mistake, and the fit
# divides by ms and squares its inverse (a subnormal ms made the SVD fail, 1e308 made R^2 NaN).
MIN_MS, MAX_MS = 1e-6, 1e9
# A row counts at most a billion times more or less than another: beyond that float64's least squares cannot
# tell the rows apart (a weight of 1e308 overflowed the design into a "singular" one).
MIN_WEIGHT, MAX_WEIGHT = 1e-9, 1e9


@dataclass(frozen=True, eq=False)
class Measurements:
    """Rows of a measurement file as arrays (file order), each row's line kept for messages."""

    source: str
    phase: np.ndarray       # str objects, "prefill" | "decode"
    batch_size: np.ndarray  # int64 >= 1
    seq_len: np.ndarray     # int64 >= 1
    ms: np.ndarray          # float64 > 0
    weight: np.ndarray      # float64 >= 0
    line: np.ndarray        # int64, 1-based line in the source

    def __len__(self) -> int:
        return len(self.ms)

    def of(self, phase: str) -> Measurements:
        """The rows of one phase, order kept."""
        return self.subset(self.phase == phase)

    def subset(self, keep: np.ndarray) -> Measurements:
        """The rows where the boolean mask ``keep`` is True, order kept."""
        return Measurements(self.source, self.phase[keep], self.batch_size[keep], self.seq_len[keep],
                            self.ms[keep], self.weight[keep], self.line[keep])


def read_measurements(path: str | Path, columns: dict[str, str] | None = None) -> Measurements:
    """Parse a measurement CSV; the first bad row (or a bad header) is an InputError with its line."""
    path = Path(path)
    src = str(path)
    return parse_measurements(read_text(path, bom=True, folder="is a directory, expected a measurements CSV file"),
                              src, columns)  # a regular UTF-8 file, recorded as an input


def parse_column_map(text: str, flag: str = "--columns") -> dict[str, str]:
    """``FIELD=COLUMN,...`` -> {field: the file's column}: phase, batch_size, seq_len, ms or seconds, weight."""
    out: dict[str, str] = {}
    for part in text.split(","):
        field, eq, column = (x.strip() for x in part.partition("="))
        if not eq or not column:
            raise InputError(flag, None, None, f"expected FIELD=COLUMN pairs separated by commas "
                             f"(fields: {', '.join(MAP_FIELDS)}), got {text!r}")
        if field not in MAP_FIELDS:
            raise InputError(flag, None, None, f"unknown field {field!r} (fields: {', '.join(MAP_FIELDS)})")
        if field in out:
            raise InputError(flag, None, None, f"field {field!r} given twice")
        out[field] = column
    if "ms" in out and "seconds" in out:
        raise InputError(flag, None, None, "give ms=COLUMN or seconds=COLUMN, not both")
    missing = [f for f in ("phase", "batch_size", "seq_len") if f not in out]
    if "ms" not in out and "seconds" not in out:
        missing.append("ms (or seconds)")
    if missing:
        raise InputError(flag, None, None, f"the map needs {', '.join(missing)}, got {text!r}")
    return out


def parse_measurements(text: str, source: str, column_map: dict[str, str] | None = None) -> Measurements:
    """Measurements from CSV text (``source`` names it in messages); ``column_map`` as from parse_column_map."""
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    columns: dict[str, int] | None = None
    header_line = None
    rows: list[tuple[str, int, int, float, float, int]] = []
    start = 1  # the line the row being read starts on (a quoted field may run over lines)
    try:
        for cells in reader:
            number = reader.line_num
            start = number + 1
            cells = [c.strip() for c in cells]
            if not any(cells):
                continue
            if columns is None:
                columns = (_header(cells, source, number) if column_map is None else
                           _mapped_header(cells, column_map, source, number))
                header_line, width = number, len(cells)
                continue
            if len(cells) != width:
                raise InputError(source, number, None,
                                 f"expected {width} fields like the header (line {header_line}), "
                                 f"got {len(cells)}")
            rows.append(_row(cells, columns, source, number, column_map is not None))
    except csv.Error as exc:
        if "unexpected end of data" in str(exc):  # the rest of the file was read into one quoted field
            raise InputError(source, start, None, "malformed CSV: a quote opened on this line is never closed") \
                from None
        raise InputError(source, reader.line_num or None, None, f"malformed CSV: {exc}") from None
    if columns is None:
        raise InputError(source, None, None, "empty file: expected a header " + ",".join(REQUIRED))
    if not rows:
        raise InputError(source, header_line, None, "no measurements after the header")
    phase, n, s, ms, w, line = zip(*rows, strict=True)
    return Measurements(source, np.array(phase, dtype=object), np.array(n, dtype=np.int64),
                        np.array(s, dtype=np.int64), np.array(ms, dtype=np.float64),
                        np.array(w, dtype=np.float64), np.array(line, dtype=np.int64))


def _header(cells: list[str], source: str, number: int) -> dict[str, int]:
    """Column positions by name; every required column present, none unknown or repeated."""
    known = REQUIRED + OPTIONAL
    for i, name in enumerate(cells):
        if name not in known:
            raise InputError(source, number, name, f"unknown column (expected {', '.join(known)}; a timing log with "
                             "its own column names needs --columns phase=COL,batch_size=COL,seq_len=COL,ms=COL)")
        if name in cells[:i]:
            raise InputError(source, number, name, "column given twice")
    for name in REQUIRED:
        if name not in cells:
            raise InputError(source, number, name, f"missing column (the header needs {', '.join(REQUIRED)})")
    return {name: i for i, name in enumerate(cells)}


def _mapped_header(cells: list[str], column_map: dict[str, str], source: str, number: int) -> dict[str, int]:
    """Column positions of a per-step log by the map (the file's other columns are ignored)."""
    out = {}
    for field, name in column_map.items():
        if cells.count(name) > 1:
            raise InputError(source, number, name, "column given twice: the map cannot tell which one")
        if name not in cells:
            found = ", ".join(cells[:12]) + (", ..." if len(cells) > 12 else "")
            raise InputError(source, number, name, f"no such column for {field} in --columns (the header has: "
                             f"{found})")
        out[field] = cells.index(name)
    return out


def _row(cells: list[str], columns: dict[str, int], source: str, number: int, mapped: bool = False
         ) -> tuple[str, int, int, float, float, int]:
    """One data row checked on its own: (phase, batch_size, seq_len, ms, weight, line)."""
    phase = cells[columns["phase"]]
    if mapped and phase.lower() in PHASE_NAMES:
        phase = PHASE_NAMES[phase.lower()]
    if phase not in PHASES:
        expected = ", ".join(PHASE_NAMES) if mapped else "prefill or decode"
        raise InputError(source, number, "phase", f"unknown phase {phase!r} (expected {expected})")
    n = _positive_int(cells[columns["batch_size"]], Where(source, number, "batch_size"))
    s = _positive_int(cells[columns["seq_len"]], Where(source, number, "seq_len"))
    if "seconds" in columns:
        seconds = _number(cells[columns["seconds"]], Where(source, number, "seconds"), MAX_MS / 1000)
        ms = seconds * 1000.0
        if ms < MIN_MS:
            raise InputError(source, number, "seconds", f"must be at least {MIN_MS / 1000:g} (a nanosecond), "
                             f"got {cells[columns['seconds']]!r}")
        return phase, n, s, ms, _weight(cells, columns, source, number), number
    ms = _number(cells[columns["ms"]], Where(source, number, "ms"), MAX_MS)
    if ms < MIN_MS:
        raise InputError(source, number, "ms", f"must be positive (the fit weighs relative error), got {ms!r}"
                         if ms == 0 else f"must be at least {MIN_MS:g} (a nanosecond), got {cells[columns['ms']]!r}")
    return phase, n, s, ms, _weight(cells, columns, source, number), number


def _weight(cells: list[str], columns: dict[str, int], source: str, number: int) -> float:
    """The optional weight of a row (blank or absent: 1)."""
    weight = 1.0
    if "weight" in columns and cells[columns["weight"]]:
        weight = _number(cells[columns["weight"]], Where(source, number, "weight"), MAX_WEIGHT)
        if 0 < weight < MIN_WEIGHT:
            raise InputError(source, number, "weight",
                             f"must be 0 or at least {MIN_WEIGHT:g}, got {cells[columns['weight']]!r}")
    return weight


def _positive_int(cell: str, where: Where) -> int:
    """A count such as batch_size: ASCII digits from 1 up (``2.0``, ``1e3``, ``1_0`` are refused, not read)."""
    return read_count(cell, where, 1, MAX_INT, too_big="must be a positive integer up to {high}, got {got}", text=True)


def _number(cell: str, where: Where, high: float) -> float:
    """A finite non-negative ASCII decimal number up to ``high`` (above it the number is a unit mistake)."""
    if as_float(cell, text=True) is None:
        raise where.error(f"must be a number, got {shown(cell)}")
    return read_number(cell, where, high=high, too_big="must be at most {high}, got {got}", text=True)


def measurements_csv(m: Measurements) -> str:
    """The CSV text of measurements (weight column only when some weight is not 1); floats round-trip."""
    weighted = bool((m.weight != 1.0).any())
    head = ",".join(REQUIRED + (OPTIONAL if weighted else ()))
    lines = [head]
    for i in range(len(m)):
        row = f"{m.phase[i]},{int(m.batch_size[i])},{int(m.seq_len[i])},{float(m.ms[i])!r}"
        lines.append(row + (f",{float(m.weight[i])!r}" if weighted else ""))
    return "\n".join(lines) + "\n"


def concatenated(parts: list[Measurements], source: str) -> Measurements:
    """The rows of several files as one set (file order kept; each row keeps its own line)."""
    if len(parts) == 1:
        return parts[0]
    return Measurements(source, *(np.concatenate([getattr(m, name) for m in parts])
                                  for name in ("phase", "batch_size", "seq_len", "ms", "weight", "line")))
