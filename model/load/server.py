"""The ``[server]`` table of a profile TOML and the flags over it: serving mode's scheduler settings.

A profile describes a device; how a serving stack schedules on it (how many sequences
run at once, the token budget of a step, the KV block size) is what ``[server]`` adds,
so a replay can be rerun from one file.  Every value is checked where it is read, and a
problem names the file, the line and ``server.KEY`` -- or the flag, when a flag set it --
because a silently ignored typo (``max_num_seq = 64``) would judge a graph set under the
wrong server.  Keys that belong to the other stack (``block_size`` with nxdi) are errors
for the same reason: they would do nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from model.base.errors import InputError
from model.domain.server import (
    MAX_BLOCK,
    MAX_COUNT,
    REQUIRED_KEYS,
    SERVER_KEYS,
    STACK_ONLY,
    STACKS,
    ServerSettings,
)
from model.load.toml_lines import table_key_line

SERVER_TABLE = "server"


@dataclass(frozen=True)
class ServerTable:
    """The keys a ``[server]`` table gives (each already checked alone) and the line of each."""

    source: str
    line: int | None  # the table's own line
    values: tuple[tuple[str, object], ...]
    lines: tuple[tuple[str, int | None], ...]

    def get(self, key: str) -> object | None:
        return dict(self.values).get(key)

    def line_of(self, key: str) -> int | None:
        return dict(self.lines).get(key) or self.line


def flag_name(key: str) -> str:
    """The command-line flag that overrides a ``[server]`` key (``max_num_seqs`` -> ``--max-num-seqs``)."""
    return "--" + key.replace("_", "-")


def check_value(key: str, value: object) -> str | None:
    """What is wrong with one setting on its own, or None."""
    if key == "stack":
        return None if isinstance(value, str) and value in STACKS else \
            f"must be one of {', '.join(STACKS)}, got {_show(value)}"
    most = MAX_BLOCK if key == "block_size" else MAX_COUNT
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
        return f"must be a positive integer up to {most}, got {_show(value)}"
    return None


def server_table(table: object, source: str, text: str) -> ServerTable:
    """Check a parsed ``[server]`` table key by key (unknown keys, types, ranges)."""
    table_at = table_key_line(text, SERVER_TABLE, SERVER_TABLE)
    if not isinstance(table, Mapping):
        raise InputError(source, table_at, SERVER_TABLE, f"must be a table, got {_show(table)}")
    values, lines = [], []
    for key, value in table.items():
        line = table_key_line(text, SERVER_TABLE, key) or table_at
        if key not in SERVER_KEYS:
            raise InputError(source, line, f"{SERVER_TABLE}.{key}", f"unknown server key (known: "
                             f"{', '.join(SERVER_KEYS)})")
        problem = check_value(key, value)
        if problem:
            raise InputError(source, line, f"{SERVER_TABLE}.{key}", problem)
        values.append((key, value))
        lines.append((key, line))
    stack = table.get("stack")
    for key, owner in STACK_ONLY.items():
        if key in table and stack is not None and owner != stack:
            raise InputError(source, dict(lines)[key], f"{SERVER_TABLE}.{key}",
                             f"is a setting of the {owner} stack, and this table's stack is {stack}: "
                             "it would do nothing")
    return ServerTable(source, table_at, tuple(values), tuple(lines))


def server_settings(table: ServerTable | None, flags: Mapping[str, object | None],
                    profile_source: str = "--device-profile") -> ServerSettings:
    """The settings the table and the flags describe: a flag that is given replaces its key.

    Errors name where the offending value came from: ``file:line: field 'server.KEY'``
    for the table, the flag for a flag; a missing required key names both places.
    """
    chosen: dict[str, object] = {}
    origin: dict[str, tuple[str, int | None, str | None]] = {}
    table_stack = table.get("stack") if table is not None else None
    stack = flags.get("stack") or table_stack
    for key in SERVER_KEYS:
        value = flags.get(key)
        if value is not None:
            chosen[key], origin[key] = value, (flag_name(key), None, None)
        elif table is not None and table.get(key) is not None:
            if key in STACK_ONLY and table_stack is not None and STACK_ONLY[key] != stack:
                continue  # the table's own stack's setting, and a flag switched the stack
            chosen[key], origin[key] = table.get(key), (table.source, table.line_of(key), f"{SERVER_TABLE}.{key}")

    def fail(key: str, message: str) -> InputError:
        return InputError(*origin[key], message)

    for key, value in chosen.items():
        problem = check_value(key, value)
        if problem:
            raise fail(key, problem)
    for key in REQUIRED_KEYS:
        if key not in chosen:
            where = table.source if table is not None else profile_source
            raise InputError(where, table.line if table is not None else None, f"{SERVER_TABLE}.{key}",
                             f"missing: set {key} in the profile's [{SERVER_TABLE}] table or give {flag_name(key)}")
    for key, owner in STACK_ONLY.items():
        if key in chosen and owner != stack:
            raise fail(key, f"is a setting of the {owner} stack, and the stack is {stack}: it would do nothing")
    if stack == "nxdi" and chosen.get("ctx_batch_size", 1) > chosen["max_num_seqs"]:  # type: ignore[operator]
        raise fail("ctx_batch_size", f"{chosen['ctx_batch_size']} is above max_num_seqs {chosen['max_num_seqs']} "
                   "(a context batch runs inside the running batch)")
    return ServerSettings(**chosen)  # type: ignore[arg-type]


def _show(value: object) -> str:
    """A value as TOML spells it, shortened, for messages."""
    if isinstance(value, bool):
        return "true" if value else "false"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
