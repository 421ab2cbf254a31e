"""Input files: the one place every input file is opened, and the record of which files a run has read.

Every loader (requests, plans, scenarios and the TOML files they name, device profiles,
cost coefficients, serving configs, measurement CSVs) reads its file through
``read_input``.  That is where a path that is not a regular file is refused: opening a
FIFO for reading blocks until some writer appears (``--shapes-from`` a FIFO hung
forever), and a device or socket is no input either.  The file is opened non-blocking,
checked by ``fstat`` on the open descriptor (so nothing can swap it in between), and
only then read.

The same place records what was read.  A command line runs inside ``recorded_inputs()``
(``model.cli_common.run_main``), and the output guard (``model.load.outputs``) refuses
any output that is, lies inside, or holds one of these inputs: ``sweep --out REQUESTS``
or ``calibrate m.csv --out m.csv`` would otherwise destroy what they read.  Paths are
recorded resolved (symlinks followed), so a link to an input is that input.
"""

from __future__ import annotations

import codecs
import errno
import fcntl
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from model.base.errors import InputError

_scopes: list[set[Path]] = []  # the inputs of each run in progress (innermost last); empty outside a run

_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


@contextmanager
def recorded_inputs() -> Iterator[set[Path]]:
    """Record every input read until the block ends (the set it yields), for the output guard."""
    scope: set[Path] = set()
    _scopes.append(scope)
    try:
        yield scope
    finally:
        _scopes.remove(scope)


def resolved(path: str | Path) -> Path:
    """An absolute path with every symlink that exists followed (the file a path really names)."""
    try:
        return Path(os.path.realpath(os.fspath(path)))
    except (OSError, ValueError):  # a NUL in the path: no file has that name
        return Path(os.path.abspath(os.fspath(path)))


def note_input(path: str | Path) -> None:
    """Record ``path`` as an input of the runs in progress (for files another library opens by name)."""
    if _scopes:
        real = resolved(path)
        for scope in _scopes:
            scope.add(real)


def input_paths() -> frozenset[Path]:
    """Every input the innermost run in progress has read (resolved), or nothing outside a run."""
    return frozenset(_scopes[-1]) if _scopes else frozenset()


def kind_of(mode: int) -> str | None:
    """What a non-regular file is, for messages (None for a regular file)."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "a folder"
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def read_input(path: str | Path, limit: int | None = None, folder: str | None = None) -> bytes:
    """The bytes of an input file (the first ``limit + 1`` bytes when ``limit`` is given, so a caller can tell a
    file that is too long); an InputError for a missing or unreadable file, a folder (``folder``: what to say
    then), or anything that is not a regular file.  The file is recorded as an input of the run."""
    src = str(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise InputError(src, None, None, f"cannot read: {exc.strerror or exc}") from None
    except ValueError as exc:  # a NUL in the path (from a scenario: the command line cannot carry one)
        raise InputError(src, None, None, f"cannot read: {exc}") from None
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise InputError(src, None, None, folder or f"cannot read: {os.strerror(errno.EISDIR)}")
        kind = kind_of(mode)
        if kind is not None:
            raise InputError(src, None, None, f"cannot read: {kind}, not a regular file")
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        with os.fdopen(fd, "rb", closefd=False) as fh:
            data = fh.read() if limit is None else fh.read(limit + 1)
    except OSError as exc:
        raise InputError(src, None, None, f"cannot read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    note_input(path)
    return data


def check_utf8(path: Path | str, raw: bytes, chunk: int = 1 << 24) -> None:
    """Text input must be UTF-8: the first bad byte is named with its line and column.

    Checked in chunks by an incremental decoder, so a large file costs no more memory
    than one chunk (pyarrow would otherwise pass bad bytes on to crash later, or replace them).
    """
    decoder = codecs.getincrementaldecoder("utf-8")()
    for lo in range(0, len(raw), chunk):
        held = len(decoder.getstate()[0])  # bytes of a character left unfinished by the previous chunk
        try:
            decoder.decode(raw[lo:lo + chunk], final=lo + chunk >= len(raw))
        except UnicodeDecodeError as exc:
            at = min(lo - held + exc.start, len(raw) - 1)
            line = raw.count(b"\n", 0, at) + 1
            column = at - (raw.rfind(b"\n", 0, at) + 1) + 1
            raise InputError(str(path), line, None,
                             f"not UTF-8 text (byte 0x{raw[at]:02x} at column {column})") from None


def read_text(path: str | Path, bom: bool = False, folder: str | None = None) -> str:
    """An input file as UTF-8 text (``read_input``'s checks; a byte that is not UTF-8 named by line and column).
    ``bom``: a leading byte-order mark is dropped (spreadsheets write one before a CSV header)."""
    raw = read_input(path, folder=folder)
    check_utf8(path, raw)
    return raw.decode("utf-8-sig" if bom else "utf-8")
