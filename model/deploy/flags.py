"""Command-line pieces of the deployment checks: fixed shapes (``--shapes``, ``--shapes-from``), the
hold-out split (``--holdout``, ``--time-column``) and compiled graphs (``--batch-buckets``,
``--limit-graphs``, ``--max-warmup-s``), shared by ``model.solve``, ``model.sweep``,
``model.evaluate`` and ``model.audit``.  Parsing only: bad values are InputErrors (exit 2)."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from model.base.errors import InputError
from model.base.numbers import decimal_text, float_flag, int_flag
from model.cost.device import AUTO_BUCKETS, checked_buckets
from model.domain.shapeset import parse_shapes
from model.domain.windowing import parse_window
from model.serving.formats import READERS, read_shapes
from model.serving.graphs import ShapeImport
from model.serving.settings import FLAG as SETTINGS_FLAG
from model.serving.settings import parse_flag
from model.serving.sniff import with_format_hint

DEFAULT_SHAPES_FORMAT = "list"


def add_shape_args(parser: argparse.ArgumentParser) -> None:
    """``--shapes`` / ``--shapes-from FILE [--shapes-format F]``: plan only with these shapes."""
    parser.add_argument("--shapes", help="plan only with these shapes, e.g. 128,256,512 (multiples of 64; "
                                         "the shape cap K still applies)")
    parser.add_argument("--shapes-from", type=Path, help="plan only with the shapes a serving config compiles, e.g. "
                                                         "--shapes-from neuron.json --shapes-format nxdi")
    add_shapes_format_arg(parser)
    add_server_settings_arg(parser)


def add_server_settings_arg(parser: argparse.ArgumentParser, dest: str = "server_settings") -> None:
    """``--server-settings NAME=N,...``: the server settings a config's rules need and it does not state."""
    parser.add_argument(SETTINGS_FLAG, dest=dest,
                        help="with --shapes-from: server settings the config's rules need, e.g. "
                             "max_num_batched_tokens=8192,max_model_len=4096 (gaudi exp needs both)")


def add_shapes_format_arg(parser: argparse.ArgumentParser) -> None:
    """``--shapes-format F``: how to read the shapes file (default ``list``)."""
    parser.add_argument("--shapes-format", default=None,
                        help=f"format of the shapes file: {', '.join(READERS)}, e.g. --shapes-format gaudi-file "
                             f"(default {DEFAULT_SHAPES_FORMAT})")


def add_batch_buckets_arg(parser: argparse.ArgumentParser) -> None:
    """``--batch-buckets 1,2,4,...``: the batch sizes the stack compiles (device mode)."""
    parser.add_argument("--batch-buckets", help="device mode: the stack compiles these batch sizes, e.g. 1,2,4,8 "
                                                "(a batch of n runs in graph (B, shape), B the smallest >= n), or "
                                                "auto: the planner chooses them with the shapes")


def add_graph_cap_args(parser: argparse.ArgumentParser) -> None:
    """``--limit-graphs N`` and ``--max-warmup-s S``: caps on what a plan compiles, across all buckets."""
    parser.add_argument("--limit-graphs", type=int_flag("--limit-graphs"), default=None,
                        help="with batch buckets: at most N distinct graphs (batch bucket, shape) across all "
                             "buckets, e.g. --limit-graphs 24")
    parser.add_argument("--max-warmup-s", type=float_flag("--max-warmup-s"), default=None,
                        help="with batch buckets: warm-up (compile time x distinct graphs) at most S seconds, e.g. "
                             "--max-warmup-s 600")


MAX_BATCH_BUCKET = 2**31 - 1  # as max_batch_size: a larger batch is a typo, not a plan


def parse_batch_buckets(text: str | None) -> tuple[int, ...] | str | None:
    """``--batch-buckets 1,2,4,8``: strictly increasing positive integers (None: not given); ``auto``: the planner
    chooses them (``model.planning.bucket_choice``)."""
    if text is None:
        return None
    if text == AUTO_BUCKETS:
        return AUTO_BUCKETS
    parts = text.split(",")
    if not all(p.isascii() and p.isdigit() for p in parts):  # ASCII digits only: no spaces, signs or exponents
        raise InputError("--batch-buckets", None, None,
                         f"expected strictly increasing positive integers like 1,2,4,8 (or auto), got {text!r}")
    if any(len(p.lstrip("0")) > len(str(MAX_BATCH_BUCKET)) or int(p) > MAX_BATCH_BUCKET for p in parts):
        raise InputError("--batch-buckets", None, None, f"a batch size is at most {MAX_BATCH_BUCKET} (as "
                         f"--max-batch-size), got {text if len(text) <= 40 else text[:40] + '...'!r}")
    try:
        return checked_buckets([int(p) for p in parts])

    except ValueError as exc:
        raise InputError("--batch-buckets", None, None, f"{exc} ({text!r})") from None


def parse_graph_caps(limit_graphs: int | None, max_warmup_s: float | None, most: int
                     ) -> tuple[int | None, float | None]:
    """``--limit-graphs`` (1 to ``most``) and ``--max-warmup-s`` (a finite non-negative number of seconds)."""
    if limit_graphs is not None and not 1 <= limit_graphs <= most:
        raise InputError("--limit-graphs", None, None, f"must be a positive integer, got {limit_graphs}"
                         if limit_graphs < 1 else f"must be at most {most}, got {limit_graphs}")
    if max_warmup_s is not None and not (math.isfinite(max_warmup_s) and max_warmup_s >= 0):
        raise InputError("--max-warmup-s", None, None, f"must be a finite non-negative number of seconds, got "
                         f"{max_warmup_s}")
    return limit_graphs, max_warmup_s


def add_holdout_args(parser: argparse.ArgumentParser) -> None:
    """``--holdout FRACTION`` and ``--time-column NAME``."""
    parser.add_argument("--holdout", help="hold out this fraction (0 < f < 1) of each bucket, the latest arrivals "
                                          "(else the last in file order): choose shapes on the rest and check them "
                                          "on it, e.g. --holdout 0.3")
    parser.add_argument("--time-column", help="arrival-time column (seconds or ISO 8601; Azure's TIMESTAMP is read "
                                              "by itself), e.g. --time-column arrival_s")


def add_window_args(parser: argparse.ArgumentParser, time_column: bool = False, sweep: bool = False) -> None:
    """``--window SECONDS`` (and ``--time-column NAME`` where the command has no hold-out flags; ``--windows``
    on the sweep)."""
    parser.add_argument("--window", help="batch only requests that arrive in the same window of this many seconds "
                                         "(needs arrival times: Azure's TIMESTAMP, or --time-column), e.g. --window 60")
    if sweep:
        parser.add_argument("--windows", help="sweep the window length: seconds as a comma list, e.g. 10,30,60,300")
    if time_column:
        parser.add_argument("--time-column", help="arrival-time column (seconds or ISO 8601; Azure's TIMESTAMP is "
                                                  "read by itself), e.g. --time-column arrival_s")


def parse_windows(text: str | None) -> tuple[float, ...] | None:
    """``--windows 10,30,60,300``: distinct window lengths in seconds, in increasing order (None: not given)."""
    if text is None:
        return None
    parts = [t.strip() for t in text.split(",")]
    if not all(parts):
        raise InputError("--windows", None, None, f"expected seconds like 10,30,60,300, got {text!r}")
    return tuple(sorted({parse_window(t, "--windows") for t in parts}))


def import_config(path: Path, fmt: str | None, settings: str | None = None) -> ShapeImport:
    """A serving config read by its stack's rules: its shapes, its graphs and the warnings to show.  A file that
    does not read in the format given (or the default, ``list``) is refused with the format its content suggests,
    never read in a guessed one."""
    chosen = fmt or DEFAULT_SHAPES_FORMAT
    try:
        return read_shapes(path, chosen, settings=parse_flag(settings))
    except InputError as exc:
        if exc.file != str(path):  # a bad flag or another file (a bucket file an env names): not this file's format
            raise
        raise with_format_hint(exc, path, chosen, fmt is None) from None


def warning_text(imported: ShapeImport) -> str | None:
    """The import's warnings as the text after a caller's "warning: " (one line each), or None."""
    lines = imported.warnings()
    return "\nwarning: ".join(lines) if lines else None


def shapes_from_file(path: Path, fmt: str | None, settings: str | None = None) -> tuple[tuple[int, ...], str | None]:
    """The shapes a serving config compiles, and its warnings (names never read, the lengths rounded up)."""
    imported = import_config(path, fmt, settings)
    return imported.shapes, warning_text(imported)


def allowed_from_args(args: argparse.Namespace) -> tuple[tuple[int, ...] | None, str | None]:
    """The allowed shapes the flags give (None: free choice), and a warning to print (or None)."""
    text, path = getattr(args, "shapes", None), getattr(args, "shapes_from", None)
    fmt = getattr(args, "shapes_format", None)
    if text is not None and path is not None:
        raise InputError("--shapes", None, None, "give --shapes or --shapes-from, not both")
    settings = getattr(args, "server_settings", None)
    if fmt is not None and path is None:
        raise InputError("--shapes-format", None, None, "needs --shapes-from FILE")
    if settings is not None and path is None:
        raise InputError(SETTINGS_FLAG, None, None, "needs --shapes-from FILE")
    if text is not None:
        return parse_shapes(text), None
    if path is not None:
        return shapes_from_file(path, fmt, settings)
    return None, None


def parse_fraction(text: str | None, flag: str = "--holdout") -> float | None:
    """``--holdout``: a number strictly between 0 and 1 (None when not given)."""
    if text is None:
        return None
    value = decimal_text(text)
    if value is None:
        raise InputError(flag, None, None, f"expected a fraction between 0 and 1, like 0.3, got {text!r}")
    if not (math.isfinite(value) and 0 < value < 1):
        raise InputError(flag, None, None, f"must lie strictly between 0 and 1, got {text!r}")
    return value
