"""The one error type for bad input: it always names the file, the line and the field."""

from __future__ import annotations

import re

# A file name or key taken from the input may hold a newline or a NUL: one error stays one line.
_CONTROL = re.compile("[\\x00-\\x1f\\x7f]")


class InputError(Exception):
    """Bad input: rendered as a single line ``file:line: field 'x': message``.

    The command-line entry points catch it, print it, and exit with status 2 before
    anything is written.
    """

    def __init__(self, file: str, line: int | None, field: str | None, message: str):
        self.file = file
        self.line = line
        self.field = field
        self.message = message
        super().__init__(self.render())

    def __reduce__(self):
        # raised in a Dask worker, it crosses to the client by pickle: rebuild it from its parts
        return (InputError, (self.file, self.line, self.field, self.message))

    def render(self) -> str:
        """The single-line message shown to the user (control characters from the input shown escaped)."""
        where = self.file if self.line is None else f"{self.file}:{self.line}"
        what = f" field '{self.field}':" if self.field else ""
        return _CONTROL.sub(lambda m: repr(m.group())[1:-1], f"{where}:{what} {self.message}")


class InfeasibleError(Exception):
    """The limits cannot all be met; the message says which ones conflict."""


class NoPlanFound(Exception):
    """No plan meeting every limit was found, and the limits are NOT proven unmeetable.

    A time limit without a solution or a solver failure ends here (exit status 4),
    never as an InfeasibleError: only a proof may say the limits cannot be met.
    """


def closest(word: str, options) -> str | None:
    """The option most like ``word`` (a misspelt flag, planner or format name), or None when none is close.

    difflib's ratio with its usual 0.6 cut: ``--limt-shapes`` finds ``--limit-shapes``, ``devce`` finds
    ``device``, and an unrelated word finds nothing rather than a wild guess.
    """
    import difflib

    found = difflib.get_close_matches(word, [str(o) for o in options], n=1, cutoff=0.6)
    return found[0] if found else None


def unknown_name(what: str, word: str, options) -> str:
    """One line for a name that is not among ``options``: the closest one, then all of them."""
    near = closest(word, options)
    hint = f"; did you mean {near!r}?" if near is not None else ""
    return f"unknown {what} {word!r}{hint} (choose from {', '.join(map(str, options))})"
