"""Line numbers for TOML errors: where a key or table sits, so every message can name file:line:key.

Python's tomllib reports values, not positions; these helpers find the line of a key
in its own table (the second bucket's ``max_cost``, not the first's) and move a
syntax error's line into the ``file:line`` prefix.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from model.base.errors import InputError
from model.load.files import read_text


def toml_lines(text: str) -> list[tuple[int, int | str | None, str, str]]:
    """(line, table, kind, name) for every header and ``key =`` line of a TOML text.

    ``table`` is None at the top level, k inside the k-th ``[[bucket]]`` and the header's
    name inside any other table (``"cost_model"`` in ``[cost_model]``); ``kind`` is
    "header" or "key".  Lets errors point at the exact line of the key in ITS table (the
    second bucket's ``max_cost``, not the first's).
    Best effort: keys inside multi-line values or inline tables are not followed.
    """
    out: list[tuple[int, int | str | None, str, str]] = []
    current: int | str | None = None
    buckets = -1
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if stripped.startswith("["):
            header = stripped.split("#", 1)[0].strip()
            name = header.strip("[]").strip()
            is_bucket = header.startswith("[[") and name == "bucket"
            buckets += is_bucket
            out.append((number, current, "header", name))
            current = buckets if is_bucket else name
        elif "=" in stripped and not stripped.startswith("#"):
            out.append((number, current, "key", stripped.split("=", 1)[0].strip().strip('"')))
    return out


def key_line(text: str, key: str, table: int | str | None = None) -> int | None:
    """Line of ``key = ...`` in the top level (or a top-level ``[key]`` header), a bucket or a named table."""
    for number, where, kind, name in toml_lines(text):
        if name == key and where == table and (kind == "key" or table is None):
            return number
    return None


def table_key_line(text: str, table: str, key: str) -> int | None:
    """Line of ``key`` inside the top-level table ``table``; for key == table, the table's own line.

    Follows ``[table]`` headers, ``table.key = ...`` dotted keys at the top level and
    ``[table.key]`` sub-table headers; an inline ``table = {...}`` is found as a whole
    (its keys are not followed, as in the scenario loader).
    """
    table_at = None
    in_table = False
    for number, where, kind, name in toml_lines(text):
        if kind == "header":
            in_table = name == table
            if name == f"{table}.{key}":
                return number
            if in_table and table_at is None:
                table_at = number
        elif where is None and name == f"{table}.{key}":
            return number
        elif where is None and (name == table or name.startswith(f"{table}.")) and table_at is None:
            table_at = number
        elif in_table and name == key:
            return number
    return table_at if key == table else None


def table_line(text: str, index: int) -> int | None:
    """Line of the index-th ``[[bucket]]`` header, where bucket-level errors point."""
    headers = [number for number, _, kind, name in toml_lines(text) if kind == "header" and name == "bucket"]
    return headers[index] if index < len(headers) else None


def toml_error(path: Path, exc: tomllib.TOMLDecodeError) -> InputError:
    """A TOML syntax error with its line moved into the file:line prefix.

    Python 3.11's tomllib only says "(at line N, column M)" inside the message.
    """
    message = str(exc)
    m = re.search(r" \(at line (\d+), column (\d+)\)$", message)
    if m is None:
        return InputError(str(path), getattr(exc, "lineno", None), None, f"malformed TOML: {message}")
    return InputError(str(path), int(m.group(1)), None,
                      f"malformed TOML: {message[:m.start()]} (column {m.group(2)})")


def read_toml(path: Path) -> tuple[str, dict]:
    """The text and the parsed table of a TOML file; unreadable or malformed files are InputErrors."""
    text = read_text(path)  # a regular UTF-8 file (a bad byte named by line), recorded as an input
    return text, parse_toml(path, text)


def parse_toml(path: Path, text: str) -> dict:
    """tomllib's table of a file's text; malformed text is an InputError (nesting that exhausts tomllib's
    recursion, ``a = [[[[...`` 100,000 deep, too: it was a RecursionError traceback)."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise toml_error(path, exc) from None
    except RecursionError:
        raise InputError(str(path), None, None, "malformed TOML: nested too deeply") from None
