"""Command-line pieces of serving mode, shared by ``model.replay`` and ``model.audit --cost-model serving``.

The trace (request files with arrival times), the ``[server]`` settings and their flags,
the replica count (a number or ``auto``: the capacity search), the rate scales and the
SLO flags.  Parsing and checking only: bad values are InputErrors (one line, exit 2).
Only the standard library and ``model.base`` at the top: the command lines install their
signal handlers before anything heavy is imported (``model.cli_common``).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING

from model.base.errors import InputError
from model.base.numbers import decimal_text, float_flag, int_flag, integer_text, shown

if TYPE_CHECKING:
    from model.domain.schema import Bucket
    from model.domain.server import ServerSettings
    from model.evaluation.replay_metrics import Slo

DEFAULT_TIME_FIELD = "arrival_s"
MAX_REPLICAS = 1 << 16
DEFAULT_MAX_REPLICAS = 1024  # the capacity search's default cap
MAX_RATE_SCALE = 1e9
MAX_RATE_SCALES = 64
MAX_QUANTILE_CHARS = 100  # a quantile spelled longer is a typo (and its exponent could be any size)
SCAN_BELOW = 16  # the capacity search replays every count below an answer this small (a proof of "fewest")
AUTO = "auto"
# the [server] keys (model.domain.server.SERVER_KEYS), spelt here so the command lines import nothing heavy
SERVER_KEYS = ("stack", "max_num_seqs", "max_num_batched_tokens", "block_size", "max_prefill_seqs",
               "ctx_batch_size")


# one example value per [server] flag, for the commands' help texts
SERVER_EXAMPLES = {"stack": "--stack gaudi", "max_num_seqs": "--max-num-seqs 64",
                   "max_num_batched_tokens": "--max-num-batched-tokens 8192", "block_size": "--block-size 128",
                   "max_prefill_seqs": "--max-prefill-seqs 4", "ctx_batch_size": "--ctx-batch-size 1"}

def add_trace_args(p: argparse.ArgumentParser) -> None:
    """How the request files are read (their arrival times above all)."""
    p.add_argument("--columns", help="which columns hold the lengths (and the id): 'azure' or PROMPT,GEN[,ID], "
                                     "e.g. --columns input_tokens,output_tokens,id")
    p.add_argument("--format", choices=("jsonl", "csv", "parquet"),
                   help="request file format, e.g. --format csv (default: by suffix)")
    p.add_argument("--time-column", help=f"arrival-time column (seconds or ISO 8601; default: {DEFAULT_TIME_FIELD} "
                                         "when present, Azure's TIMESTAMP with --columns azure), e.g. --time-column t")


def add_server_args(p: argparse.ArgumentParser) -> None:
    """``--server-settings`` and one flag per ``[server]`` key (each replaces the profile's key)."""
    p.add_argument("--server-settings", help="more settings the stack's graph rules read, e.g. max_model_len=16384 "
                                              "(NAME=VALUE pairs, comma separated)")
    for key in SERVER_KEYS:
        flag = "--" + key.replace("_", "-")
        p.add_argument(flag, type=str if key == "stack" else int_flag(flag), default=None,
                       help=f"replaces [server] {key}, e.g. {SERVER_EXAMPLES[key]}")


def add_capacity_args(p: argparse.ArgumentParser) -> None:
    """Replicas (a count or ``auto``), rate scales and SLOs."""
    p.add_argument("--replicas", default="1", help="replicas serving the trace, dealt round-robin; 'auto': the "
                                                   "fewest meeting the SLOs at each --rate-scale (a table), "
                                                   "e.g. --replicas 4 or --replicas auto")
    p.add_argument("--rate-scale", nargs="+", action="extend", type=float_flag("--rate-scale"), default=None,
                   help="divide arrival times by this (2: twice the rate, default 1); with --replicas auto, several "
                        "(the flag given twice adds to the list), e.g. --rate-scale 1 2 4")
    p.add_argument("--max-replicas", type=int_flag("--max-replicas"), default=None,
                   help=f"with --replicas auto: try at most this many, e.g. --max-replicas 64 (default "
                        f"{DEFAULT_MAX_REPLICAS})")
    add_slo_args(p)


def add_slo_args(p: argparse.ArgumentParser) -> None:
    """The SLO flags: TTFT and TPOT objectives and the quantile they are judged at (``parse_slo``)."""
    p.add_argument("--slo-ttft-ms", type=float_flag("--slo-ttft-ms"),
                   help="TTFT objective (ms), e.g. --slo-ttft-ms 2000")
    p.add_argument("--slo-tpot-ms", type=float_flag("--slo-tpot-ms"),
                   help="TPOT objective (ms), e.g. --slo-tpot-ms 100")
    p.add_argument("--slo-quantile",
                   help="the quantile the objectives are judged at, e.g. --slo-quantile 0.99 (default 0.95)")


def positive_number(flag: str, value: float, most: float = math.inf) -> float:
    """A finite number > 0 (and at most ``most``)."""
    if not (0 < value <= most and math.isfinite(value)):
        bound = "" if most == math.inf else f" up to {most:g}"
        raise InputError(flag, None, None, f"must be a positive number{bound}, got {value}")
    return value


def parse_slo(args: argparse.Namespace) -> Slo | None:
    """The SLO flags: bounds finite and non-negative, the quantile a decimal in (0, 1]."""
    from model.evaluation.replay_metrics import Slo

    for flag, value in (("--slo-ttft-ms", args.slo_ttft_ms), ("--slo-tpot-ms", args.slo_tpot_ms)):
        if value is not None and not (0 <= value < math.inf):
            raise InputError(flag, None, None, f"must be a finite non-negative number of ms, got {value}")
    if args.slo_ttft_ms is None and args.slo_tpot_ms is None:
        if args.slo_quantile is not None:
            raise InputError("--slo-quantile", None, None, "needs --slo-ttft-ms or --slo-tpot-ms")
        return None
    quantile = Fraction(95, 100)
    if args.slo_quantile is not None:
        text = args.slo_quantile.strip()
        if len(text) > MAX_QUANTILE_CHARS:
            raise InputError("--slo-quantile", None, None, f"expected at most {MAX_QUANTILE_CHARS} characters, got "
                             f"{len(text)}: {shown(text)}")
        as_float = decimal_text(text)
        if as_float is not None and not 0 < as_float <= 1:
            # before Fraction: Fraction("1e-99999999") computes 10**99999999 (it never returned)
            raise InputError("--slo-quantile", None, None, f"must be in (0, 1], got {shown(args.slo_quantile)}")
        try:
            quantile = Fraction(text)
        except (ValueError, ZeroDivisionError):
            raise InputError("--slo-quantile", None, None, f"expected a number like 0.95, got "
                             f"{shown(args.slo_quantile)}") from None
        if not 0 < quantile <= 1:
            raise InputError("--slo-quantile", None, None, f"must be in (0, 1], got {args.slo_quantile}")
    return Slo(args.slo_ttft_ms, args.slo_tpot_ms, quantile)


@dataclass(frozen=True)
class Capacity:
    """What the replica flags ask for: a fixed count at one rate scale, or the search (``replicas`` None)."""

    replicas: int | None
    rate_scales: tuple[float, ...]
    cap: int
    slo: Slo | None

    @property
    def auto(self) -> bool:
        return self.replicas is None


def parse_capacity(args: argparse.Namespace) -> Capacity:
    """--replicas N|auto, --rate-scale X..., --max-replicas, the SLOs; every combination that cannot run is refused."""
    text = args.replicas.strip()
    count = None if text == AUTO else integer_text(text)
    if text != AUTO and (count is None or not 1 <= count <= MAX_REPLICAS):
        raise InputError("--replicas", None, None, f"must be an integer from 1 to {MAX_REPLICAS} or '{AUTO}', "
                         f"got {shown(args.replicas)}")
    given = [1.0] if args.rate_scale is None else args.rate_scale
    if len(given) > MAX_RATE_SCALES:
        raise InputError("--rate-scale", None, None, f"{len(given)} values; at most {MAX_RATE_SCALES}")
    scales = tuple(positive_number("--rate-scale", x, MAX_RATE_SCALE) for x in given)
    if len(set(scales)) != len(scales):
        raise InputError("--rate-scale", None, None, f"a value is given twice: {' '.join(f'{x:g}' for x in scales)}")
    slo = parse_slo(args)
    if count is not None:
        if len(scales) > 1:
            raise InputError("--rate-scale", None, None, f"{len(scales)} values need --replicas {AUTO} (a fixed "
                             "count replays one rate)")
        if args.max_replicas is not None:
            raise InputError("--max-replicas", None, None, f"needs --replicas {AUTO}")
        return Capacity(count, scales, count, slo)
    if slo is None:
        raise InputError("--replicas", None, None, f"{AUTO} needs an objective: give --slo-ttft-ms and/or "
                         "--slo-tpot-ms (and --slo-quantile, default 0.95)")
    cap = DEFAULT_MAX_REPLICAS if args.max_replicas is None else args.max_replicas
    if not 1 <= cap <= MAX_REPLICAS:
        raise InputError("--max-replicas", None, None, f"must be an integer from 1 to {MAX_REPLICAS}, got {cap}")
    return Capacity(None, scales, cap, slo)


def load_buckets(args: argparse.Namespace) -> list[Bucket]:
    """The request files, read with their arrival times."""
    from model.load.requests import Columns, load_requests

    columns = Columns.parse(args.columns) if args.columns else None
    return [load_requests(f, f.name, columns, args.format, time_column=args.time_column,
                          time_default=DEFAULT_TIME_FIELD) for f in args.requests]


def server_from_args(args: argparse.Namespace, profile_path: Path):
    """(device profile, server settings): the profile's [server] table with the flags replacing its keys."""
    from model.load.profile import load_profile_file
    from model.load.server import server_settings

    profile, table = load_profile_file(profile_path)
    settings: ServerSettings = server_settings(table, {key: getattr(args, key) for key in SERVER_KEYS},
                                               str(profile_path))
    return profile, settings


def graph_warnings(imported, settings: ServerSettings, shown: int) -> list[str]:
    """The lines to warn about a graph config: the stack's notes (the first ``shown``, the rest counted) and gaudi
    prompt graphs over the token budget, which vllm-gaudi drops at start-up and a json set keeps."""
    from model.serving.replay_graphs import oversized_prompt_graphs

    notes = list(imported.notes[:shown])
    if len(imported.notes) > shown:
        notes.append(f"... and {len(imported.notes) - shown} more")
    graphs = imported.graphs
    oversized = oversized_prompt_graphs(graphs, settings.max_num_batched_tokens) if settings.stack == "gaudi" else []
    if oversized:
        notes.append(f"{len(oversized)} prompt graphs have B*S above max_num_batched_tokens "
                     f"{settings.max_num_batched_tokens}; vllm-gaudi drops them at start-up, the replay keeps them as "
                     "given: " + " ".join(map(str, oversized[:10])) + (" ..." if len(oversized) > 10 else ""))
    return notes
