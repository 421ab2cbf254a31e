"""``python -m model.replay``: replay a trace through a serving stack's continuous batching on compiled graphs.

    python -m model.replay REQUESTS... --device-profile P.toml --graphs CONFIG --shapes-format F
        [--replicas R] [--rate-scale X] [--slo-ttft-ms T --slo-tpot-ms U --slo-quantile 0.95]
        [--json FILE | --json -] [--report DIR] [--time-limit S]
    python -m model.replay ... --replicas auto --rate-scale 1 2 4 --slo-ttft-ms T [--slo-tpot-ms U]
        [--max-replicas N] [--json FILE]

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
together or not at all, and never over an input.

``--replicas auto`` is the capacity answer: at each rate scale, the fewest replicas whose
replay meets the SLO quantiles (``model.evaluation.capacity``: 1, 2, 4, ... then bisection,
count - 1 replayed and failing; at most --max-replicas, default 1024, else the row says
so), printed as a table of rate, replicas, TTFT and TPOT at the quantile and busy share.
--time-limit bounds the whole run.  Exit status: 0 done; 2 bad input; 4 the replay (or
search) did not finish within --time-limit (nothing written); 130 / 143 interrupted.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from model.base.errors import InputError, NoPlanFound
from model.base.numbers import float_flag
from model.base.runtime import Deadline, DeadlineExceeded
from model.cli_common import check_time_limit, run_main
from model.deploy.serving_flags import (
    AUTO,
    SCAN_BELOW,
    SERVER_KEYS,
    Capacity,
    add_capacity_args,
    add_server_args,
    add_trace_args,
    graph_warnings,
    load_buckets,
    parse_capacity,
    parse_slo,
    server_from_args,
)
from model.load.outputs import Target, check_targets, files_in, write_together

if TYPE_CHECKING:  # imported where used, after run_main's signal handlers are in place (see model.cli_common)
    from model.evaluation.replay_run import Trace

__all__ = ["SERVER_KEYS", "main", "parse_slo", "parser"]  # SERVER_KEYS and parse_slo: the tests read them here

GRAPH_FORMATS = ("json", "gaudi-file", "gaudi-env", "nxdi")  # model.serving.replay_graphs.GRAPH_FORMATS
REPORT_FILES = ("timeline.png", "latency.png")  # model.report.serving_plots
SHOWN_NOTES = 10  # warnings about the graph config shown; the rest are counted


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m model.replay", description=__doc__.split("\n")[0])
    p.add_argument("requests", nargs="+", type=Path, help="request files with arrival times (JSONL, CSV, Parquet)")
    p.add_argument("--device-profile", type=Path, required=True, help="profile TOML: [device] and [server] tables")
    p.add_argument("--graphs", type=Path, required=True, help="the compiled graph set (a serving config)")
    p.add_argument("--shapes-format", default="json", help=f"format of --graphs: {', '.join(GRAPH_FORMATS)} "
                                                           "(default json)")
    add_trace_args(p)
    add_server_args(p)
    add_capacity_args(p)
    p.add_argument("--json", help="write the numbers as JSON to this file ('-': stdout)")
    p.add_argument("--report", type=Path, help="folder for report pictures (running requests and step graphs over "
                                               "time, TTFT and TPOT distributions)")
    p.add_argument("--time-limit", type=float_flag("--time-limit"),
                   help="seconds for the whole run (default: no limit)")
    return p


def output_targets(args: argparse.Namespace) -> list[Target]:
    """Every path the flags ask to write (``--json -`` is stdout, no file)."""
    targets = []
    if args.json not in (None, "-"):
        targets.append(Target("--json", Path(args.json), "file", "give the path of the JSON file to write"))
    if args.report is not None:
        targets += [Target("--report", args.report, "folder", "give a folder for the report pictures"),
                    *files_in("--report", args.report, REPORT_FILES)]
    return targets


def main(argv: list[str] | None = None) -> int:
    # heavy modules only now: run_main's signal handlers are in place (see model.cli_common)
    from model.cost.serving import ServingCost
    from model.evaluation.replay_metrics import summarize
    from model.evaluation.replay_run import check_fits, check_span, replay, trace_of
    from model.report.serving import settings_text, summary_json, summary_lines
    from model.serving.replay_graphs import read_graph_set
    from model.serving.settings import parse_flag

    args = parser().parse_args(argv)
    plan = parse_capacity(args)
    if args.time_limit is not None:
        check_time_limit(args.time_limit)
    deadline = Deadline.never() if args.time_limit is None else Deadline.after(args.time_limit)
    if plan.auto and args.report is not None:
        raise InputError("--report", None, None, f"draws one replay: give --replicas N, not {AUTO}")
    targets = output_targets(args)
    check_targets(targets, [*args.requests, args.device_profile, args.graphs])  # before anything is read
    profile, settings = server_from_args(args, args.device_profile)
    imported = read_graph_set(args.graphs, args.shapes_format, settings,
                              f"[server] of {args.device_profile} (or its flag)", parse_flag(args.server_settings))
    graphs = imported.graphs
    trace = trace_of(load_buckets(args), 1.0 if plan.auto else plan.rate_scales[0])
    check_targets(targets)  # against every file the loaders read (a bucket file a gaudi-env names, say)
    check_fits(trace, settings, graphs, profile.kv_capacity_tokens)
    out = sys.stderr if args.json == "-" else sys.stdout
    for line in graph_warnings(imported, settings, SHOWN_NOTES):
        print(f"warning: {line}", file=sys.stderr)
    cost = ServingCost(profile)
    head = (f"{len(trace)} requests from {', '.join(map(str, args.requests))}; {settings_text(settings, graphs)}; "
            f"graphs from {args.graphs} ({args.shapes_format})")
    if plan.auto:
        check_span(float(trace.arrival_ms[-1]), plan.rate_scales)  # trace_of checked rate 1 only
        return capacity_main(args, plan, trace, settings, graphs, cost, deadline, head, out)
    try:
        result = replay(trace, settings, graphs, cost, plan.replicas, record=args.report is not None,
                        tick=lambda: deadline.tick("replay"))
    except DeadlineExceeded:
        raise NoPlanFound(f"the replay did not finish within --time-limit {args.time_limit:g} s "
                          f"({len(trace)} requests, {plan.replicas} replicas); nothing written") from None
    summary = summarize(result, cost, plan.slo)
    print(f"replay: {head}; {plan.replicas} replica{'s' if plan.replicas > 1 else ''}", file=out)
    print("\n".join(summary_lines(summary, graphs)), file=out)
    files: dict[Path, list[bytes]] = {}
    text = summary_json(summary, settings, graphs)
    if args.json not in (None, "-"):
        files[Path(args.json)] = [text.encode()]
    if args.report is not None:
        from model.report.serving_plots import report_files

        files.update({args.report / name: [data] for name, data in report_files(result, summary).items()})
        if deadline.expired():  # the pictures take as long as the replay: --time-limit bounds them too
            raise NoPlanFound(f"the replay and its report did not finish within --time-limit {args.time_limit:g} s "
                              f"({len(trace)} requests); nothing written")
    if files:
        write_together(files)
        print("wrote " + ", ".join(map(str, files)), file=out)
    if args.json == "-":
        sys.stdout.write(text)
    return 0


def capacity_main(args: argparse.Namespace, plan: Capacity, trace: Trace, settings, graphs, cost,
                  deadline: Deadline, head: str, out) -> int:
    """``--replicas auto``: the capacity table (and with --json its rows and every probe)."""
    import json

    from model.evaluation.capacity import capacity
    from model.report.capacity import capacity_json, capacity_paragraphs, capacity_table
    from model.report.document import to_text

    try:
        searches = capacity(trace, plan.rate_scales, settings, graphs, cost, plan.slo, plan.cap,
                            lambda: deadline.tick("capacity search"), SCAN_BELOW)
    except DeadlineExceeded:
        raise NoPlanFound(f"the capacity search did not finish within --time-limit {args.time_limit:g} s "
                          f"({len(trace)} requests, {len(plan.rate_scales)} rate scales); nothing written") from None
    sides = [(str(args.graphs), searches)]
    print(f"capacity: {head}", file=out)
    print(to_text([capacity_table(sides, plan.slo), *capacity_paragraphs(sides, plan.slo)]), file=out)
    text = json.dumps({"requests": len(trace), "stack": settings.stack, "graphs": graphs.count,
                       "capacity": capacity_json(searches, plan.slo)}, indent=2, allow_nan=False) + "\n"
    if args.json not in (None, "-"):
        write_together({Path(args.json): [text.encode()]})
        print(f"wrote {args.json}", file=out)
    elif args.json == "-":
        sys.stdout.write(text)
    return 0


def entry() -> None:
    """Console-script entry point."""
    run_main(main)


if __name__ == "__main__":
    entry()
