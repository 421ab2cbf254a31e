"""``python -m model.sweep``: how many shapes to compile -- cost for every shape cap K, every planner side by side.

    python -m model.sweep --scenario S.toml --report DIR
    python -m model.sweep --scenario S.toml --k 1-8 --sweep-limit max_sequential_ms --factors 0.8,0.9,1.0,1.1
    python -m model.sweep a.csv b.csv --columns azure --cost-model strict --k 1-16 --time-limit 300 --out sweep.csv
    python -m model.sweep trace.csv --columns azure --device-profile P.toml --k 8 --windows 10,30,60,300 --report DIR

Loads and aggregates the input once, solves it for each K (and each factor on one
limit, applied to every bucket), writes a tidy CSV (one row per point x bucket x
planner) and, with --report, report.md / report.html with pictures.  With --window
every point is planned in arrival windows; --windows sweeps the window length (one
row set per length, a table of what a longer window buys).  Infeasible points are
rows with status "infeasible" (proven) or "no_plan" (none found in time), never a
crash.  --time-limit bounds the whole sweep: its MIP solves share it.  Exit status: 0 done;
2 bad input; 130 / 143 interrupted.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from model.base.errors import InputError, unknown_name
from model.base.numbers import counted, float_flag, int_flag
from model.base.runtime import Deadline, RunBudget
from model.cli_common import (
    CommandParser,
    add_input_args,
    add_limit_args,
    build_problem,
    check_time_limit,
    given_inputs,
    run_main,
)
from model.cli_json import JsonOut, add_json_arg, cost_flag_given, input_words, json_output, json_targets
from model.load.outputs import Target, check_targets, files_in, write_together

if TYPE_CHECKING:  # imported where used, after run_main's signal handlers are in place (see model.cli_common)
    from model.deploy.holdout import Holdout, Split
    from model.sweeping.runner import SweepResult

log = logging.getLogger("shapeplan")
DEFAULT_FACTORS = "0.8,0.9,1.0,1.1"
DEFAULT_TIME_LIMIT_S = 300.0  # the whole sweep: 16 K values share it (each MIP had 20 s of its own before)


def parse_solvers(spec: str | None) -> tuple[str, ...]:
    """``--solvers``: a comma list of planner names (default: the MIP and every packer), in registry order."""
    from model import pipeline

    known = pipeline.solver_names()
    if spec is None:
        return tuple(known)
    wanted = [s.strip() for s in spec.split(",") if s.strip()]
    unknown = [s for s in wanted if s not in known]
    if unknown or not wanted:
        raise InputError("--solvers", None, None, unknown_name("planner", unknown[0], known) if unknown
                         else f"no planner named; choose from {', '.join(known)}")
    return tuple(s for s in known if s in wanted)


def build_parser() -> argparse.ArgumentParser:
    """The sweep's options: the solve CLI's input options plus the grid, the planners and the outputs."""
    from model import pipeline
    from model.deploy.flags import add_holdout_args, add_shape_args, add_window_args
    from model.load.scenario import LIMIT_KEYS

    parser = CommandParser("model.sweep", __doc__)
    parser.add_argument("requests", nargs="*", type=Path, help="request files (JSONL, CSV, Parquet), one bucket "
                                                               "each, e.g. chat.jsonl trace.csv (or --scenario)")
    add_input_args(parser)
    add_limit_args(parser)
    parser.add_argument("--k", help="shape caps to sweep, e.g. 1-16 or 2,4,8 (default 1-16, or --limit-shapes)")
    parser.add_argument("--sweep-limit", choices=LIMIT_KEYS, help="also sweep this limit, scaled by --factors, e.g. "
                                                                  "--sweep-limit max_p95_latency_ms")
    parser.add_argument("--factors", help=f"scale factors for --sweep-limit, e.g. --factors 0.5,1,2 (default "
                                                 f"{DEFAULT_FACTORS})")
    parser.add_argument("--solvers", help=f"comma list of planners, e.g. --solvers mip,pow2 (default all: "
                                                 f"{', '.join(pipeline.solver_names())})")
    parser.add_argument("--backend", default="highs", help="MIP backend: highs, cpsat, pulp, e.g. --backend cpsat")
    parser.add_argument("--time-limit", type=float_flag("--time-limit"), default=DEFAULT_TIME_LIMIT_S,
                        help="seconds for the whole sweep, shared by its MIP solves (each gets an equal share of "
                             "what is left; one that ends early leaves its time to the next), e.g. --time-limit 600 "
                             f"(default {DEFAULT_TIME_LIMIT_S:g})")
    parser.add_argument("--max-batch-size", type=int_flag("--max-batch-size"),
                        default=None, help="at most this many requests per batch, e.g. --max-batch-size 16")
    parser.add_argument("--tolerance", type=float_flag("--tolerance"), default=0.005,
                        help="recommend the smallest K within this share of the cheapest, e.g. --tolerance 0.02 "
                             "(default 0.005)")
    parser.add_argument("--out", type=Path,
                        help="CSV path, e.g. --out k.csv (default DIR/sweep.csv with --report, else sweep.csv)")
    parser.add_argument("--report", type=Path, help="folder for report.md, report.html and the PNGs, e.g. "
                                                    "--report sweep/")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    add_json_arg(parser)
    add_shape_args(parser)
    add_holdout_args(parser)
    add_window_args(parser, sweep=True)
    return parser


def sweep_budget(time_limit: float, points: int, solvers: tuple[str, ...], holdout_ks: int) -> RunBudget:
    """One deadline for the whole sweep (from now: loading is done), shared by every MIP run to come: one per
    point (each window length's points counted), and two per hold-out check (one per K)."""
    from model import pipeline

    mips = points + 2 * holdout_ks if pipeline.MIP in solvers else 0
    return RunBudget(Deadline.after(time_limit), mips)


def time_left(budget: RunBudget | None, limit: float) -> str:
    """The progress bar's note of the one time limit: ``, 212 s of 300 s left``."""
    return "" if budget is None else f", {budget.deadline.left():.0f} s of {limit:g} s left"


def csv_path(args: argparse.Namespace) -> Path:
    """Where the CSV goes: --out, else DIR/sweep.csv with --report, else sweep.csv."""
    return args.out or ((args.report / "sweep.csv") if args.report else Path("sweep.csv"))


def output_targets(args: argparse.Namespace) -> list[Target]:
    """Every path the sweep writes: the CSV, and the report folder with each file it will hold."""
    from model.sweeping.sweep_report import report_names
    from model.sweeping.window_view import WINDOW_REPORT_FILES

    targets = [Target("--out", csv_path(args), "file", "give the path of the CSV file to write")]
    if args.report is not None:
        names = WINDOW_REPORT_FILES if args.windows is not None else report_names(bool(args.sweep_limit))
        targets += [Target("--report", args.report, "folder", "give a folder for report.md, report.html and the PNGs"),
                    *files_in("--report", args.report, names)]
    return targets + json_targets(args.json)


def check_settings(args: argparse.Namespace) -> None:
    """Every flag that needs no input, checked before anything is loaded, solved or written."""
    from model.deploy.flags import parse_windows

    check_time_limit(args.time_limit)
    if not 0 <= args.tolerance < math.inf:
        raise InputError("--tolerance", None, None, f"must be a finite non-negative share, got {args.tolerance}")
    if args.factors is not None and not args.sweep_limit:
        raise InputError("--factors", None, None, "needs --sweep-limit (the limit the factors scale)")
    if args.window is not None and args.windows is not None:
        raise InputError("--windows", None, None, "give --window (one length) or --windows (a sweep), not both")
    if args.windows is not None and args.holdout is not None:
        raise InputError("--windows", None, None, "the hold-out check runs at one window length: use --window")
    parse_windows(args.windows)
    check_targets(output_targets(args), given_inputs(args))


def main(argv: list[str] | None = None) -> int:
    """Load once, sweep, write the CSV (and report), print the K table and the recommendation."""
    args = build_parser().parse_args(argv)
    with json_output(args.json) as sink:
        return run(args, sink)


def run(args: argparse.Namespace, sink: JsonOut) -> int:
    """The sweep the parsed flags describe (``main``'s body, given where the JSON document goes)."""
    import numpy as np
    from tqdm import tqdm

    from model import pipeline
    from model.deploy.flags import parse_fraction, parse_windows
    from model.deploy.holdout import split
    from model.deploy.present import sweep_holdout_blocks
    from model.deploy.summaries import sweep_summary
    from model.domain.windowing import windowed
    from model.histogram.cells import build_histogram
    from model.report.document import to_text
    from model.report.json_doc import cost_unit, document, document_bytes
    from model.report.summary import mode_note, summary_lines
    from model.sweeping.grid import (
        SweepSettings,
        base_factor,
        check_sweep_limit,
        parse_factors,
        parse_ks,
        sweep_points,
        useful_ks,
    )
    from model.sweeping.recommend import recommend
    from model.sweeping.runner import run_sweep
    from model.sweeping.sweep_report import k_table, recommendation_paragraphs, report_files
    from model.sweeping.table import csv_bytes, planner_totals

    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    check_settings(args)
    ks = parse_ks(args.k) if args.k is not None else (args.limit_shapes,) if args.limit_shapes else tuple(range(1, 17))
    factors = parse_factors(DEFAULT_FACTORS if args.factors is None else args.factors) if args.sweep_limit else (1.0,)
    solvers = parse_solvers(args.solvers)
    fraction = parse_fraction(args.holdout)
    problem, scenario = build_problem(args, args.requests, pipeline.DEFAULT_SCENARIO)
    part = split(problem, fraction) if fraction is not None else None
    if part is not None:
        print(f"hold-out: {part.describe()}; the sweep runs on the first part")
        problem = part.train
    if args.sweep_limit:
        check_sweep_limit(problem, args.sweep_limit)
    hists = tuple(build_histogram(b) for b in problem.buckets)
    ks, capped = useful_ks(ks, len(np.unique(np.concatenate([h.S for h in hists]))))
    if capped:
        print(capped, file=sys.stderr)
    source = str(scenario.path) if scenario else ", ".join(map(str, args.requests))
    settings = SweepSettings(source, problem.cost.name, ks, args.sweep_limit or "", factors, solvers, args.backend,
                             args.time_limit, args.tolerance)
    print(f"input: {source}; {counted(len(problem.buckets), 'bucket')}, "
          f"{counted(sum(len(b) for b in problem.buckets), 'request')}, {counted(sum(len(h) for h in hists), 'cell')}; "
          f"cost model {problem.cost.name}")
    print(mode_note(problem.cost, scenario is not None, cost_flag_given(args)))
    points = sweep_points(ks, settings.sweep_limit, factors)
    windows = parse_windows(args.windows)
    for w in windows or ():  # every length's window count, before the first is swept
        windowed(problem, w, "--windows")
    out = csv_path(args)
    check_targets(output_targets(args))  # against every file the loaders read (a scenario's requests too)
    budget = sweep_budget(args.time_limit, len(points) * len(windows or (None,)), solvers,
                          len(ks) if part is not None else 0)
    if windows is not None:
        return window_sweep(problem, windows, points, solvers, args, out, source, sink, budget)
    with tqdm(total=len(points) * len(solvers), disable=args.quiet, unit="solve", dynamic_ncols=True) as bar:
        def step(point, name) -> None:
            bar.set_postfix_str(f"{point.label()} {name}{time_left(budget, args.time_limit)}", refresh=False)
            bar.update()

        result = run_sweep(problem, points, solvers, args.backend, args.time_limit, step, budget)
    totals = planner_totals(result.rows)
    rec = recommend(result.rows, args.tolerance)
    text = to_text([k_table(totals, base_factor(t.point for t in totals), cost_unit(problem.cost)),
                    *recommendation_paragraphs(rec, cost_unit(problem.cost))])
    print(text)
    extra = sweep_holdout_blocks(holdout_checks(part, result, args, budget)) if part is not None else []
    summary = sweep_summary(rec, rec.stack_rule, problem, input_words(args), point_status(totals, rec))
    data = document_bytes(document("sweep", summary, {"points": sweep_rows_table(result.rows, problem.cost)}))
    # the CSV, the report and its pictures: every file made in memory first, then all put down together
    files = {out: csv_bytes(result.rows)}
    if args.report:
        files.update(report_files(args.report, problem, hists, result, settings, extra))
    write_together({path: [data] for path, data in files.items()} | sink.files(data))
    print(f"wrote {out}")
    if extra:
        print(to_text(extra))
    if args.report:
        print(f"wrote {args.report / 'report.md'}, {args.report / 'report.html'}")
    if sink.files(data):
        print(f"wrote {args.json}")
    print("\n".join(summary_lines(summary)))
    sink.emit(data)
    return 0


def point_status(totals, rec) -> str | None:
    """The status of the recommended planner's run at the recommended point (None: no recommendation)."""
    return next((t.status for t in totals if t.planner == rec.planner and t.point == rec.point), None)


def sweep_rows_table(rows, cost):
    """The sweep's tidy rows (the CSV's columns) as a JSON table with each column's unit."""
    from dataclasses import astuple, fields

    from model.report.json_doc import DataTable, cost_unit
    from model.sweeping.runner import SweepRow

    unit = cost_unit(cost)
    names = tuple(f.name for f in fields(SweepRow))
    units = tuple("ms" if n.endswith("_ms") else "s" if n.endswith("_s") else
                  "pad tokens / real tokens" if "pad_ratio" in n else "share" if "gap" in n or "ratio" in n else
                  "batches" if n == "n_batches" else "tokens" if n == "shapes" else
                  unit if "cost" in n or "bound" in n or n == "limit_value" else "" for n in names)
    return DataTable(names, units, tuple(astuple(r) for r in rows))


def window_sweep(problem, windows: tuple[float, ...], points, solvers: tuple[str, ...], args: argparse.Namespace,
                 out: Path, source: str, sink: JsonOut, budget: RunBudget | None = None) -> int:
    """The sweep once per window length: all rows in one CSV, each length's K table, and what a longer
    window buys (cost, P95 with the wait, devices needed)."""
    from tqdm import tqdm

    from model.deploy.summaries import sweep_summary
    from model.domain.windowing import windowed
    from model.report.document import to_text
    from model.report.json_doc import cost_unit, document, document_bytes
    from model.report.summary import summary_lines
    from model.sweeping.grid import base_factor
    from model.sweeping.recommend import recommend
    from model.sweeping.runner import run_sweep
    from model.sweeping.sweep_report import k_table
    from model.sweeping.table import csv_bytes, planner_totals
    from model.sweeping.window_view import window_blocks, window_report

    by_window = {}
    with tqdm(total=len(windows) * len(points) * len(solvers), disable=args.quiet, unit="solve",
              dynamic_ncols=True) as bar:
        for w in windows:
            def step(point, name, w=w) -> None:
                bar.set_postfix_str(f"window {w:g} s {point.label()} {name}{time_left(budget, args.time_limit)}",
                                    refresh=False)
                bar.update()

            by_window[w] = run_sweep(windowed(problem, w, "--windows"), points, solvers, args.backend, args.time_limit,
                                     step, budget).rows
    if args.report:
        files = window_report(args.report, by_window, args.tolerance, f"Batching window sweep: {source}", out,
                              device=problem.cost.device_time)
    else:
        files = {out: csv_bytes([r for rows in by_window.values() for r in rows])}
    # the window whose recommendation costs least is the summary's choice (each length's limits hold)
    recs = {w: recommend(rows, args.tolerance) for w, rows in by_window.items()}
    found = [w for w, r in recs.items() if r.cost is not None]
    best = min(found, key=lambda w: recs[w].cost) if found else windows[0]
    summary = sweep_summary(recs[best], recs[best].stack_rule, problem,
                            [*input_words(args), "--window", f"{best:g}"],
                            point_status(planner_totals(by_window[best]), recs[best]))
    summary = replace(summary, chosen=f"windows of {best:g} s, {summary.chosen}")
    data = document_bytes(document("sweep", summary, {"points": sweep_rows_table(
        [r for rows in by_window.values() for r in rows], problem.cost)}, {"windows_s": list(windows)}))
    write_together({path: [data] for path, data in files.items()} | sink.files(data))  # all of them, or none
    for w, rows in by_window.items():
        totals = planner_totals(rows)
        print(f"windows of {w:g} s")
        print(to_text([k_table(totals, base_factor(t.point for t in totals), cost_unit(problem.cost))]))
    print(to_text(window_blocks(by_window, args.tolerance)))
    print(f"wrote {out}")
    if args.report:
        print(f"wrote {', '.join(str(p) for p in files if p != out)}")
    if sink.files(data):
        print(f"wrote {args.json}")
    print("\n".join(summary_lines(summary)))
    sink.emit(data)
    return 0


def holdout_checks(part: Split, result: SweepResult, args: argparse.Namespace,
                   budget: RunBudget | None = None) -> list[Holdout]:
    """Each K's MIP shapes (chosen on the first part, at the base limits) checked on the held-out part."""
    from tqdm import tqdm

    from model import pipeline
    from model.deploy.holdout import sweep_checks
    from model.sweeping.grid import base_factor
    from model.sweeping.table import planner_totals

    totals = [t for t in planner_totals(result.rows) if t.planner == pipeline.MIP]
    if not totals:
        print("note: the hold-out check uses the MIP's shapes; add mip to --solvers")
        return []
    base = base_factor(t.point for t in totals)
    chosen = [(t.point.k, tuple(sorted({int(s) for bt in result.mip_batchings[t.point] for s in bt.shape_of})), t.cost)
              for t in totals if t.point.factor == base and t.point in result.mip_batchings]
    with tqdm(total=len(chosen), disable=args.quiet, unit="K", dynamic_ncols=True, desc="hold-out") as bar:
        return sweep_checks(part, chosen, args.backend, args.time_limit, lambda k: bar.update(), budget)


def entry() -> None:
    """Console-script entry point."""
    run_main(main, hard_exit=True)


if __name__ == "__main__":
    entry()
