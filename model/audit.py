"""``python -m model.audit``: what today's compiled shapes cost against optimised ones, on the same traffic.

    python -m model.audit REQUESTS... --shapes-from CONFIG --shapes-format F [--limit-shapes K] [--report DIR]
    python -m model.audit trace.csv --columns azure --shapes-from neuron.json --shapes-format nxdi --holdout 0.3

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
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from model.base.errors import InputError, unknown_name
from model.base.numbers import float_flag, int_flag
from model.cli_common import (
    CommandParser,
    add_input_args,
    add_limit_args,
    build_problem,
    check_time_limit,
    given_inputs,
    run_main,
)
from model.load.outputs import Target, check_targets, files_in


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
    return parser


def main(argv: list[str] | None = None) -> int:
    # heavy modules only now: run_main's signal handlers are in place (see model.cli_common)
    from model import pipeline
    from model.deploy.auditing import audit
    from model.deploy.flags import DEFAULT_SHAPES_FORMAT, import_config, parse_fraction, warning_text
    from model.deploy.present import AUDIT_REPORT_FILES, audit_blocks, write_audit_report
    from model.report.document import to_text

    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO,
                        format="[%(relativeCreated)6.0f ms] %(message)s")
    check_time_limit(args.time_limit)
    if args.max_batch_size is not None and args.max_batch_size < 1:
        raise InputError("--max-batch-size", None, None, f"must be a positive integer, got {args.max_batch_size}")
    if args.solver not in pipeline.solver_names():
        raise InputError("--solver", None, None, unknown_name("solver", args.solver, pipeline.solver_names()))
    fraction = parse_fraction(args.holdout)
    targets = [Target("--report", args.report, "folder", "give a folder for report.md, report.html and heatmap.png"),
               *files_in("--report", args.report, AUDIT_REPORT_FILES)] if args.report else []
    check_targets(targets, given_inputs(args))  # before anything is read or planned
    imported = import_config(args.config, args.config_format, args.config_settings)
    config, warning = imported.shapes, warning_text(imported)
    if warning:
        print(f"warning: {warning}", file=sys.stderr)
    problem, scenario = build_problem(args, args.requests, pipeline.DEFAULT_SCENARIO)
    check_targets(targets)  # against every file the loaders read
    source = str(scenario.path) if scenario else ", ".join(map(str, args.requests))
    result = audit(problem, config, args.limit_shapes, args.solver, args.backend, args.time_limit, fraction,
                   args.config_format or DEFAULT_SHAPES_FORMAT,
                   None if imported.graphs is None else len(imported.graphs))
    print(to_text(audit_blocks(result, source, str(args.config))))
    if args.report:
        md, page = write_audit_report(args.report, result, source, str(args.config))
        print(f"wrote {md}, {page}, {args.report / 'heatmap.png'}")
    if not result.ok:
        print("FAIL: a plan breaks a rule or a limit")
        return 1
    return 0


def entry() -> None:
    """Console-script entry point."""
    run_main(main)


if __name__ == "__main__":
    entry()
