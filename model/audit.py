"""``python -m model.audit``: what today's compiled shapes cost against optimised ones, on the same traffic.

    python -m model.audit REQUESTS... --shapes-from CONFIG --shapes-format F [--limit-shapes K] [--report DIR]
    python -m model.audit trace.csv --columns azure --shapes-from neuron.json --shapes-format nxdi --holdout 0.3
    python -m model.audit --cost-model serving --device-profile P.toml --shapes-from TODAY --shapes-format F
        [--graphs PLANNED --graphs-format F2] [--replicas N|auto --rate-scale X... --slo-ttft-ms T --slo-tpot-ms U]
        [--report DIR] [--out DIR] [--time-limit S] REQUESTS...

Plans the requests twice with the same planner: under the shapes the serving config
compiles (K = the config's size unless --limit-shapes) and under a free choice of as
many shapes; prints cost (and device-hours in device mode), pad ratio, P95, sequential
time and the number of compiled shapes side by side, and the saving.  With --holdout
the optimised shapes are chosen on the first part of the traffic and both sides are
judged on the held-out part.  With --window SECONDS both sides batch only within arrival
windows (the P95 then includes each member's wait).  --report DIR writes report.md, report.html and
heatmap.png together (all or none).  --time-limit bounds the whole audit (its planner runs share it).
Exit status: 0 both plans valid and within
their limits; 1 a plan breaks a rule or limit; 2 bad input (e.g. a config whose
largest shape is shorter than a prompt: the request is named); 3 infeasible.

``--cost-model serving`` audits what online serving does instead (``shared/serving_model.md``):
today's config, read by its stack's rules as the graphs the server compiles, and with
``--graphs`` a planned graph set, are replayed through continuous batching on the same
trace (arrival times as ``model.replay`` reads them), server settings (the profile's
``[server]`` table, flags over it), replicas and rate: warm-up, run-time compiles and the
graphs they create, busy device-hours, TTFT/TPOT p50/p95/p99 and goodput side by side,
after one headline sentence.  ``--replicas auto`` adds each side's capacity table (the
fewest replicas meeting the SLOs at each ``--rate-scale``; ``model.evaluation.capacity``)
and compares the sides at the larger count the search chose at the first rate.
``--report DIR`` writes report.md, report.html and each side's pictures; ``--out DIR``
audit.json (every number) and today-graphs.json (today's graphs in the replay's json);
all together or none.  --time-limit bounds the whole run.  Exit status: 0 done; 2 bad
input; 4 not done within --time-limit (nothing written); 130 / 143 interrupted.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from model.base.errors import InputError, NoPlanFound, unknown_name
from model.base.numbers import float_flag, int_flag
from model.cli_common import (
    CommandParser,
    add_input_args,
    add_limit_args,
    build_problem,
    check_time_limit,
    given_inputs,
    log_progress,
    run_main,
)
from model.cli_json import JsonOut, add_json_arg, cost_flag_given, input_words, json_output, json_targets
from model.load.outputs import Target, check_targets, files_in, write_together


def build_parser() -> argparse.ArgumentParser:
    from model import pipeline
    from model.deploy.flags import add_holdout_args, add_server_settings_arg, add_window_args
    from model.serving.formats import READERS

    parser = CommandParser("model.audit", __doc__)
    parser.add_argument("requests", nargs="*", type=Path, help="request files (JSONL, CSV, Parquet), one bucket "
                                                               "each, e.g. chat.jsonl trace.csv (or --scenario)")
    add_input_args(parser)
    add_limit_args(parser)
    parser.add_argument("--shapes-from", dest="config", type=Path, required=True,
                        help="the serving config whose shapes are today's, e.g. --shapes-from neuron.json")
    parser.add_argument("--shapes-format", dest="config_format", default=None,
                        help=f"format of the config: {', '.join(READERS)}, e.g. --shapes-format nxdi "
                             "(default list)")
    add_server_settings_arg(parser, "config_settings")
    add_holdout_args(parser)
    add_window_args(parser)
    parser.add_argument("--solver", default=pipeline.MIP,
                        help=f"planner: {', '.join(pipeline.solver_names())}, e.g. --solver dpfill")
    parser.add_argument("--backend", default="highs", help="MIP backend: highs, cpsat, pulp, e.g. --backend cpsat")
    parser.add_argument("--time-limit", type=float_flag("--time-limit"), default=60.0,
                        help="seconds for the whole audit, shared by its planner runs (today's shapes, the free "
                             "choice; with --holdout the check's runs too), e.g. --time-limit 120 (default 60)")
    parser.add_argument("--max-batch-size", type=int_flag("--max-batch-size"),
                        default=None, help="at most this many requests per batch, e.g. --max-batch-size 16")
    parser.add_argument("--report", type=Path, help="folder for report.md, report.html and heatmap.png, e.g. "
                                                    "--report audit/")
    parser.add_argument("--quiet", action="store_true", help="no progress log")
    add_json_arg(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    if serving_mode(sys.argv[1:] if argv is None else argv):
        return serving_main(argv)
    args = build_parser().parse_args(argv)
    with json_output(args.json) as sink:
        return run_audit(args, sink)


def run_audit(args: argparse.Namespace, sink: JsonOut) -> int:
    """Plan under today's shapes and under free ones, print both and the summary, write the report and JSON."""
    # heavy modules only now: run_main's signal handlers are in place (see model.cli_common)
    from model import pipeline
    from model.deploy.auditing import audit
    from model.deploy.flags import DEFAULT_SHAPES_FORMAT, import_config, parse_fraction, warning_text
    from model.deploy.present import AUDIT_REPORT_FILES, audit_blocks, audit_report_files, audit_tables
    from model.deploy.summaries import audit_summary
    from model.report.document import to_text
    from model.report.json_doc import document, document_bytes
    from model.report.summary import mode_note, summary_lines

    log_progress(args.quiet)
    check_time_limit(args.time_limit)
    if args.max_batch_size is not None and args.max_batch_size < 1:
        raise InputError("--max-batch-size", None, None, f"must be a positive integer, got {args.max_batch_size}")
    if args.solver not in pipeline.solver_names():
        raise InputError("--solver", None, None, unknown_name("solver", args.solver, pipeline.solver_names()))
    fraction = parse_fraction(args.holdout)
    targets = [Target("--report", args.report, "folder", "give a folder for report.md, report.html and heatmap.png"),
               *files_in("--report", args.report, AUDIT_REPORT_FILES)] if args.report else []
    targets += json_targets(args.json)
    check_targets(targets, given_inputs(args))  # before anything is read or planned
    imported = import_config(args.config, args.config_format, args.config_settings)
    config, warning = imported.shapes, warning_text(imported)
    if warning:
        print(f"warning: {warning}", file=sys.stderr)
    problem, scenario = build_problem(args, args.requests, pipeline.DEFAULT_SCENARIO)
    check_targets(targets)  # against every file the loaders read
    source = str(scenario.path) if scenario else ", ".join(map(str, args.requests))
    print(mode_note(problem.cost, scenario is not None, cost_flag_given(args)))
    result = audit(problem, config, args.limit_shapes, args.solver, args.backend, args.time_limit, fraction,
                   args.config_format or DEFAULT_SHAPES_FORMAT,
                   None if imported.graphs is None else len(imported.graphs))
    print(to_text(audit_blocks(result, source, str(args.config))))
    if not result.ok:
        print("FAIL: a plan breaks a rule or a limit")
    summary = audit_summary(result, input_words(args), str(args.config))
    print("\n".join(summary_lines(summary)))
    data = document_bytes(document("audit", summary, audit_tables(result)))
    # the report and the JSON document land together, or neither does
    files = audit_report_files(args.report, result, source, str(args.config)) if args.report else {}
    files |= sink.files(data)
    if files:
        write_together(files)
        print(f"wrote {', '.join(map(str, files))}")
    sink.emit(data)
    return 0 if result.ok else 1


SERVING = "serving"


def serving_mode(argv: list[str]) -> bool:
    """``--cost-model serving`` on the command line (its own flags then: see ``serving_parser``)."""
    peek = argparse.ArgumentParser(add_help=False)
    peek.add_argument("--cost-model")
    return peek.parse_known_args(argv)[0].cost_model == SERVING


def serving_parser() -> argparse.ArgumentParser:
    from model.deploy.serving_flags import add_capacity_args, add_server_args, add_trace_args

    p = CommandParser("model.audit", __doc__)
    p.prog = f"{p.prog} --cost-model serving"  # its own flags: the usage line says how this parser is reached
    p.description = "Replay today's serving config (and planned graphs) on the same trace"
    p.add_argument("requests", nargs="+", type=Path, help="request files with arrival times (JSONL, CSV, Parquet)")
    p.add_argument("--cost-model", choices=(SERVING,), required=True, help="serving: continuous batching replayed")
    p.add_argument("--device-profile", type=Path, required=True, help="profile TOML: [device] and [server] tables")
    p.add_argument("--shapes-from", dest="config", type=Path, required=True,
                   help="today's serving config (its graphs by the stack's rules)")
    p.add_argument("--shapes-format", dest="config_format", default="json",
                   help="format of --shapes-from: json, gaudi-file, gaudi-env, nxdi (default json)")
    p.add_argument("--graphs", dest="planned", type=Path, help="a planned graph set to replay beside today's")
    p.add_argument("--graphs-format", dest="planned_format", default="json",
                   help="format of --graphs (default json, the replay's graph lists)")
    add_trace_args(p)
    add_server_args(p)
    add_capacity_args(p)
    p.add_argument("--report", type=Path, help="folder for report.md, report.html and each side's pictures")
    p.add_argument("--out", type=Path, help="folder for audit.json and today-graphs.json")
    p.add_argument("--time-limit", type=float_flag("--time-limit"), help="seconds for the whole run (default: none)")
    p.add_argument("--quiet", action="store_true", help="no progress log")
    add_json_arg(p)
    return p


def serving_main(argv: list[str] | None) -> int:
    """The serving audit (module docstring)."""
    args = serving_parser().parse_args(argv)
    with json_output(args.json) as sink:
        return run_serving_audit(args, sink)


def run_serving_audit(args: argparse.Namespace, sink: JsonOut) -> int:
    """The serving audit the parsed flags describe, with its summary and --json document."""
    from model.base.runtime import Deadline, DeadlineExceeded, check_interrupt
    from model.cli_common import check_time_limit
    from model.deploy.serving_flags import SCAN_BELOW, graph_warnings, load_buckets, parse_capacity, server_from_args
    from model.deploy.serving_present import OUT_FILES, audit_blocks, output_files, report_names
    from model.deploy.summaries import serving_audit_summary
    from model.report.json_doc import DataTable, document, document_bytes
    from model.report.summary import summary_lines

    log_progress(args.quiet)
    plan = parse_capacity(args)
    deadline = Deadline.never() if args.time_limit is None else Deadline.after(check_time_limit(args.time_limit))
    targets = [*([Target("--report", args.report, "folder", "give a folder for the report"),
                  *files_in("--report", args.report, report_names(2 if args.planned else 1))] if args.report else []),
               *([Target("--out", args.out, "folder", "give a folder for audit.json"),
                  *files_in("--out", args.out, OUT_FILES)] if args.out else []), *json_targets(args.json)]
    inputs = [*args.requests, args.device_profile, args.config, *([args.planned] if args.planned else [])]
    check_targets(targets, inputs)  # before anything is read
    from model.cost.serving import ServingCost
    from model.deploy.serving_audit import serving_audit
    from model.evaluation.replay_run import check_fits, check_span, trace_of
    from model.report.document import to_text
    from model.serving.settings import parse_flag

    profile, settings = server_from_args(args, args.device_profile)
    extra, where = parse_flag(args.server_settings), f"[server] of {args.device_profile} (or its flag)"
    sides = [("today's config", args.config, args.config_format)]
    if args.planned:
        sides.append(("planned graphs", args.planned, args.planned_format))
    imported = [(label, f"{path}, {fmt}", read_side(path, fmt, flag, settings, where, extra))
                for (label, path, fmt), flag in zip(sides, ("--shapes-format", "--graphs-format"), strict=False)]
    trace = trace_of(load_buckets(args))
    check_span(float(trace.arrival_ms[-1]), plan.rate_scales)  # before any replay, at every rate scale
    check_targets(targets)  # against every file the loaders read
    for label, _, graphs in imported:
        check_fits(trace, settings, graphs.graphs, profile.kv_capacity_tokens)
        for line in graph_warnings(graphs, settings, 10):
            print(f"warning: {label}: {line}", file=sys.stderr)
    tick = check_interrupt if args.time_limit is None else lambda: deadline.tick("serving audit")  # no "inf s left"
    try:
        audit = serving_audit(trace, settings, [(label, src, g.graphs) for label, src, g in imported],
                              ServingCost(profile), plan.replicas, plan.rate_scales, plan.slo, plan.cap,
                              record=args.report is not None, tick=tick,
                              scan_below=SCAN_BELOW)
    except DeadlineExceeded:
        raise NoPlanFound(f"the serving audit did not finish within --time-limit {args.time_limit:g} s "
                          f"({len(trace)} requests); nothing written") from None
    source = ", ".join(map(str, args.requests))
    print(to_text(audit_blocks(audit, source)))
    words = [*map(str, args.requests), "--device-profile", str(args.device_profile)]
    if args.planned:
        words += ["--graphs", str(args.planned), "--shapes-format", args.planned_format]
    summary = serving_audit_summary(audit, words)
    print("\n".join(summary_lines(summary)))
    table = DataTable(("side", "source", "graphs", "busy_ms", "busy_device_hours", "ttft_p95_ms", "tpot_p95_ms",
                       "runtime_compiles", "warmup_ms"),
                      ("", "", "graphs", "device-ms", "device-hours", "ms", "ms", "graphs", "device-ms"),
                      tuple((d.label, d.source, d.summary.graphs, d.summary.busy_ms, d.summary.busy_device_hours,
                             d.summary.ttft.p95, d.summary.tpot.p95, len(d.summary.runtime_compiles),
                             d.summary.warmup_ms) for d in audit.sides))
    data = document_bytes(document("audit", summary, {"serving_sides": table}))
    files = output_files(audit, source, args.report, args.out)
    if deadline.expired():  # the report's pictures take seconds (2/3 of a 2,000-request audit): bounded too
        raise NoPlanFound(f"the serving audit and its report did not finish within --time-limit {args.time_limit:g} s "
                          f"({len(trace)} requests); nothing written")
    files |= sink.files(data)
    if files:
        write_together(files)
        print("wrote " + ", ".join(map(str, files)))
    sink.emit(data)
    return 0


def read_side(path: Path, fmt: str, flag: str, settings, where: str, extra):
    """One side's graphs (``model.serving.replay_graphs``), a bad format named by this side's own flag."""
    from model.serving.replay_graphs import read_graph_set

    try:
        return read_graph_set(path, fmt, settings, where, extra)
    except InputError as exc:
        if exc.file != "--shapes-format" or flag == exc.file:
            raise
        raise InputError(flag, exc.line, exc.field, exc.message.replace("--shapes-format", flag)) from None


def entry() -> None:
    """Console-script entry point."""
    run_main(main)


if __name__ == "__main__":
    entry()
