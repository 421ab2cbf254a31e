"""JSON measurement and profile files read strictly, with the line of a key for messages.

``json.loads`` keeps no positions, so a key's line is found in the text: the keys of a
path are searched one after the other (``"facebook/opt-13b"`` then ``"1"`` after it, then
``"prefill"`` after that), which names the right line in the files these readers take
(nested objects, every key quoted once per object).
"""

from __future__ import annotations

import json
import math

from model.base.errors import InputError

MAX_DIGITS = 30  # a longer integer is a broken file, refused before int() sees it


class _Refused(Exception):
    """A duplicate key, a non-finite constant or an oversized integer, with what to say."""


def _pairs(pairs: list[tuple[str, object]]) -> dict:
    out = {}
    for key, value in pairs:
        if key in out:
            raise _Refused(key, "duplicate key (JSON readers disagree on which one wins)")
        out[key] = value
    return out


def _constant(name: str) -> float:
    raise _Refused(None, f"{name} is not a number: a measured time or a coefficient must be finite")


def _integer(text: str) -> int:
    if len(text.lstrip("-")) > MAX_DIGITS:
        raise _Refused(None, f"integer {text[:20]}... has more than {MAX_DIGITS} digits")
    return int(text)


def load_object(text: str, source: str) -> dict:
    """A JSON object, strictly: no duplicate keys, no NaN or Infinity, no 40-digit integers."""
    try:
        data = json.loads(text, object_pairs_hook=_pairs, parse_constant=_constant, parse_int=_integer)
    except json.JSONDecodeError as exc:
        raise InputError(source, exc.lineno, None, f"malformed JSON: {exc.msg} (column {exc.colno})") from None
    except _Refused as exc:
        key, message = exc.args
        raise InputError(source, key_line(text, (key,)) if key else None, key, message) from None
    except RecursionError:
        raise InputError(source, None, None, "JSON nested too deeply") from None
    if not isinstance(data, dict):
        raise InputError(source, 1, None, f"expected a JSON object, got a {type(data).__name__}")
    return data


def key_line(text: str, path: tuple[str, ...]) -> int | None:
    """The line of the last key of ``path``, each key searched after the previous one (None: not found)."""
    at = 0
    for key in path:
        found = text.find(json.dumps(key, ensure_ascii=False), at)
        if found < 0:
            found = text.find(json.dumps(key), at)
        if found < 0:
            return None
        at = found
    return text.count("\n", 0, at) + 1


def finite_number(value: object) -> float | None:
    """A JSON number (not a boolean) as a finite float, else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None
