"""``python -m model.replay``: replay a trace through a serving stack's continuous batching on compiled graphs.

    python -m model.replay data/examples/serving/trace.csv --device-profile data/examples/serving/profile.toml \\
        --graphs data/examples/serving/gaudi-buckets.txt --shapes-format gaudi-file
    python -m model.replay trace.csv --device-profile P.toml --graphs neuron.json --shapes-format nxdi --replicas 4
    python -m model.replay trace.csv --device-profile P.toml --graphs g.json --slo-ttft-ms 2000 --slo-tpot-ms 100 \\
        --rate-scale 2 --json - --report replay/ --time-limit 120
    python -m model.replay trace.csv --device-profile P.toml --graphs g.json --replicas auto --rate-scale 1 2 4 \\
        --slo-ttft-ms 2000 --slo-tpot-ms 200 --max-replicas 64

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
from model.base.numbers import counted, float_flag
from model.base.runtime import Deadline, DeadlineExceeded
from model.cli_common import CommandParser, check_time_limit, run_main
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

DEFAULT_GRAPH_FORMAT = "json"
GRAPH_FORMATS = ("json", "gaudi-file", "gaudi-env", "nxdi")  # model.serving.replay_graphs.GRAPH_FORMATS
REPORT_FILES = ("timeline.png", "latency.png")  # model.report.serving_plots
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
    add_trace_args(p)
    add_server_args(p)
    add_capacity_args(p)
    p.add_argument("--json", help="write the numbers as JSON to this file ('-': stdout), e.g. --json replay.json")
    p.add_argument("--report", type=Path, help="folder for report pictures (running requests and step graphs over "
                                               "time, TTFT and TPOT distributions), e.g. --report replay/")
    p.add_argument("--time-limit", type=float_flag("--time-limit"),
                   help="seconds for the whole run, e.g. --time-limit 120 (default: no limit)")
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


def replay_words(args: argparse.Namespace) -> list[str]:
    """The replay's input flags as words, for the next command it prints (replicas left out: it sets them)."""
    words = [str(p) for p in args.requests]
    for flag in ("device_profile", "graphs", "shapes_format", "server_settings", "columns", "format", "time_column",
                 *SERVER_KEYS, "rate_scale", "slo_ttft_ms", "slo_tpot_ms", "slo_quantile"):
        value = getattr(args, flag, None)
        if value is not None:
            words += ["--" + flag.replace("_", "-"), *(map(str, value) if isinstance(value, list) else [str(value)])]
    return words


def main(argv: list[str] | None = None) -> int:
    # heavy modules only now: run_main's signal handlers are in place (see model.cli_common)
    from model.cost.serving import ServingCost
    from model.deploy.summaries import replay_summary
    from model.evaluation.replay_metrics import summarize
    from model.evaluation.replay_run import check_fits, check_span, replay, trace_of
    from model.report.json_doc import document, document_bytes
    from model.report.serving import latency_table, settings_text, summary_doc
    from model.report.serving import summary_lines as replay_lines
    from model.report.summary import summary_lines
    from model.serving.replay_graphs import read_graph_set
    from model.serving.settings import parse_flag
    from model.serving.sniff import with_format_hint

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
    graph_format = args.shapes_format or DEFAULT_GRAPH_FORMAT
    try:
        imported = read_graph_set(args.graphs, graph_format, settings,
                                  f"[server] of {args.device_profile} (or its flag)", parse_flag(args.server_settings))
    except InputError as exc:
        if exc.file != str(args.graphs):
            raise
        raise with_format_hint(exc, args.graphs, graph_format, args.shapes_format is None) from None
    graphs = imported.graphs
    trace = trace_of(load_buckets(args), 1.0 if plan.auto else plan.rate_scales[0])
    check_targets(targets)  # against every file the loaders read (a bucket file a gaudi-env names, say)
    check_fits(trace, settings, graphs, profile.kv_capacity_tokens)
    out = sys.stderr if args.json == "-" else sys.stdout
    for line in graph_warnings(imported, settings, SHOWN_NOTES):
        print(f"warning: {line}", file=sys.stderr)
    cost = ServingCost(profile)
    head = (f"{counted(len(trace), 'request')} from {', '.join(map(str, args.requests))}; "
            f"{settings_text(settings, graphs)}; graphs from {args.graphs} ({graph_format})")
    if plan.auto:
        check_span(float(trace.arrival_ms[-1]), plan.rate_scales)  # trace_of checked rate 1 only
        return capacity_main(args, plan, trace, settings, graphs, cost, deadline, head, out)
    try:
        result = replay(trace, settings, graphs, cost, plan.replicas, record=args.report is not None,
                        tick=lambda: deadline.tick("replay"))
    except DeadlineExceeded:
        raise NoPlanFound(f"the replay did not finish within --time-limit {args.time_limit:g} s "
                          f"({counted(len(trace), 'request')}, {counted(plan.replicas, 'replica')}); nothing "
                          "written") from None
    summary = summarize(result, cost, plan.slo)
    print(f"replay: {head}; {counted(plan.replicas, 'replica')}", file=out)
    print("\n".join(replay_lines(summary, graphs)), file=out)
    files: dict[Path, list[bytes]] = {}
    closing = replay_summary(summary, replay_words(args))
    print("\n".join(summary_lines(closing)), file=out)
    text = document_bytes(document("replay", closing, {"latency": latency_table(summary)},
                                   summary_doc(summary, settings, graphs))).decode("utf-8")
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
    from model.deploy.summaries import capacity_summary
    from model.evaluation.capacity import capacity
    from model.report.capacity import capacity_json, capacity_paragraphs, capacity_table
    from model.report.document import to_text
    from model.report.json_doc import DataTable, document, document_bytes
    from model.report.summary import summary_lines

    try:
        searches = capacity(trace, plan.rate_scales, settings, graphs, cost, plan.slo, plan.cap,
                            lambda: deadline.tick("capacity search"), SCAN_BELOW)
    except DeadlineExceeded:
        raise NoPlanFound(f"the capacity search did not finish within --time-limit {args.time_limit:g} s "
                          f"({len(trace)} requests, {len(plan.rate_scales)} rate scales); nothing written") from None
    sides = [(str(args.graphs), searches)]
    print(f"capacity: {head}", file=out)
    print(to_text([capacity_table(sides, plan.slo), *capacity_paragraphs(sides, plan.slo)]), file=out)
    summary = capacity_summary(searches, str(args.graphs), cost.profile.cost_per_device_hour, replay_words(args))
    print("\n".join(summary_lines(summary)), file=out)
    rows = tuple((s.rate_scale, s.replicas, s.proved, s.cap, *(
        (p.ttft_ms, p.tpot_ms, p.goodput, p.busy_ms) if (p := s.chosen) is not None else (None,) * 4))
        for s in searches)
    table = DataTable(("rate_scale", "replicas", "proved", "cap", "ttft_ms", "tpot_ms", "goodput", "busy_ms"),
                      ("x", "replicas", "", "replicas", "ms", "ms", "share", "device-ms"), rows)
    text = document_bytes(document("replay", summary, {"capacity": table}, {
        "requests": len(trace), "stack": settings.stack, "graphs": graphs.count,
        "capacity": capacity_json(searches, plan.slo)})).decode("utf-8")
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
