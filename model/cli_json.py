"""``--json FILE`` (or ``-``) on every command line: where the document goes, checked first, written last.

The document itself is ``model.report.json_doc``'s.  This module holds the flag and the
plumbing every command shares: the target is checked with the other outputs before any
work (never an input, never a folder, ``model.load.outputs.check_targets``); the file is
written through ``write_together`` with the command's other files, so it lands whole or
not at all; and with ``-`` everything the command prints goes to stderr while the run
lasts, so stdout holds the JSON document and nothing else.  Like ``model.cli_common`` it
imports only the standard library and the light ``model.load`` modules at its top.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from model.base.errors import InputError
from model.load.outputs import Target, file_flag

STDOUT = "-"


def add_json_arg(parser: argparse.ArgumentParser) -> None:
    """``--json FILE``: the summary and tables as one JSON document (docs/json.md); ``-`` for stdout."""
    parser.add_argument("--json", metavar="FILE", help="also write the summary and tables as one JSON document "
                        "(schema: docs/json.md) to FILE, all or nothing; '-' writes it to stdout and everything "
                        "else to stderr, e.g. --json - | jq .summary")


def json_targets(spec: str | None) -> list[Target]:
    """The --json file as an output target (none for stdout or no flag)."""
    if spec is None or spec == STDOUT:
        return []
    if not spec.strip():
        raise InputError("--json", None, None, "empty path; give the path of the JSON file to write, or - for stdout")
    return [Target("--json", file_flag("--json")(spec), "file", "give the path of the JSON file to write")]


@dataclass(frozen=True)
class JsonOut:
    """Where the document goes: ``spec`` as given (None: no document) and the real stdout of the run."""

    spec: str | None
    stdout: TextIO

    @property
    def wanted(self) -> bool:
        return self.spec is not None

    def files(self, data: bytes) -> dict[Path, list[bytes]]:
        """The document as a file to write with the command's others ({} for stdout or no flag)."""
        return {} if self.spec in (None, STDOUT) else {Path(self.spec): [data]}

    def emit(self, data: bytes) -> None:
        """With ``-``: the document on stdout, the only thing there."""
        if self.spec == STDOUT:
            self.stdout.write(data.decode("utf-8"))
            self.stdout.flush()


@contextmanager
def json_output(spec: str | None) -> Iterator[JsonOut]:
    """The run's JsonOut; with ``-`` the command's prints go to stderr inside the block."""
    out = JsonOut(spec, sys.stdout)
    if spec == STDOUT:
        with redirect_stdout(sys.stderr):
            yield out
    else:
        yield out


# the flags that say what to plan and under which cost model, repeated in a printed next command
INPUT_WORD_FLAGS = ("scenario", "columns", "format", "cost_model", "device_profile", "cost_params", "max_seq_len",
                    "batch_buckets", "time_column", "window", "max_batch_size")


def input_words(args: argparse.Namespace, positional: str = "requests") -> list[str]:
    """The input part of the command line as words: the request files, then each input flag given (so a
    printed next command reads the same traffic under the same cost model)."""
    words = [str(p) for p in getattr(args, positional, None) or []]
    for name in INPUT_WORD_FLAGS:
        value = getattr(args, name, None)
        if value is not None and value is not False:
            words += ["--" + name.replace("_", "-"), str(value)]
    return words


def cost_flag_given(args: argparse.Namespace) -> bool:
    """Whether the command line chose the cost model (else request files are planned in the reference mode)."""
    return any(getattr(args, name, None) is not None for name in ("cost_model", "device_profile", "cost_params"))
