"""JSON configuration files read strictly, and the line each key and list entry sits on.

The JSON formats (json, nxdi, vllm-neuron) share one loader: duplicate keys, NaN in an
integer field and 40-digit numbers are errors naming their line, as every other input
problem is.  ``json.loads`` keeps no positions, so lines are found in the text itself.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from model.base.errors import InputError
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


# ---------------------------------------------------------------- line numbers, in one pass
#
# A line found by rescanning the text per list entry (or per bucket name) makes reading
# quadratic: 10k entries took ~50 s, the accepted 100k never finished.  The index below
# scans the text once for every key asked about and each list once for all its entries,
# and gives exactly the lines the rescans gave: the first ``"key":`` (``key_line``) and
# the entries of the list after the first ``"key": [``.

_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)  # one JSON string token
_COLON = re.compile(r"\s*:")
_COLON_LIST = re.compile(r"\s*:\s*\[")
_STRUCTURE = re.compile(r'["\[\]{},]')
_NOT_SPACE = re.compile(r"\S")


@dataclass(frozen=True)
class KeySpot:
    """Where one key first appears: its line, and where the first list under it starts."""

    line: int | None  # line of the first ``"key":`` (None if there is none)
    list_at: tuple[int, int] | None  # (offset just after the ``[`` of the first ``"key": [``, its line)


def spelling_candidates(text: str) -> Iterator[tuple[int, int]]:
    """(first, last) offsets of every stretch of valid JSON ``text`` that could be a key's spelling, in order.

    A spelling (``json.dumps(key)``) starts at a quote and ends at the next unescaped one.
    In valid JSON a quote opens a string, closes one, or is escaped inside one, so the
    stretches are: each string token; from each escaped quote of a token to its end
    (only when a colon follows: a key); from a token's closing quote to the next one's
    opening quote.  Keys holding escaped quotes or strings ending in a colon are thus
    found where a plain text search finds them.
    """
    previous_close = None
    for token in _STRING.finditer(text):
        opening, close = token.start(), token.end() - 1
        if previous_close is not None:
            yield previous_close, opening
        yield opening, close
        inner = text.find('"', opening + 1, close)
        if inner >= 0 and _COLON.match(text, close + 1):
            while inner >= 0:
                yield inner, close
                inner = text.find('"', inner + 1, close)
        previous_close = close


def key_spots(text: str, keys: Iterable[str]) -> dict[str, KeySpot]:
    """For every key, its first ``"key":`` and first ``"key": [`` in valid JSON ``text``, in one pass.

    Only stretches as long as some asked-for spelling are compared, so the work is one
    pass over the text plus, at most, one comparison per stretch.
    """
    wanted = {json.dumps(k): k for k in keys}
    sizes = {len(spelling) for spelling in wanted}
    first: dict[str, int] = {}
    lists: dict[str, int] = {}
    for start, close in spelling_candidates(text):
        if close - start + 1 not in sizes or (spelling := text[start:close + 1]) not in wanted:
            continue
        if spelling not in first and _COLON.match(text, close + 1):
            first[spelling] = start
        if spelling not in lists and (m := _COLON_LIST.match(text, close + 1)):
            lists[spelling] = m.end()
    lines = lines_at(text, [*first.values(), *lists.values()])
    return {k: KeySpot(lines[first[d]] if d in first else None, (lists[d], lines[lists[d]]) if d in lists else None)
            for d, k in wanted.items()}


def lines_at(text: str, offsets: Iterable[int], at: int = 0, line: int = 1) -> dict[int, int]:
    """The line of each offset (none before ``at``, which is on ``line``), counting each newline once."""
    out: dict[int, int] = {}
    for offset in sorted(set(offsets)):
        line += text.count("\n", at, offset)
        out[offset], at = line, offset
    return out


def element_offsets(text: str, start: int, count: int) -> list[int | None]:
    """Where each of the first ``count`` entries of the list opened just before ``start`` begins.

    One scan for all entries, by the rule error lines have always followed: commas at
    the list's own depth separate entries; an entry starts at its first character at
    that depth that is neither space nor comma (for a nested list or object, its closing
    bracket); every quote opens or closes a string, a backslash does not escape it.
    None for an entry the scan does not reach.
    """
    found: list[int | None] = [None] * count
    depth, entry, pos = 1, 0, start
    while entry < count:
        if depth == 1 and found[entry] is None:
            m = _NOT_SPACE.search(text, pos)
        else:
            m = _STRUCTURE.search(text, pos)
        if m is None:
            break
        pos, ch = m.start(), m.group()
        if ch in "]}":
            depth -= 1
            if depth == 0:
                break
            if depth == 1 and found[entry] is None:
                found[entry] = pos
        elif ch in "[{":
            depth += 1
        elif ch == ",":
            entry += depth == 1
        else:
            if depth == 1 and found[entry] is None:
                found[entry] = pos
            if ch == '"':
                pos = text.find('"', pos + 1)
                if pos < 0:
                    break
        pos += 1
    return found


class JsonLineIndex:
    """Line numbers of the keys and list entries of one JSON text, from one scan (see key_spots)."""

    def __init__(self, text: str, keys: Iterable[str]):
        self.text = text
        self.spots = key_spots(text, keys)

    def spot(self, key: str) -> KeySpot:
        """A key asked for up front, or (one more scan) any other."""
        if key not in self.spots:
            self.spots.update(key_spots(self.text, [key]))
        return self.spots[key]

    def key_line(self, key: str) -> int | None:
        """Line of the first ``"key":`` (what ``key_line(text, key)`` gives)."""
        return self.spot(key).line

    def element_lines(self, key: str, count: int) -> list[int | None]:
        """Lines of the first ``count`` entries of the list after the first ``"key": [``.

        An entry the scan does not reach falls back to the key's line.
        """
        spot = self.spot(key)
        if spot.list_at is None:
            return [spot.line] * count
        start, line = spot.list_at
        offsets = element_offsets(self.text, start, count)
        lines = lines_at(self.text, (o for o in offsets if o is not None), start, line)
        return [spot.line if o is None else lines[o] for o in offsets]


def json_int_list(index: JsonLineIndex, src: str, obj: dict, key: str, where: str, lo: int = 1,
                  required: bool = True) -> list[Given] | None:
    """The list ``obj[key]`` as Given lengths (each an exact JSON integer in range), or None if absent."""
    fld = f"{where}{key}"
    if key not in obj or obj[key] is None:
        if required:
            raise InputError(src, None, fld, "missing")
        return None
    value = obj[key]
    if not isinstance(value, list) or not value:
        raise InputError(src, index.key_line(key), fld, f"expected a non-empty list of integers, got {shown(value)}")
    if len(value) > MAX_BUCKETS:
        raise InputError(src, index.key_line(key), fld, f"{len(value)} entries; at most {MAX_BUCKETS}")
    out = []
    for i, (v, line) in enumerate(zip(value, index.element_lines(key, len(value)), strict=True)):
        out.append(Given(check_range(v, src, line, f"{fld}[{i}]", lo), src, line, f"{fld}[{i}]"))
    return out


def json_scalar(index: JsonLineIndex, src: str, obj: dict, key: str, where: str, lo: int = 1) -> int | None:
    """An optional integer setting of a JSON object, range-checked."""
    if key not in obj or obj[key] is None:
        return None
    return check_range(obj[key], src, index.key_line(key), f"{where}{key}", lo)


def json_text(obj: dict) -> str:
    """Deterministic JSON: keys in the order given, two-space indent, one trailing newline."""
    return json.dumps(obj, indent=2) + "\n"

