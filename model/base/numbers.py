"""The one reader of numbers from the outside: TOML values, CSV cells and numeric command-line flags.

Python's own ``int()`` and ``float()`` are lenient in ways no input file means: ``1_0``
is 10, Arabic-Indic or full-width digits are digits, surrounding blanks are ignored,
and an integer with 400 digits passes a range check and then raises OverflowError when
it becomes a float.  Everything read here follows one grammar and one order of checks:

1. the spelling -- text is ASCII only: an optional ``-``, digits ``0-9``, for a decimal an
   optional fraction and exponent (``12``, ``-3``, ``0.25``, ``1e-3``); the words ``nan`` and
   ``inf`` are read as the floats they name so the range check can say what is wrong with
   them; a TOML value is a number of the right type (``true`` is not 1, ``8.0`` is not a count);
2. the conversion -- a decimal must be finite as the float64 it becomes (``1e400`` and an
   integer beyond float range are refused, not turned into inf or an OverflowError);
3. the range -- each caller's bounds, inclusive unless it says otherwise.

A failure is an ``InputError`` with the file, line and field the caller gives, shown
as the input spelled it (shortened past ``SHOWN_CHARS``), so the message is one line.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Callable
from dataclasses import dataclass

from model.base.errors import InputError

INTEGER_TEXT = r"-?[0-9]+"
DECIMAL_TEXT = r"-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?"
NONFINITE_TEXT = r"[-+]?(?:nan|inf|infinity)"
_INTEGER = re.compile(INTEGER_TEXT, re.ASCII)
_DECIMAL = re.compile(DECIMAL_TEXT, re.ASCII)
_NONFINITE = re.compile(NONFINITE_TEXT, re.ASCII | re.IGNORECASE)
MAX_DIGITS = 4000  # an integer text longer than this is no integer here (see integer_text)
SHOWN_CHARS = 60  # a value longer than this is cut in messages (a 400-digit integer stays one readable line)


@dataclass(frozen=True)
class Where:
    """What an error names: the file (or flag), the line (None for a flag) and the field."""

    file: str
    line: int | None = None
    field: str | None = None

    def error(self, message: str) -> InputError:
        return InputError(self.file, self.line, self.field, message)


def _boolean(value: object) -> bool:
    """Python's or numpy's boolean (numpy's is no ``numbers.Integral``, but is no number here either)."""
    return isinstance(value, bool) or type(value).__name__ in ("bool_", "bool")


def shown(value: object) -> str:
    """A value as the input spelled it, for messages: TOML booleans as ``true``/``false``, text quoted, numpy
    scalars as the Python value they hold, long values cut to ``SHOWN_CHARS`` characters."""
    if _boolean(value):
        text = "true" if value else "false"
    elif type(value).__module__ == "numpy" and hasattr(value, "item"):
        text = repr(value.item())
    else:
        text = repr(value)
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS - 3] + "..."


def integer_text(text: str) -> int | None:
    """The integer an ASCII text spells (``-?[0-9]+``, nothing around it), or None -- also for more than
    ``MAX_DIGITS`` digits: int() raises ValueError past 4,300 (``--replicas 999...`` was a traceback), and no
    count or length anywhere has a thousandth of that many."""
    if not (isinstance(text, str) and _INTEGER.fullmatch(text)) or len(text) > MAX_DIGITS + 1:
        return None
    return int(text)


def decimal_text(text: str) -> float | None:
    """The float64 an ASCII decimal text spells (``nan``/``inf`` words included, so the range check can name
    them), or None when the text is not a number.  Out-of-range decimals (``1e400``) become inf here and are
    refused by ``finite``."""
    if not isinstance(text, str) or not (_DECIMAL.fullmatch(text) or _NONFINITE.fullmatch(text)):
        return None
    return float(text)


def as_integer(value: object, text: bool = False) -> int | None:
    """A count from a parsed file (a TOML or JSON integer, numpy integer; with ``text``, ASCII text as a CSV cell
    holds it), or None.  Booleans and floats are not counts: ``true`` or ``8.0`` is a typo, not 1 or 8; and in a
    typed format (TOML) ``"8"`` is text, not a count."""
    if _boolean(value):
        return None
    if isinstance(value, numbers.Integral):  # int and numpy's integers
        return int(value)
    return integer_text(value) if text and isinstance(value, str) else None


def as_float(value: object, text: bool = False) -> float | None:
    """A number from a parsed file (TOML/JSON integer or float, numpy number; with ``text``, ASCII text) as a
    float64, or None if it is no number.  An integer too large for a float becomes inf (refused by the range
    check) rather than an OverflowError."""
    if _boolean(value):
        return None
    if isinstance(value, numbers.Integral):  # int and numpy's integers
        try:
            return float(int(value))
        except OverflowError:
            return math.inf if value > 0 else -math.inf
    if isinstance(value, numbers.Real):  # float and numpy's floats
        return float(value)
    return decimal_text(value) if text and isinstance(value, str) else None


def finite(value: float | None, low: float = 0.0, high: float = math.inf, above: bool = False) -> bool:
    """Whether a float is a number within [low, high] (``above``: strictly above low); NaN and inf never are."""
    if value is None or not math.isfinite(value) or value > high:
        return False
    return value > low if above else value >= low


def read_number(value: object, where: Where, low: float = 0.0, high: float = math.inf, above: bool = False,
                message: str = "must be a finite non-negative number, got {got}",
                too_big: str | None = None, text: bool = False) -> float:
    """A finite float within the bounds, or an InputError at ``where``.

    ``message`` (with ``{got}``: the value as spelled) says what a number here must be;
    ``too_big`` (with ``{got}`` and ``{high}``), when given, is said of a number above ``high``;
    ``text``: the value may be ASCII text (a CSV cell), else only a typed number (TOML) is one.
    """
    f = as_float(value, text)
    if too_big is not None and f is not None and math.isfinite(f) and f > high:  # inf is "not finite", not "too big"
        raise where.error(too_big.format(got=shown(value), high=f"{high:g}"))
    if not finite(f, low, high, above):
        raise where.error(message.format(got=shown(value)))
    return f


def read_count(value: object, where: Where, low: int = 1, high: int | None = None,
               message: str = "must be a positive integer, got {got}", too_big: str | None = None,
               text: bool = False) -> int:
    """An integer within [low, high] (exact: no float on the way), or an InputError at ``where``.

    ``too_big`` (with ``{got}`` and ``{high}``) is said of an integer above ``high``; without it ``message`` is.
    ``text`` as for ``read_number``.
    """
    n = as_integer(value, text)
    if n is None or n < low:
        raise where.error(message.format(got=shown(value)))
    if high is not None and n > high:
        raise where.error((too_big or message).format(got=shown(value), high=high))
    return n


def float_flag(flag: str) -> Callable[[str], float]:
    """An argparse ``type`` for a decimal flag: the text spelled by the grammar above (else one InputError line
    naming the flag, instead of argparse's usage block); non-finite words pass through as floats so the flag's
    own range check names them."""
    def parse(text: str) -> float:
        value = decimal_text(text)
        if value is None:
            raise InputError(flag, None, None, f"expected a number, got {shown(text)}")
        return value

    parse.__name__ = "number"  # argparse names the type in its own messages
    return parse


def int_flag(flag: str) -> Callable[[str], int]:
    """An argparse ``type`` for an integer flag: ASCII digits with an optional ``-`` (else one InputError line
    naming the flag); the flag's own range check follows."""
    def parse(text: str) -> int:
        value = integer_text(text)
        if value is None:
            raise InputError(flag, None, None, "expected an integer" + (f" of at most {MAX_DIGITS} digits" if
                             _INTEGER.fullmatch(text) else "") + f", got {shown(text)}")
        return value

    parse.__name__ = "integer"
    return parse


def counted(n: int, word: str, many: str | None = None) -> str:
    """``1 bucket``, ``2 buckets``: a count with its noun agreeing (``many`` for an irregular plural,
    e.g. counted(n, "batch", "batches"))."""
    return f"{n} {word if n == 1 else many or word + 's'}"
