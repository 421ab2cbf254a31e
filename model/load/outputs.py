"""Outputs: every path a command writes, checked before any work, and every file of one result written together.

Two mechanisms, one module, used by every command that writes (solve, sweep, audit, calibrate, export):

- ``check_targets`` runs before any work, on every output path the flags name (``Target``): a
  file target must not be a folder, a folder target must not be a file, their nearest existing
  ancestor must be a folder, no two targets may be one file, and no target may be, lie inside,
  or (a dataset folder replaced whole) hold an input of the run -- the paths given on the
  command line and every file the loaders have read (``model.load.files``), symlinks resolved.
  ``sweep --out REQUESTS``, ``export --out PLANS/plan_x.jsonl`` and ``calibrate m.csv --out
  m.csv`` destroyed their inputs; ``audit --report FILE`` failed only after the work was done.
- ``write_together`` puts down every file of one result -- plans and their report, a sweep's
  CSV, report and pictures -- or none: each goes to a temporary file beside its target, and
  only when all are written are they renamed into place; a failure or a signal removes the
  temporaries and leaves every old file as it was.  It checks the input guard again, as the
  last line of defence.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from model.base.errors import InputError
from model.base.runtime import shielded
from model.load.files import input_paths, resolved

# mkstemp makes private (0600) files; an output is an ordinary file, and a replaced one keeps the mode its
# target had.
PLAN_MODE = 0o644
Kind = Literal["file", "folder", "dataset"]


@dataclass(frozen=True)
class Target:
    """One output path a flag names.

    ``kind``: "file" (replaced by a file), "folder" (a folder the command writes its files
    into; the files are targets of their own) or "dataset" (a folder replaced whole, as the
    Dask engine's plan datasets are).  ``hint`` ends the message when the path is of the wrong
    kind ("give a folder for the report").
    """

    flag: str
    path: Path
    kind: Kind = "file"
    hint: str = ""

    def error(self, message: str) -> InputError:
        return InputError(self.flag, None, None, message)


def file_flag(flag: str) -> Callable[[str], Path]:
    """An argparse ``type`` for a flag naming a file to write: a path that ends with a separator names a folder
    (``--out new/``), which ``Path`` would silently turn into a file called ``new``; that is one InputError line."""
    def parse(text: str) -> Path:
        if text.endswith(("/", os.sep)):
            raise InputError(flag, None, None, f"{text} ends with a separator, so it names a folder; give the path of "
                             "the file to write")
        return Path(text)

    parse.__name__ = "file path"
    return parse


def files_in(flag: str, folder: Path, names: Iterable[str]) -> list[Target]:
    """The file targets a report folder will hold (each must be free to become a file)."""
    return [Target(flag, folder / name, "file", f"{flag} writes {name} there") for name in names]


def check_targets(targets: Iterable[Target], inputs: Iterable[str | Path] = ()) -> None:
    """Refuse, before any work, an output that cannot be written or would destroy an input (see module doc).

    ``inputs`` are the paths the command line names as inputs; every file read so far in this run is added.
    """
    targets = list(targets)
    for target in sorted(targets, key=lambda t: t.kind == "file"):  # a folder before the files it will hold
        check_kind(target)
    seen: dict[Path, Target] = {}
    for target in targets:
        if target.kind == "folder":
            continue
        real = resolved(target.path)
        if real in seen:
            raise target.error(f"{target.path} is also the output of {seen[real].flag} ({seen[real].path}); "
                               "give each output its own path")
        seen[real] = target
    for target in targets:  # a file where another output needs a folder (replay --json R --report R)
        if target.kind != "file":
            continue
        real = resolved(target.path)
        for other in targets:
            if other is not target and (real == resolved(other.path) or real in resolved(other.path).parents):
                raise target.error(f"{target.path} is also where {other.flag} writes ({other.path}); "
                                   "give each output its own path")
    check_not_inputs(targets, {resolved(p) for p in inputs} | input_paths())


def kind_on_disk(target: Target, path: Path) -> str | None:
    """"folder", "file" (anything else that exists) or None (nothing there) -- or the target's InputError for a
    path no file can have (a NUL byte, a name longer than the file system allows)."""
    try:
        mode = os.stat(path).st_mode
    except ValueError:  # a NUL byte
        raise target.error(f"{str(path)!r} holds a NUL byte; no file can have that name") from None
    except FileNotFoundError:
        return None
    except NotADirectoryError:  # a file somewhere above it: said by the ancestor check
        return None
    except OSError as exc:
        raise target.error(f"cannot write {path}: {exc.strerror or exc}") from None
    return "folder" if stat.S_ISDIR(mode) else "file"


def check_kind(target: Target) -> None:
    """A file target is not a folder, a folder target not a file, and the nearest existing ancestor is a folder."""
    path = target.path
    kind = kind_on_disk(target, path)
    if target.kind == "file" and kind == "folder":
        raise target.error(f"{path} is a folder; {target.hint or 'give the path of the file to write'}")
    if target.kind != "file" and kind == "file":
        raise target.error(f"{path} is a file; {target.hint or 'give a folder'}")
    for above in path.parents:
        kind = kind_on_disk(target, above)
        if kind is not None:
            if kind != "folder":
                raise target.error(f"{above} is not a folder")
            break


def conflict(target: Target, real: Path, inputs: Iterable[Path]) -> str | None:
    """What writing ``target`` (resolved: ``real``) would do to an input, or None when it touches none."""
    for source in inputs:
        if real == source:
            return f"{target.path} is an input of this run ({source}): writing it would destroy it"
        if source in real.parents:
            return f"{target.path} lies inside the input {source}"
        if target.kind == "dataset" and real in source.parents:
            return f"{target.path} holds the input {source}: replacing it would destroy it"
    return None


def check_not_inputs(targets: Iterable[Target], inputs: Iterable[Path]) -> None:
    """The input guard: no file or dataset target is, lies inside, or (a dataset) holds an input."""
    inputs = frozenset(inputs)
    for target in targets:
        if target.kind == "folder":
            continue
        why = conflict(target, resolved(target.path), inputs)
        if why is not None:
            raise target.error(f"{why}; choose another path")


def write_together(files: Mapping[Path, Iterable[bytes]]) -> None:
    """Write several files -- every file of one result -- so that either all of them land or none changes.

    No file may be an input of the run in progress (the guard of ``check_targets``, again here, as the last
    line of defence).  Each goes to a temporary file in its target folder first and is flushed to disk.
    Only then are they renamed over their targets; an existing target is first
    hard-linked aside, so if a later rename fails the earlier ones are rolled back
    and every target is left as it was.  (A crash of the machine in the middle of
    the renames can still leave a mix; an exception cannot.)  Folders created for
    the outputs are removed again if the write fails.  A failure is reported as an
    InputError naming the target, after the rollback.
    """
    for target in files:
        why = conflict(Target(str(target), Path(target)), resolved(target), input_paths())
        if why is not None:
            raise InputError(str(target), None, None, f"refusing to write: {why}")
    made = _missing_dirs(files)
    staged: list[tuple[Path, Path]] = []
    backups: dict[Path, Path | None] = {}
    done: list[Path] = []
    current = next(iter(files), Path("."))
    ok = False
    try:
        for current, chunks in files.items():
            staged.append((_stage(current, chunks), current))
        with folders_locked(t.parent for t in files):  # two runs at once: one's files, then the other's, never a mix
            for tmp, current in staged:
                backups[current] = _keep_aside(current)
                done.append(current)  # before the rename: an interrupt right after it must still roll it back
                os.replace(tmp, current)
            for folder in {t.parent for t in files}:
                _fsync_dir(folder)
        ok = True
    except OSError as exc:
        with shielded():
            _roll_back(done, backups)
        raise InputError(str(current), None, None, f"cannot write: {exc.strerror or exc}") from exc
    except BaseException:  # an interrupt (SIGINT, SIGTERM) too: every target goes back as it was
        with shielded():
            _roll_back(done, backups)
        raise
    finally:
        with shielded():
            for tmp, _ in staged:
                _remove(tmp)
            for aside in backups.values():
                if aside is not None:
                    _remove(aside)
            if not ok:
                for folder in made:
                    try:
                        os.rmdir(folder)
                    except OSError:
                        pass


@contextmanager
def folders_locked(folders: Iterable[Path]) -> Iterator[None]:
    """Hold an exclusive advisory lock (flock) on each folder, taken in sorted order so two writers cannot deadlock.

    Two runs writing the same --out folder at once each renamed their files in turn, so the folder could end
    with one run's audit.json beside the other's today-graphs.json; under the lock one run's renames all
    happen before the other's.  A folder that cannot be opened or locked (a file system without flock) is
    written unlocked, as before.  Closing the descriptor releases its lock.
    """
    fds: list[int] = []
    try:
        for folder in sorted({Path(f) for f in folders}):
            try:
                fd = os.open(folder, os.O_RDONLY)
            except OSError:
                continue
            fds.append(fd)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except OSError:
                pass
        yield
    finally:
        for fd in reversed(fds):
            os.close(fd)


def _missing_dirs(files: Mapping[Path, object]) -> list[Path]:
    """Folders that writing these files would create, deepest first (removed again on failure)."""
    missing: set[Path] = set()
    for target in files:
        folder = target.parent
        while not folder.exists() and folder != folder.parent:
            missing.add(folder)
            folder = folder.parent
    return sorted(missing, key=lambda p: len(p.parts), reverse=True)


def _stage(target: Path, chunks: Iterable[bytes]) -> Path:
    """Write the chunks to a fresh temporary file beside target, flushed to disk; return its path.

    A target that is a folder fails here, before any plan has been replaced.
    """
    if target.is_dir():
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(target))
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        os.fchmod(fd, target.stat().st_mode & 0o777 if target.exists() else PLAN_MODE)
        with os.fdopen(fd, "wb") as fh:
            for chunk in chunks:
                fh.write(chunk)
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        with shielded():
            _remove(Path(tmp))
        raise
    return Path(tmp)


def _keep_aside(target: Path) -> Path | None:
    """A hard link to target's current file (None if there is none), for rollback."""
    if not target.exists():
        return None
    fd, aside = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".old", dir=target.parent)
    os.close(fd)
    os.unlink(aside)  # the name is ours; the link takes its place so the target never goes missing
    os.link(target, aside)
    return Path(aside)


def _roll_back(done: list[Path], backups: dict[Path, Path | None]) -> None:
    """Put every already-replaced target back as it was (or remove it if it was new)."""
    for target in reversed(done):
        aside = backups.get(target)
        try:
            if aside is None:
                os.unlink(target)
            else:
                os.replace(aside, target)
        except OSError:
            pass


def _remove(path: Path) -> None:
    """Delete a leftover temporary file; it may already be gone (renamed into place)."""
    try:
        os.unlink(path)
    except OSError:
        pass


def _fsync_dir(folder: Path) -> None:
    """Make the renames durable (POSIX); harmless where directories cannot be opened."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
