"""scenario.toml: the contract of ``shared/workloads`` (extended, never broken).

Known keys -- top level: ``max_shapes`` (required), optional ``mode``
(reference|strict), ``max_seq_len`` (largest shape the accelerator allows),
``max_batch_size``, ``cost_model`` (a table of coefficient overrides, or a path to
a TOML file of them).  Each ``[[bucket]]``: ``name``, ``requests`` (path relative
to the scenario), optional limits ``max_cost``, ``max_pad_ratio``,
``max_p95_latency_ms``, ``max_sequential_ms``, and for CSV/Parquet sources
``format``, ``prompt_column``, ``gen_column``, ``id_column`` (or ``columns`` preset).
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from model.cost.analytic import CostParams
from model.cost.common import MODES
from model.errors import InputError
from model.load.names import check_name
from model.load.requests import PRESETS, Columns, load_requests
from model.schema import Limits, Scenario

TOP_KEYS = {"max_shapes", "mode", "max_seq_len", "max_batch_size", "cost_model", "bucket", "name", "description"}
LIMIT_KEYS = ("max_cost", "max_pad_ratio", "max_p95_latency_ms", "max_sequential_ms")
BUCKET_KEYS = {"name", "requests", "format", "prompt_column", "gen_column", "id_column", "columns", *LIMIT_KEYS}


def _toml_lines(text: str) -> list[tuple[int, int | None, str, str]]:
    """(line, table, kind, name) for every header and ``key =`` line of a TOML text.

    ``table`` is None at the top level, k inside the k-th ``[[bucket]]`` and -1 in any
    other table; ``kind`` is "header" or "key".  Lets errors point at the exact line
    of the key in ITS table (the second bucket's ``max_cost``, not the first's).
    Best effort: keys inside multi-line values or inline tables are not followed.
    """
    out: list[tuple[int, int | None, str, str]] = []
    current: int | None = None
    buckets = -1
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if stripped.startswith("["):
            header = stripped.split("#", 1)[0].strip()
            name = header.strip("[]").strip()
            is_bucket = header.startswith("[[") and name == "bucket"
            buckets += is_bucket
            out.append((number, current, "header", name))
            current = buckets if is_bucket else -1
        elif "=" in stripped and not stripped.startswith("#"):
            out.append((number, current, "key", stripped.split("=", 1)[0].strip().strip('"')))
    return out


def _key_line(text: str, key: str, table: int | None = None) -> int | None:
    """Line of ``key = ...`` in the top level (or a top-level ``[key]`` header) or in bucket ``table``."""
    for number, where, kind, name in _toml_lines(text):
        if name == key and where == table and (kind == "key" or table is None):
            return number
    return None


def _table_line(text: str, index: int) -> int | None:
    """Line of the index-th ``[[bucket]]`` header, where bucket-level errors point."""
    headers = [number for number, _, kind, name in _toml_lines(text) if kind == "header" and name == "bucket"]
    return headers[index] if index < len(headers) else None


def _positive_int(path: str, text: str, key: str, value) -> int:
    """A top-level count such as max_shapes: an integer >= 1 (booleans are not counts)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(path, _key_line(text, key), key, f"must be a positive integer, got {value!r}")
    return value


def _toml_error(path: Path, exc: tomllib.TOMLDecodeError) -> InputError:
    """A TOML syntax error with its line moved into the file:line prefix.

    Python 3.11's tomllib only says "(at line N, column M)" inside the message.
    """
    message = str(exc)
    m = re.search(r" \(at line (\d+), column (\d+)\)$", message)
    if m is None:
        return InputError(str(path), getattr(exc, "lineno", None), None, f"malformed TOML: {message}")
    return InputError(str(path), int(m.group(1)), None,
                      f"malformed TOML: {message[:m.start()]} (column {m.group(2)})")


def load_scenario(path: str | Path, load: bool = True) -> Scenario:
    """Parse a scenario and (by default) load and validate every bucket's requests."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise InputError(str(path), None, None, f"cannot read: {exc.strerror or exc}") from exc
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise _toml_error(path, exc) from None
    src = str(path)
    for key in data:
        if key not in TOP_KEYS:
            raise InputError(src, _key_line(text, key), key, "unknown scenario key")
    if "max_shapes" not in data:
        raise InputError(src, None, "max_shapes", "missing")
    max_shapes = _positive_int(src, text, "max_shapes", data["max_shapes"])
    mode = data.get("mode", "reference")
    if mode not in MODES:
        raise InputError(src, _key_line(text, "mode"), "mode", f"must be one of {', '.join(MODES)}, got {mode!r}")
    max_seq_len = data.get("max_seq_len")
    if max_seq_len is not None:
        max_seq_len = _positive_int(src, text, "max_seq_len", max_seq_len)
        if max_seq_len % 64:
            raise InputError(src, _key_line(text, "max_seq_len"), "max_seq_len",
                             f"must be a multiple of 64, got {max_seq_len}")
    max_batch = data.get("max_batch_size")
    if max_batch is not None:
        max_batch = _positive_int(src, text, "max_batch_size", max_batch)
    params = _cost_params(path, data.get("cost_model"))
    buckets_raw = data.get("bucket")
    if not isinstance(buckets_raw, list) or not buckets_raw:
        raise InputError(src, None, "bucket", "at least one [[bucket]] table is required")
    names, buckets, limits = [], [], []
    for i, raw in enumerate(buckets_raw):
        line = _table_line(text, i)
        for key in raw:
            if key not in BUCKET_KEYS:
                raise InputError(src, _key_line(text, key, i) or line, f"bucket.{key}", "unknown bucket key")
        for key in ("name", "requests"):
            if not isinstance(raw.get(key), str) or not raw.get(key):
                raise InputError(src, line, f"bucket.{key}", "missing (a non-empty string is required)")
        check_name(raw["name"], src, _key_line(text, "name", i) or line, "bucket.name")
        if raw["name"] in names:
            raise InputError(src, line, "bucket.name", f"duplicate bucket name {raw['name']!r}")
        names.append(raw["name"])
        limits.append(_limits(src, text, i, raw))
        if load:
            buckets.append(load_requests(path.parent / raw["requests"], raw["name"], _columns(src, line, raw),
                                         raw.get("format")))
    return Scenario(path=path, max_shapes=max_shapes, names=tuple(names), buckets=tuple(buckets),
                    limits=tuple(limits), params=params, mode=mode, max_seq_len=max_seq_len,
                    max_batch_size=max_batch)


def _limits(src: str, text: str, index: int, raw: dict) -> Limits:
    """Limits of the index-th bucket; each must be a non-negative number (NaN is not one).

    A negative limit can never be met (every metric is >= 0), so it is bad input
    rather than an infeasible problem.
    """
    values = {}
    for key in LIMIT_KEYS:
        if key in raw:
            v = raw[key]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 or v != v:
                raise InputError(src, _key_line(text, key, index) or _table_line(text, index), f"bucket.{key}",
                                 f"must be a non-negative number, got {v!r}")
            values[key] = float(v)
    return Limits(**values)


def _columns(src: str, line: int | None, raw: dict) -> Columns | None:
    """Column mapping from ``columns = "azure"`` or explicit ``*_column`` keys (None: auto)."""
    if "columns" in raw:
        if raw["columns"] not in PRESETS:
            raise InputError(src, line, "bucket.columns", f"unknown preset {raw['columns']!r} ({', '.join(PRESETS)})")
        return PRESETS[raw["columns"]]
    if not any(k in raw for k in ("prompt_column", "gen_column", "id_column")):
        return None
    base = Columns()
    return Columns(raw.get("prompt_column", base.prompt_len), raw.get("gen_column", base.gen_len),
                   raw.get("id_column"))


def _cost_params(path: Path, spec) -> CostParams:
    if spec is None:
        return CostParams()
    if isinstance(spec, str):
        return CostParams.from_toml(path.parent / spec)
    if isinstance(spec, dict):
        return CostParams.from_mapping(spec, f"{path} [cost_model]")
    raise InputError(str(path), None, "cost_model", "must be a table or a path to a TOML file")
