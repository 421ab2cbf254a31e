"""JSON configuration files read strictly, and the line each key and list entry sits on.

The JSON formats (json, nxdi, vllm-neuron) share one loader: duplicate keys, NaN in an
integer field and 40-digit numbers are errors naming their line, as every other input
problem is.  ``json.loads`` keeps no positions, so lines are found in the text itself.
"""

from __future__ import annotations

import json
import re

from model.errors import InputError
from model.serving.parse import LIMIT_NOTE, MAX_BUCKETS, check_range, shown
from model.serving.spec import Given


class _Duplicate(Exception):
    pass


class _Oversized(Exception):
    pass


def _unique_pairs(pairs: list[tuple[str, object]]) -> dict:
    out = {}
    for key, value in pairs:
        if key in out:
            raise _Duplicate(key)
        out[key] = value
    return out


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > 30:
        raise _Oversized(text)
    return int(text)


def load_json_object(text: str, src: str) -> dict:
    """A JSON object; duplicate keys are rejected (readers disagree on which one wins).

    NaN and Infinity parse as floats, so the field that holds one is named when its
    integer check fails; integers of more than 30 digits are refused before int() sees them.
    """
    try:
        data = json.loads(text, object_pairs_hook=_unique_pairs, parse_int=_bounded_int)
    except json.JSONDecodeError as exc:
        raise InputError(src, exc.lineno, None, f"malformed JSON: {exc.msg} (column {exc.colno})") from None
    except _Duplicate as exc:
        key = str(exc.args[0])
        raise InputError(src, key_line(text, key, 1), key, "duplicate key (JSON readers disagree on which "
                         "one wins)") from None
    except _Oversized as exc:
        number = str(exc.args[0])
        raise InputError(src, text[:text.find(number)].count("\n") + 1, None,
                         f"number {number[:20]}... is too large: {LIMIT_NOTE}") from None
    except RecursionError:
        raise InputError(src, None, None, "malformed JSON: nested too deeply") from None
    if not isinstance(data, dict):
        raise InputError(src, 1, None, f"expected a JSON object, got {type(data).__name__}")
    return data


def key_line(text: str, key: str, nth: int = 0) -> int | None:
    """Line of the nth ``"key":`` in a JSON text (best effort; None if not found)."""
    found = list(re.finditer(re.escape(json.dumps(key)) + r"\s*:", text))
    if len(found) <= nth:
        return None
    return text[:found[nth].start()].count("\n") + 1


def element_line(text: str, key: str, index: int) -> int | None:
    """Line of element ``index`` of the list under the first ``"key":`` (falls back to the key's line).

    A tiny scanner over the list's text (strings skipped, nesting counted), so an error
    in an indented list one value a line points at the value, not at the key.
    """
    m = re.search(re.escape(json.dumps(key)) + r"\s*:\s*\[", text)
    if m is None:
        return key_line(text, key)
    depth, count, in_string, escaped = 1, 0, False, False
    pos = m.end()
    while pos < len(text):
        ch = text[pos]
        if in_string:
            escaped = ch == "\\" and not escaped
            if ch == '"' and not escaped:
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
            if depth == 0:
                break
        elif ch == "," and depth == 1:
            count += 1
        if count == index and depth == 1 and not ch.isspace() and ch != ",":
            return text[:pos].count("\n") + 1
        pos += 1
    return key_line(text, key)


def json_int_list(text: str, src: str, obj: dict, key: str, where: str, lo: int = 1,
                  required: bool = True) -> list[Given] | None:
    """The list ``obj[key]`` as Given lengths (each an exact JSON integer in range), or None if absent."""
    fld = f"{where}{key}"
    if key not in obj or obj[key] is None:
        if required:
            raise InputError(src, None, fld, "missing")
        return None
    value = obj[key]
    if not isinstance(value, list) or not value:
        raise InputError(src, key_line(text, key), fld, f"expected a non-empty list of integers, got {shown(value)}")
    if len(value) > MAX_BUCKETS:
        raise InputError(src, key_line(text, key), fld, f"{len(value)} entries; at most {MAX_BUCKETS}")
    out = []
    for i, v in enumerate(value):
        line = element_line(text, key, i)
        out.append(Given(check_range(v, src, line, f"{fld}[{i}]", lo), src, line, f"{fld}[{i}]"))
    return out


def json_scalar(text: str, src: str, obj: dict, key: str, where: str, lo: int = 1) -> int | None:
    """An optional integer setting of a JSON object, range-checked."""
    if key not in obj or obj[key] is None:
        return None
    return check_range(obj[key], src, key_line(text, key), f"{where}{key}", lo)


def json_text(obj: dict) -> str:
    """Deterministic JSON: keys in the order given, two-space indent, one trailing newline."""
    return json.dumps(obj, indent=2) + "\n"

