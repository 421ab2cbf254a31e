"""``python -m model.replay``: replay a trace through a serving stack's continuous batching on compiled graphs.

    python -m model.replay data/examples/serving/trace.csv --device-profile data/examples/serving/profile.toml \\
        --graphs data/examples/serving/gaudi-buckets.txt --shapes-format gaudi-file
    python -m model.replay trace.csv --device-profile P.toml --graphs neuron.json --shapes-format nxdi --replicas 4
    python -m model.replay trace.csv --device-profile P.toml --graphs g.json --slo-ttft-ms 2000 --slo-tpot-ms 100 \\
        --rate-scale 2 --json - --report replay/ --time-limit 120

The scheduler and its numbers are ``shared/serving_model.md``'s: every step admits
waiting requests first come first served, runs a prompt graph and a decode graph, and
the profile's step times price them.  The profile's ``[server]`` table gives the server
settings; ``--stack``, ``--max-num-seqs``, ``--max-num-batched-tokens``, ``--block-size``,
``--max-prefill-seqs`` and ``--ctx-batch-size`` replace its keys one by one.  CONFIG is
read as graphs (``model/serving/graphs.py``): ``json`` (gaudi ``{"prompt": [[B, S], ...],
"decode": [[B, NB], ...]}``, nxdi ``{"context": [...], "token_generation": [...]}``),
``gaudi-file``, ``gaudi-env`` or ``nxdi``.

Prints busy device-hours, TTFT/TPOT/E2E percentiles, goodput, pad ratios, the graphs and
their warm-up, and the graphs compiled at run time.  ``--json FILE`` writes the same at
full precision (``-``: to stdout, the text then goes to stderr); outputs are written all
together or not at all, and never over an input.  Exit status: 0 done; 2 bad input;
4 the replay did not finish within --time-limit (nothing written); 130 / 143 interrupted.
"""

from __future__ import annotations

import argparse
import math
import sys
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING

from model.base.errors import InputError, NoPlanFound
from model.base.numbers import counted, float_flag, int_flag
from model.base.runtime import Deadline, DeadlineExceeded
from model.cli_common import SERVER_EXAMPLES, CommandParser, check_time_limit, run_main
from model.load.outputs import Target, check_targets, files_in, write_together

if TYPE_CHECKING:  # imported where used, after run_main's signal handlers are in place (see model.cli_common)
    from model.evaluation.replay_metrics import Slo
    from model.evaluation.replay_run import Trace

DEFAULT_TIME_FIELD = "arrival_s"
MAX_REPLICAS = 1 << 16
MAX_RATE_SCALE = 1e9
DEFAULT_GRAPH_FORMAT = "json"
GRAPH_FORMATS = ("json", "gaudi-file", "gaudi-env", "nxdi")  # model.serving.replay_graphs.GRAPH_FORMATS
# the [server] keys (model.domain.server.SERVER_KEYS) and the report's files (model.report.serving_plots)
SERVER_KEYS = ("stack", "max_num_seqs", "max_num_batched_tokens", "block_size", "max_prefill_seqs",
               "ctx_batch_size")
REPORT_FILES = ("timeline.png", "latency.png")
SHOWN_NOTES = 10  # warnings about the graph config shown; the rest are counted


def parser() -> argparse.ArgumentParser:
    p = CommandParser("model.replay", __doc__)
    p.add_argument("requests", nargs="+", type=Path,
                   help="request files with arrival times (JSONL, CSV, Parquet), e.g. trace.csv")
    p.add_argument("--device-profile", type=Path, required=True,
                   help="profile TOML: [device] and [server] tables, e.g. "
                        "--device-profile data/examples/serving/profile.toml")
    p.add_argument("--graphs", type=Path, required=True, help="the compiled graph set (a serving config), e.g. "
                                                              "--graphs buckets.txt --shapes-format gaudi-file")
    p.add_argument("--shapes-format", default=None, help=f"format of --graphs: {', '.join(GRAPH_FORMATS)}, "
                                                           "e.g. --shapes-format nxdi (default json)")
    p.add_argument("--server-settings", help="more settings the stack's graph rules read, e.g. max_model_len=16384 "
                                              "(NAME=VALUE pairs, comma separated)")
    p.add_argument("--columns", help="which columns hold the lengths (and the id): 'azure' or PROMPT,GEN[,ID], "
                                     "e.g. --columns input_tokens,output_tokens,id")
    p.add_argument("--format", choices=("jsonl", "csv", "parquet"),
                   help="request file format, e.g. --format csv (default: by suffix)")
    p.add_argument("--time-column", help=f"arrival-time column (seconds or ISO 8601; default: {DEFAULT_TIME_FIELD} "
                                         "when present, Azure's TIMESTAMP with --columns azure), e.g. --time-column t")
    for key in SERVER_KEYS:
        flag = "--" + key.replace("_", "-")
        p.add_argument(flag, type=str if key == "stack" else int_flag(flag), default=None,
                       help=f"replaces [server] {key}, e.g. {SERVER_EXAMPLES[key]}")
    p.add_argument("--replicas", type=int_flag("--replicas"), default=1,
                   help="replicas serving the trace, dealt round-robin, e.g. --replicas 4 (default 1)")
    p.add_argument("--rate-scale", type=float_flag("--rate-scale"), default=1.0,
                   help="divide arrival times by this, e.g. --rate-scale 2 (twice the rate)")
    p.add_argument("--slo-ttft-ms", type=float_flag("--slo-ttft-ms"),
                   help="TTFT objective (ms), e.g. --slo-ttft-ms 2000")
    p.add_argument("--slo-tpot-ms", type=float_flag("--slo-tpot-ms"),
                   help="TPOT objective (ms), e.g. --slo-tpot-ms 100")
    p.add_argument("--slo-quantile", help="the quantile the objectives are judged at, e.g. --slo-quantile 0.99 "
                                                 "(default 0.95)")
    p.add_argument("--json", help="write the numbers as JSON to this file ('-': stdout), e.g. --json replay.json")
    p.add_argument("--report", type=Path, help="folder for report pictures (running requests and step graphs over "
                                               "time, TTFT and TPOT distributions), e.g. --report replay/")
    p.add_argument("--time-limit", type=float_flag("--time-limit"),
                   help="seconds for the replay itself, e.g. --time-limit 120 (default: no limit)")
    return p


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
        try:
            quantile = Fraction(args.slo_quantile.strip())
        except (ValueError, ZeroDivisionError):
            raise InputError("--slo-quantile", None, None, f"expected a number like 0.95, got "
                             f"{args.slo_quantile!r}") from None
        if not 0 < quantile <= 1:
            raise InputError("--slo-quantile", None, None, f"must be in (0, 1], got {args.slo_quantile}")
    return Slo(args.slo_ttft_ms, args.slo_tpot_ms, quantile)


def output_targets(args: argparse.Namespace) -> list[Target]:
    """Every path the flags ask to write (``--json -`` is stdout, no file)."""
    targets = []
    if args.json not in (None, "-"):
        targets.append(Target("--json", Path(args.json), "file", "give the path of the JSON file to write"))
    if args.report is not None:
        targets += [Target("--report", args.report, "folder", "give a folder for the report pictures"),
                    *files_in("--report", args.report, REPORT_FILES)]
    return targets


def load_trace(args: argparse.Namespace) -> Trace:
    """The request files, read with their arrival times, as one trace."""
    from model.evaluation.replay_run import trace_of
    from model.load.requests import Columns, load_requests

    columns = Columns.parse(args.columns) if args.columns else None
    buckets = [load_requests(f, f.name, columns, args.format, time_column=args.time_column,
                             time_default=DEFAULT_TIME_FIELD) for f in args.requests]
    return trace_of(buckets, args.rate_scale)


def main(argv: list[str] | None = None) -> int:
    # heavy modules only now: run_main's signal handlers are in place (see model.cli_common)
    from model.cost.serving import ServingCost
    from model.evaluation.replay_metrics import summarize
    from model.evaluation.replay_run import check_fits, replay
    from model.load.profile import load_profile_file
    from model.load.server import server_settings
    from model.report.serving import settings_text, summary_json, summary_lines
    from model.serving.replay_graphs import oversized_prompt_graphs, read_graph_set
    from model.serving.settings import parse_flag
    from model.serving.sniff import with_format_hint

    args = parser().parse_args(argv)
    if not 1 <= args.replicas <= MAX_REPLICAS:
        raise InputError("--replicas", None, None, f"must be an integer from 1 to {MAX_REPLICAS}, got {args.replicas}")
    positive_number("--rate-scale", args.rate_scale, MAX_RATE_SCALE)
    if args.time_limit is not None:
        check_time_limit(args.time_limit)
    slo = parse_slo(args)
    targets = output_targets(args)
    check_targets(targets, [*args.requests, args.device_profile, args.graphs])  # before anything is read
    profile, table = load_profile_file(args.device_profile)
    settings = server_settings(table, {key: getattr(args, key) for key in SERVER_KEYS}, str(args.device_profile))
    extra = parse_flag(args.server_settings)
    graph_format = args.shapes_format or DEFAULT_GRAPH_FORMAT
    try:
        imported = read_graph_set(args.graphs, graph_format, settings,
                                  f"[server] of {args.device_profile} (or its flag)", extra)
    except InputError as exc:
        if exc.file != str(args.graphs):
            raise
        raise with_format_hint(exc, args.graphs, graph_format, args.shapes_format is None) from None
    graphs = imported.graphs
    trace = load_trace(args)
    check_targets(targets)  # against every file the loaders read (a bucket file a gaudi-env names, say)
    check_fits(trace, settings, graphs, profile.kv_capacity_tokens)
    oversized = oversized_prompt_graphs(graphs, settings.max_num_batched_tokens) if settings.stack == "gaudi" else []
    out = sys.stderr if args.json == "-" else sys.stdout
    for note in imported.notes[:SHOWN_NOTES]:
        print(f"warning: {note}", file=sys.stderr)
    if len(imported.notes) > SHOWN_NOTES:
        print(f"warning: ... and {len(imported.notes) - SHOWN_NOTES} more", file=sys.stderr)
    if oversized:
        print(f"warning: {len(oversized)} prompt graphs have B*S above max_num_batched_tokens "
              f"{settings.max_num_batched_tokens}; vllm-gaudi drops them at start-up, the replay keeps them as given: "
              + " ".join(map(str, oversized[:10])) + (" ..." if len(oversized) > 10 else ""), file=sys.stderr)
    cost = ServingCost(profile)
    deadline = Deadline.never() if args.time_limit is None else Deadline.after(args.time_limit)
    try:
        result = replay(trace, settings, graphs, cost, args.replicas, record=args.report is not None,
                        tick=lambda: deadline.tick("replay"))
    except DeadlineExceeded:
        raise NoPlanFound(f"the replay did not finish within --time-limit {args.time_limit:g} s "
                          f"({counted(len(trace), 'request')}, {counted(args.replicas, 'replica')}); nothing "
                          "written") from None
    summary = summarize(result, cost, slo)
    print(f"replay: {counted(len(trace), 'request')} from {', '.join(map(str, args.requests))}; {args.replicas} "
          f"replica{'s' if args.replicas > 1 else ''}; {settings_text(settings, graphs)}; graphs from {args.graphs} "
          f"({graph_format})", file=out)
    print("\n".join(summary_lines(summary, graphs)), file=out)
    files: dict[Path, list[bytes]] = {}
    text = summary_json(summary, settings, graphs)
    if args.json not in (None, "-"):
        files[Path(args.json)] = [text.encode()]
    if args.report is not None:
        from model.report.serving_plots import report_files

        files.update({args.report / name: [data] for name, data in report_files(result, summary).items()})
    if files:
        write_together(files)
        print("wrote " + ", ".join(map(str, files)), file=out)
    if args.json == "-":
        sys.stdout.write(text)
    return 0


def entry() -> None:
    """Console-script entry point."""
    run_main(main)


if __name__ == "__main__":
    entry()
