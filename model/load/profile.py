"""Device profiles from TOML: a ``[device]`` table in its own file or inline in a scenario.

Every problem is an InputError naming the file, the line of the offending key and
the key, because a profile is hand-edited or machine-written and a silently ignored
typo (``decode_larg = ...``) would price every plan with the wrong device.  Line
numbers come from the scenario loader's TOML line index, so both files point at
lines the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

from model.base.errors import InputError
from model.base.numbers import Where, read_count, read_number, shown
from model.cost.device import AUTO_BUCKETS, DeviceProfile, checked_buckets
from model.load.files import read_text
from model.load.server import SERVER_TABLE, ServerTable, server_table
from model.load.toml_lines import parse_toml, table_key_line, toml_lines

TABLE = "device"
COEFFICIENT_KEYS = {"prefill": "[p0, p1, p2]", "decode": "[d0, d1, d2]", "decode_large": "[d0, d1, d2]"}
NUMBER_KEYS = ("batch_overhead_ms", "compile_ms", "cost_per_device_hour", "runtime_compile_ms")
COUNT_KEYS = ("decode_large_from", "kv_capacity_tokens")
LIST_KEYS = ("batch_buckets",)  # compiled batch sizes: strictly increasing positive integers
KEYS = ("name", *COEFFICIENT_KEYS, *NUMBER_KEYS, *COUNT_KEYS, *LIST_KEYS)
REQUIRED = ("prefill", "decode", "compile_ms")
PAIRED = ("decode_large", "decode_large_from")
MAX_COUNT = 2**53  # counts are compared with int64 token totals; anything larger is a typo
# A time (ms) or price above a trillion is a unit mistake; the cap also keeps every plan's total finite in float64
# (the largest batch, 2**31 members at 2**20 tokens, takes p2 * 2**71 ms), where 1e308 made it inf and numpy warn.
MAX_VALUE = 1e12
TOO_BIG = "must be at most {high}, got {got}"

LineOf = Callable[[str, str], "int | None"]


def device_key_line(text: str, key: str) -> int | None:
    """Line of ``key`` inside the ``[device]`` table of a TOML text; for key "device", the table's own line."""
    return table_key_line(text, TABLE, key)


def load_profile(path: str | Path) -> DeviceProfile:
    """Read and check a device-profile TOML file: its ``[device]`` table (an optional ``[server]`` is checked too).

    ``name`` defaults to the file's stem, so reports can always say which device priced a plan.
    """
    return load_profile_file(path)[0]


def load_profile_file(path: str | Path) -> tuple[DeviceProfile, ServerTable | None]:
    """A profile file's ``[device]`` table and its optional ``[server]`` table (serving mode's settings).

    The server table is checked key by key whoever reads the file, so a typo there is
    an error for the planner too, not a setting that silently waits for the replay.
    """
    path = Path(path)
    src = str(path)
    # a regular UTF-8 file (a bad byte named by line), recorded as an input
    text = read_text(path, folder="is a directory, expected a device-profile TOML file")
    data = parse_toml(path, text)
    for key in data:
        if key not in (TABLE, SERVER_TABLE):
            raise InputError(src, _top_line(text, key), key, f"unknown key (a profile holds a [{TABLE}] table "
                             f"and an optional [{SERVER_TABLE}] table)")
    if TABLE not in data:
        raise InputError(src, None, TABLE, f"missing [{TABLE}] table")
    profile = profile_from_table(data[TABLE], src, text, default_name=path.stem)
    server = server_table(data[SERVER_TABLE], src, text) if SERVER_TABLE in data else None
    return profile, server


def _top_line(text: str, key: str) -> int | None:
    """Line of a top-level key, dotted key or table header named ``key`` (wherever the header sits)."""
    for number, where, kind, name in toml_lines(text):
        if name.split(".", 1)[0] == key and (kind == "header" or where is None):
            return number
    return None


def profile_from_table(table: object, source: str, text: str, line_of: LineOf = device_key_line,
                       default_name: str = "") -> DeviceProfile:
    """Check a parsed ``[device]`` table and build its profile.

    ``text`` is the TOML text the table came from and ``line_of(text, key)`` the line of
    one of its keys (``line_of(text, "device")``: the table itself), so a scenario with
    an inline ``[device]`` table gets the same messages as a profile file.
    """
    table_line = line_of(text, TABLE)

    def where(key: str, at: str | None = None) -> Where:
        return Where(source, line_of(text, at or key) or table_line, f"{TABLE}.{key}")

    def fail(key: str, message: str, at: str | None = None) -> InputError:
        return where(key, at).error(message)

    if not isinstance(table, Mapping):
        raise InputError(source, table_line, TABLE, f"must be a table, got {shown(table)}")
    for key in table:
        if key not in KEYS:
            raise fail(key, f"unknown device-profile key (known: {', '.join(KEYS)})")
    for key in REQUIRED:
        if key not in table:
            raise InputError(source, table_line, f"{TABLE}.{key}", "missing (required)")
    for present, absent in (PAIRED, PAIRED[::-1]):
        if present in table and absent not in table:
            raise fail(absent, f"missing: {present} is given, and the two go together", at=present)
    values: dict[str, object] = {}
    for key, value in table.items():
        if key == "name":
            if not isinstance(value, str):
                raise fail(key, f"must be a string, got {shown(value)}")
            values[key] = value
        elif key in COEFFICIENT_KEYS:
            values[key] = _coefficients(value, COEFFICIENT_KEYS[key], where(key))
        elif key in LIST_KEYS and value == AUTO_BUCKETS:
            values["auto_buckets"] = True
        elif key in LIST_KEYS:
            values[key] = buckets_value(value, lambda m, k=key: fail(k, m))
        elif key in NUMBER_KEYS:
            values[key] = read_number(value, where(key), high=MAX_VALUE, too_big=TOO_BIG)
        else:
            values[key] = read_count(value, where(key), 1, MAX_COUNT)
    values.setdefault("name", default_name)
    try:
        return DeviceProfile(**values)
    except ValueError as exc:  # every check above should have caught it first
        raise InputError(source, table_line, TABLE, str(exc)) from None


def buckets_value(value: object, fail: Callable[[str], InputError]) -> tuple[int, ...]:
    """``batch_buckets = [1, 2, 4, ...]``: strictly increasing positive integers, each at most MAX_COUNT (a
    profile's key and a scenario's share this check, each naming its own file, line and key)."""
    if not isinstance(value, list):
        raise fail(f"must be a list of batch sizes like [1, 2, 4, 8] or \"{AUTO_BUCKETS}\", got {shown(value)}")
    for v in value:
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_COUNT:
            raise fail(f"every batch size must be a positive integer, got {shown(v)}")
    try:
        return checked_buckets(value)
    except ValueError as exc:
        raise fail(str(exc)) from None


def _coefficients(value: object, form: str, where: Where) -> tuple[float, float, float]:
    """Three finite non-negative numbers (step times only ever grow with work); booleans are not numbers here
    (``true`` is a typo, not 1), and an integer too large for a float is refused like inf."""
    if not isinstance(value, list) or len(value) != 3:
        got = f"{len(value)} values" if isinstance(value, list) else shown(value)
        raise where.error(f"expected 3 numbers {form}, got {got}")
    return tuple(read_number(v, where, high=MAX_VALUE, message=f"value {i + 1} of {form} must be a finite non-negative "
                             "number, got {got}", too_big=f"value {i + 1} of {form} {TOO_BIG}")
                 for i, v in enumerate(value))  # type: ignore[return-value]


