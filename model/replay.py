"""``python -m model.replay``: replay a trace through a serving stack's continuous batching on compiled graphs.

    python -m model.replay REQUESTS... --device-profile P.toml --graphs CONFIG --shapes-format F
        [--replicas R] [--rate-scale X] [--slo-ttft-ms T --slo-tpot-ms U --slo-quantile 0.95]
        [--json FILE | --json -] [--report DIR] [--time-limit S]

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

from model.base.errors import InputError, NoPlanFound
from model.base.runtime import Deadline, DeadlineExceeded
from model.cli_common import check_time_limit, run_main
from model.cost.serving import ServingCost
from model.domain.server import SERVER_KEYS
from model.evaluation.replay_metrics import Slo, summarize
from model.evaluation.replay_run import check_fits, replay, trace_of
from model.load.plans import write_together
from model.load.profile import load_profile_file
from model.load.requests import Columns, load_requests
from model.load.server import flag_name, server_settings
from model.report.serving import settings_text, summary_json, summary_lines
from model.report.serving_plots import report_files
from model.serving.graphs import GRAPH_FORMATS, oversized_prompt_graphs, read_graphs

DEFAULT_TIME_FIELD = "arrival_s"
MAX_REPLICAS = 1 << 16
MAX_RATE_SCALE = 1e9


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m model.replay", description=__doc__.split("\n")[0])
    p.add_argument("requests", nargs="+", type=Path, help="request files with arrival times (JSONL, CSV, Parquet)")
    p.add_argument("--device-profile", type=Path, required=True, help="profile TOML: [device] and [server] tables")
    p.add_argument("--graphs", type=Path, required=True, help="the compiled graph set (a serving config)")
    p.add_argument("--shapes-format", default="json", help=f"format of --graphs: {', '.join(GRAPH_FORMATS)} "
                                                           "(default json)")
    p.add_argument("--columns", help="column mapping: 'azure' or PROMPT,GEN[,ID] (CSV/Parquet inputs)")
    p.add_argument("--format", choices=("jsonl", "csv", "parquet"), help="input format (default: by suffix)")
    p.add_argument("--time-column", help=f"arrival-time column (seconds or ISO 8601; default: {DEFAULT_TIME_FIELD} "
                                         "when present, Azure's TIMESTAMP with --columns azure)")
    for key in SERVER_KEYS:
        p.add_argument(flag_name(key), type=str if key == "stack" else int, default=None,
                       help=f"replaces [server] {key}")
    p.add_argument("--replicas", type=int, default=1, help="replicas serving the trace, dealt round-robin")
    p.add_argument("--rate-scale", type=float, default=1.0, help="divide arrival times by this (2: twice the rate)")
    p.add_argument("--slo-ttft-ms", type=float, help="TTFT objective (ms)")
    p.add_argument("--slo-tpot-ms", type=float, help="TPOT objective (ms)")
    p.add_argument("--slo-quantile", help="the quantile the objectives are judged at (default 0.95)")
    p.add_argument("--json", help="write the numbers as JSON to this file ('-': stdout)")
    p.add_argument("--report", type=Path, help="folder for report pictures (running requests and step graphs over "
                                               "time, TTFT and TPOT distributions)")
    p.add_argument("--time-limit", type=float, help="seconds for the replay itself (default: no limit)")
    return p


def positive_number(flag: str, value: float, most: float = math.inf) -> float:
    """A finite number > 0 (and at most ``most``)."""
    if not (0 < value <= most and math.isfinite(value)):
        bound = "" if most == math.inf else f" up to {most:g}"
        raise InputError(flag, None, None, f"must be a positive number{bound}, got {value}")
    return value


def parse_slo(args: argparse.Namespace) -> Slo | None:
    """The SLO flags: bounds finite and non-negative, the quantile a decimal in (0, 1]."""
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


def check_outputs(args: argparse.Namespace, inputs: list[Path]) -> Path | None:
    """The --json target (None: stdout or no file); no output may replace an input."""
    target = None if args.json in (None, "-") else Path(args.json)
    seen = {p.resolve() for p in inputs}
    if target is not None:
        if target.is_dir():
            raise InputError("--json", None, None, f"{target} is a folder; give a file name")
        if target.resolve() in seen:
            raise InputError("--json", None, None, f"{target} is an input of this run; choose another file")
    if args.report is not None:
        if args.report.exists() and not args.report.is_dir():
            raise InputError("--report", None, None, f"{args.report} is a file; give a folder for the report")
        if any(p.parent == args.report.resolve() for p in seen):
            raise InputError("--report", None, None, f"{args.report} holds an input of this run; choose another folder")
    return target


def load_trace(args: argparse.Namespace):
    """The request files, read with their arrival times, as one trace."""
    columns = Columns.parse(args.columns) if args.columns else None
    buckets = [load_requests(f, f.name, columns, args.format, time_column=args.time_column,
                             time_default=DEFAULT_TIME_FIELD) for f in args.requests]
    return trace_of(buckets, args.rate_scale)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if not 1 <= args.replicas <= MAX_REPLICAS:
        raise InputError("--replicas", None, None, f"must be an integer from 1 to {MAX_REPLICAS}, got {args.replicas}")
    positive_number("--rate-scale", args.rate_scale, MAX_RATE_SCALE)
    if args.time_limit is not None:
        check_time_limit(args.time_limit)
    slo = parse_slo(args)
    profile, table = load_profile_file(args.device_profile)
    settings = server_settings(table, {key: getattr(args, key) for key in SERVER_KEYS}, str(args.device_profile))
    graphs = read_graphs(args.graphs, args.shapes_format, settings.stack)
    target = check_outputs(args, [*args.requests, args.device_profile, args.graphs, Path(graphs.source)])
    trace = load_trace(args)
    check_fits(trace, settings, graphs, profile.kv_capacity_tokens)
    dropped = oversized_prompt_graphs(graphs, settings.max_num_batched_tokens) if settings.stack == "gaudi" else []
    out = sys.stderr if args.json == "-" else sys.stdout
    if dropped:
        print(f"warning: {len(dropped)} prompt graphs have B*S above max_num_batched_tokens "
              f"{settings.max_num_batched_tokens}; vllm-gaudi drops them at start-up, the replay keeps them as given: "
              + " ".join(map(str, dropped[:10])) + (" ..." if len(dropped) > 10 else ""), file=sys.stderr)
    cost = ServingCost(profile)
    deadline = Deadline.never() if args.time_limit is None else Deadline.after(args.time_limit)
    try:
        result = replay(trace, settings, graphs, cost, args.replicas, record=args.report is not None,
                        tick=lambda: deadline.tick("replay"))
    except DeadlineExceeded:
        raise NoPlanFound(f"the replay did not finish within --time-limit {args.time_limit:g} s "
                          f"({len(trace)} requests, {args.replicas} replicas); nothing written") from None
    summary = summarize(result, cost, slo)
    print(f"replay: {len(trace)} requests from {', '.join(map(str, args.requests))}; {args.replicas} "
          f"replica{'s' if args.replicas > 1 else ''}; {settings_text(settings, graphs)}; graphs from {args.graphs} "
          f"({args.shapes_format})", file=out)
    print("\n".join(summary_lines(summary, graphs)), file=out)
    files: dict[Path, list[bytes]] = {}
    text = summary_json(summary, settings, graphs)
    if target is not None:
        files[target] = [text.encode()]
    if args.report is not None:
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
