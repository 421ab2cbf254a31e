"""Bucket names: they become plan file names (``plan_<name>.jsonl``), so they must be plain.

A plain name is 1 to ``MAX_NAME`` ASCII letters, digits, ``-``, ``_`` and ``.``, not starting
with ``.``: no path separator, no ``..``, no absolute path, no control character (NUL), no
hidden file.  The rule holds for names written in a scenario and for names taken from a
request file's name, and the plan writer checks containment again on its own.
"""

from __future__ import annotations

import re

from model.base.errors import InputError

MAX_NAME = 100
_PLAIN = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*")
RULE = (f"letters, digits, '-', '_' and '.', not starting with '.', at most {MAX_NAME} characters")


def is_plain(name: str) -> bool:
    """Whether a bucket name may name a plan file in the output folder."""
    return isinstance(name, str) and len(name) <= MAX_NAME and _PLAIN.fullmatch(name) is not None


def check_name(name: str, file: str, line: int | None, field: str | None, derived: bool = False) -> str:
    """The name itself, or an InputError saying what a bucket name may hold (and which file gave it)."""
    if is_plain(name):
        return name
    where = "taken from this file's name " if derived else ""
    hint = "; rename the file or use a scenario with a plain bucket name" if derived else ""
    raise InputError(file, line, field, f"bucket name {name!r} {where}is not plain ({RULE}){hint}")
