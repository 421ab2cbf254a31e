"""What every serving-format reader shares: the input limits, safe text, checked integers, VAR=value files.

A configuration file is a few lines written by hand or by a tool; anything else (a
folder, a binary, a huge file, a length past 2**20) is a mistake the user must see as
one InputError naming file, line and field, never as a traceback or a silent guess.
The JSON-specific readers are in ``model.serving.parse_json``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from model.base.errors import InputError
from model.load.files import read_input
from model.load.requests import MAX_LEN
from model.serving.spec import Given

MAX_BUCKETS = 100_000  # values a ladder, range or Cartesian product may expand to
MAX_BUCKET_NAMES = 64  # named bucket lists in one file (a stack has a few kinds: prompt, context, decode)
MAX_FILE_BYTES = 16 << 20  # a shape configuration is a few lines; more is the wrong file
MAX_LINE_CHARS = 100_000
LIMIT_NOTE = f"the largest accepted is {MAX_LEN} (2**20 tokens); a larger value is a typo, not a length"


# ---------------------------------------------------------------- reading text safely


def read_text(path: Path) -> str:
    """The file as text: never a traceback for a folder, a missing, huge, binary or non-UTF-8 file."""
    src = str(path)
    # the one place inputs are opened: a FIFO is refused, not waited on
    raw = read_input(path, MAX_FILE_BYTES, folder="is a folder, expected a file")
    if len(raw) > MAX_FILE_BYTES:

        raise InputError(src, None, None, f"larger than {MAX_FILE_BYTES >> 20} MiB; a shape configuration "
                         "is a few lines")
    if b"\0" in raw:
        raise InputError(src, raw[:raw.index(b"\0")].count(b"\n") + 1, None, "NUL byte: a binary file, not text")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(src, raw[:exc.start].count(b"\n") + 1, None,
                         f"not UTF-8 text (byte 0x{raw[exc.start]:02x})") from None
    text = text.removeprefix("\ufeff")
    if not text.strip():
        raise InputError(src, None, None, "empty file")
    return text


def text_lines(text: str, src: str) -> list[tuple[int, str]]:
    """(line number, text without comment) for every line with content; '#' starts a comment."""
    out = []
    for number, raw in enumerate(text.split("\n"), start=1):
        if len(raw) > MAX_LINE_CHARS:
            raise InputError(src, number, None, f"line longer than {MAX_LINE_CHARS} characters")
        body = raw.split("#", 1)[0].strip()
        if body:
            out.append((number, body))
    return out


def check_range(value: int, src: str, line: int | None, fld: str | None, lo: int = 1, hi: int = MAX_LEN) -> int:
    """value if lo <= value <= hi, else an InputError saying which bound it breaks."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(src, line, fld, f"expected an integer, got {shown(value)}")
    if value < lo:
        want = "positive" if lo == 1 else f"at least {lo}"
        raise InputError(src, line, fld, f"must be {want}, got {value}")
    if value > hi:
        raise InputError(src, line, fld, f"{value} is too large: {LIMIT_NOTE}" if hi == MAX_LEN
                         else f"{value} is too large: at most {hi}")
    return value


def parse_int(token: str, src: str, line: int | None, fld: str, lo: int = 1, hi: int = MAX_LEN) -> int:
    """A decimal integer written as text (a list entry, an env value), range-checked."""
    m = re.fullmatch(r"[+-]?([0-9]+)", token.strip())
    if not m:
        raise InputError(src, line, fld, f"expected an integer, got {token.strip()!r}")
    if len(m.group(1).lstrip("0")) > 18:
        raise InputError(src, line, fld, f"{token.strip()[:24]}... is too large: {LIMIT_NOTE}")
    return check_range(int(token), src, line, fld, lo, hi)


def shown(value) -> str:
    """A value as the user wrote it (JSON spelling), cut short."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


# ---------------------------------------------------------------- VAR=value files


@dataclass(frozen=True)
class EnvValue:
    """One variable's value as written, and its line (so a later check can name it)."""

    value: str
    line: int


_ENV_LINE = re.compile(r"(?:export\s+)?(?P<name>[A-Za-z_][A-Za-z0-9_]*)=(?P<rest>.*)")


def env_vars(text: str, src: str) -> dict[str, EnvValue]:
    """``NAME=value`` lines (optionally ``export``-ed, values optionally quoted, ``#`` comments).

    A name set twice is an error: which one a shell or a loader keeps differs.
    """
    out: dict[str, EnvValue] = {}
    for number, raw in enumerate(text.split("\n"), start=1):
        if len(raw) > MAX_LINE_CHARS:
            raise InputError(src, number, None, f"line longer than {MAX_LINE_CHARS} characters")
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _ENV_LINE.fullmatch(line)
        if m is None:
            raise InputError(src, number, None, f"expected NAME=value, got {shown(line)}")
        name = m.group("name")
        value = _env_value(m.group("rest"), src, number, name)
        if name in out:
            raise InputError(src, number, name, f"set twice (first on line {out[name].line})")
        out[name] = EnvValue(value, number)
    return out


def _env_value(rest: str, src: str, line: int, name: str) -> str:
    """The value part of one assignment: a quoted string or one word, then at most a comment."""
    if rest[:1] in ("'", '"'):
        end = rest.find(rest[0], 1)
        if end < 0:
            raise InputError(src, line, name, "unterminated quote")
        value, tail = rest[1:end], rest[end + 1:]
    else:
        parts = rest.split(None, 1)
        value, tail = (parts[0] if parts else ""), (" " + parts[1] if len(parts) > 1 else "")
    tail = tail.strip()
    if tail and not tail.startswith("#"):
        raise InputError(src, line, name, f"unexpected text after the value: {shown(tail)}")
    return value


def env_int(env: dict[str, EnvValue], src: str, name: str, lo: int = 1, hi: int = MAX_LEN) -> int | None:
    """An optional integer variable, range-checked, or None when unset."""
    v = env.get(name)
    return None if v is None else parse_int(v.value, src, v.line, name, lo, hi)


def env_int_list(env: dict[str, EnvValue], src: str, name: str) -> list[Given]:
    """A comma-separated list of lengths in one variable (empty when unset)."""
    v = env.get(name)
    if v is None:
        return []
    tokens = v.value.split(",")
    if tokens and not tokens[-1].strip():
        tokens.pop()  # a trailing comma
    if not tokens:
        raise InputError(src, v.line, name, "empty list")
    return [Given(parse_int(t, src, v.line, f"{name}[{i}]"), src, v.line, f"{name}[{i}]")
            for i, t in enumerate(tokens)]


def max_model_len_of(env: dict[str, EnvValue], src: str, given: int | None, why: str) -> int:
    """The max model length: the ``MAX_MODEL_LEN`` key or the argument (they must agree if both are given)."""
    in_file = env_int(env, src, "MAX_MODEL_LEN")
    if in_file is not None and given is not None and in_file != given:
        raise InputError(src, env["MAX_MODEL_LEN"].line, "MAX_MODEL_LEN",
                         f"{in_file} disagrees with max_model_len {given}")
    value = in_file if in_file is not None else given
    if value is None:
        raise InputError(src, None, "MAX_MODEL_LEN", f"missing: {why}; give MAX_MODEL_LEN=N in the file "
                         "or max_model_len")
    return value

