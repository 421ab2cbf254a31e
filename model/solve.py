"""``python -m model.solve``: plan shapes and batches for one or more request buckets.

    python -m model.solve --limit-shapes 8                  # embedded default scenario (data/)
    python -m model.solve --scenario S.toml --out DIR       # writes DIR/plan_<bucket>.jsonl
    python -m model.solve a.jsonl b.csv --columns azure --cost-model strict --out DIR
    python -m model.solve trace.csv --columns azure --device-profile P.toml --window 60 --report DIR
    python -m model.solve --engine dask reqs/ --out DIR     # a folder or glob of partitions, on a Dask cluster

With --window SECONDS requests are batched only with requests of the same arrival
window; in device mode the devices each window needs are printed for the chosen
planner, dpfill and pow2, and --report DIR draws them over time.

Plans are written only when every plan is valid and meets every limit, all at once
(temporary files renamed into place).  The whole run (not only the MIP) keeps within
--time-limit, apart from loading and writing.  Exit status: 0 written; 1 a plan breaks
a rule or limit (nothing written); 2 bad input; 3 the limits cannot all be met (proven);
4 no plan found, not proven infeasible (a time limit without a solution, a solver
failure; nothing written); 130 / 143 interrupted by SIGINT / SIGTERM (nothing written,
old plans untouched).
"""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import replace
from pathlib import Path

from model.base.errors import InfeasibleError, InputError
from model.base.numbers import counted, float_flag, int_flag
from model.cli_common import (
    CommandParser,
    add_engine_args,
    add_input_args,
    add_limit_args,
    build_problem,
    check_engine_flags,
    check_time_limit,
    cli_limits,
    dask_settings,
    given_inputs,
    log_progress,
    run_main,
)
from model.cli_json import JsonOut, add_json_arg, cost_flag_given, input_words, json_output, json_targets
from model.load.files import note_input
from model.load.outputs import Target, check_targets, files_in, write_together

log = logging.getLogger("shapeplan")


def run_account(rep) -> list[str]:
    """What found the plan, what gave the bound, why the run ended and whether more time could help (the
    report's own fields; nothing where the planner says nothing)."""
    pairs = (("plan found by", rep.plan_by), ("bound from", rep.bound_by), ("run ended by", rep.termination),
             ("more time", rep.more_time), ("on its own shapes", on_shapes_text(rep)))
    return [f"{label}: {text}" for label, text in pairs if text]


def on_shapes_text(rep) -> str:
    """The gap split in two: what better batching on the plan's own shapes could save at most, and the rest, which
    is the shape choice (another set may be cheaper) or what the bound does not see ("" where not priced)."""
    if rep.on_shapes is None or not rep.objective or rep.gap is None or rep.bound is None \
            or rep.on_shapes <= rep.bound:
        return ""  # not priced, or no tighter than the bound (which holds for plans on these shapes too)
    within = max(0.0, (rep.objective - rep.on_shapes) / rep.objective)
    rest = max(0.0, rep.gap - within)
    return (f"every plan compiling the same shapes costs at least {rep.on_shapes:,.1f} (rider-chain prices, "
            f"certified), so better batching on them could save at most {within:.2%}; the other {rest:.2%} of the "
            "gap is the choice of shapes: another set may be cheaper, or the bound does not see why not")


def build_parser() -> argparse.ArgumentParser:
    """The solve command's flags (heavy modules imported here run after run_main's signal handlers are set)."""
    from model import pipeline
    from model.deploy.flags import add_holdout_args, add_shape_args, add_window_args

    parser = CommandParser("model.solve", __doc__)
    parser.add_argument("requests", nargs="*", type=Path, help="request files (JSONL, CSV, Parquet), one bucket "
                                                               "each, e.g. chat.jsonl trace.csv (default: the "
                                                               "embedded scenario)")
    add_input_args(parser)
    add_limit_args(parser)
    parser.add_argument("--solver", default="mip",
                        help=f"planner: {', '.join(pipeline.solver_names())}, e.g. --solver dpfill")
    parser.add_argument("--backend", default="highs", help="MIP backend: highs, cpsat, pulp, e.g. --backend cpsat")
    parser.add_argument("--time-limit", type=float_flag("--time-limit"), default=60.0,
                        help="seconds for planning: the whole run apart from loading and writing, e.g. "
                             "--time-limit 300 (default 60)")
    parser.add_argument("--max-batch-size", type=int_flag("--max-batch-size"),
                        default=None, help="at most this many requests per batch, e.g. --max-batch-size 16")
    parser.add_argument("--out", type=Path, default=Path("out"),
                        help="folder for plan_<bucket>.jsonl, e.g. --out plans/ (default out/)")
    parser.add_argument("--compare", action="store_true", help="also run every heuristic packer and compare")
    parser.add_argument("--quiet", action="store_true", help="no progress log")
    parser.add_argument("--report", type=Path, help="with --window in device mode: folder for report.md, "
                                                    "report.html, devices.png and devices.csv, e.g. --report rep/")
    add_shape_args(parser)
    add_holdout_args(parser)
    add_window_args(parser)
    add_engine_args(parser)
    add_json_arg(parser)
    parser.add_argument("--plan-from", choices=("auto", "requests", "histogram"), default=None,
                        help="with --engine dask: plan from every request's lengths (the in-memory planner, its "
                             "plan exactly), or from the group-by histogram alone (the MIP on cells; no request "
                             "reaches this process, for 10^8 requests); auto (default) takes the histogram above "
                             "2*10^7 requests in the reference and strict modes), e.g. --plan-from histogram")
    return parser


def main(argv: list[str] | None = None) -> int:
    from model.solve_serving import main_serving, serving_requested

    if serving_requested(sys.argv[1:] if argv is None else argv):  # its own flags: model/solve_serving.py
        return main_serving(argv)
    # heavy modules only now: run_main's signal handlers are in place (see model.cli_common)
    args = build_parser().parse_args(argv)
    check_engine_flags(args, DASK_UNSUPPORTED)
    if args.plan_from is not None and args.engine != "dask":
        raise InputError("--plan-from", None, None, "needs --engine dask")
    with json_output(args.json) as sink:
        return main_dask(args, sink) if args.engine == "dask" else solve_in_memory(args, sink)


def solve_in_memory(args: argparse.Namespace, sink: JsonOut) -> int:
    """The in-memory engine: load, plan (or check a hold-out), judge, print, write the plans together."""
    from model import pipeline
    from model.deploy.flags import parse_fraction
    from model.deploy.holdout import holdout
    from model.deploy.present import holdout_blocks
    from model.deploy.summaries import holdout_summary, solve_summary
    from model.deploy.window_devices import device_blocks, device_comparison, devices_report
    from model.evaluation.validate import time_text
    from model.report.compare import compare_table
    from model.report.document import to_text
    from model.report.json_doc import bucket_rows, cost_unit, document, document_bytes
    from model.report.summary import mode_note, summary_lines
    from model.report.tables import bucket_table, device_units, fmt, graph_totals, verdict

    fraction = parse_fraction(args.holdout)
    targets = output_targets(args, fraction is None)
    check_targets(targets, given_inputs(args))  # before anything is loaded or planned
    log_progress(args.quiet)
    check_time_limit(args.time_limit)
    problem, scenario = build_problem(args, args.requests, pipeline.DEFAULT_SCENARIO, cli_limits(args))
    plans_at = [Target("--out", pipeline.plan_path(args.out, b.name)) for b in problem.buckets] \
        if fraction is None else []
    check_targets(targets + plans_at)  # against every file the loaders read (a scenario's requests, profile)
    source = str(scenario.path) if scenario else ", ".join(map(str, args.requests))
    devices = problem.windowing is not None and problem.cost.shared_batch_time
    if args.report is not None and not devices:
        raise InputError("--report", None, None, "draws devices needed per window: it needs --window and device mode "
                                                 "(--device-profile)")
    print(f"input: {source}; {counted(len(problem.buckets), 'bucket')}, "
          f"{counted(sum(len(b) for b in problem.buckets), 'request')}; K = {problem.max_shapes}; "
          f"cost model {problem.cost.name}"
          + (f"; allowed shapes {' '.join(map(str, problem.allowed_shapes))}" if problem.allowed_shapes else "")
          + (f"; arrival windows of {problem.windowing.seconds:g} s from the first arrival, "
             f"{time_text(problem.windowing.origin_s)}" if problem.windowing else ""))
    print(mode_note(problem.cost, scenario is not None, cost_flag_given(args)))
    words = input_words(args)
    if fraction is not None:
        check, train = holdout(problem, fraction, args.solver, args.backend, args.time_limit)
        print(to_text(holdout_blocks(check)))
        if check.fixed is None:  # proven: as model.audit says it (exit 3, not "a plan breaks a limit")
            raise InfeasibleError("hold-out: the shapes chosen on the first part cannot plan the held-out part: "
                                  + "; ".join(check.messages))
        summary = holdout_summary(check, words, str(args.out))
        print("\n".join(summary_lines(summary)))
        finish_json(sink, document("holdout", summary, holdout_tables(check)))
        print("hold-out check only: no plans written")
        return 0 if train.evaluation.ok and check.ok else 1
    run = pipeline.run(problem, args.solver, args.backend, args.time_limit)
    planning = problem  # what --compare plans again: with --batch-buckets auto each planner chooses its own
    problem = pipeline.planned_problem(problem, run.planned)  # the buckets the plans run in (auto: chosen)
    pipeline.check_finite_metrics(run.evaluation, source)
    results = run.evaluation.results
    rep = run.planned.report
    for i, result in enumerate(results):
        extra = {"solver": f"{args.solver} ({rep.backend} {rep.version}), status {rep.status.value}"}
        if rep.bucket_bounds is not None:
            lb = rep.bucket_bounds[i]
            cost = result.metrics.cost if result.metrics else None
            gap = None if cost is None else (cost - lb) / cost if cost else 0.0  # all-zero coefficients: cost 0
            unit = cost_unit(problem.cost)
            extra["lower bound"] = f"{fmt(lb)} {unit} (gap {gap:.3%})" if gap is not None else f"{fmt(lb)} {unit}"
        print(bucket_table(result, extra, problem.cost, problem.windowing))
    total = sum(r.metrics.cost for r in results if r.metrics)
    chosen = sorted({s for r in results if r.metrics for s in r.metrics.shapes})
    print(f"chosen shapes ({len(chosen)}): {', '.join(map(str, chosen))} (prompt lengths in tokens)")
    print(graph_totals(list(results), problem.cost))
    units = device_units(total, problem.cost)
    if units:
        print(f"total device time: {fmt(total)} ms = {units}")
    unit = f" (costs in {cost_unit(problem.cost)})"
    if rep.bound is not None and rep.objective is not None:
        print(f"total: cost {fmt(total)}, lower bound {fmt(rep.bound)}, gap {rep.gap:.3%}, time {run.wall_s:.1f} s"
              + unit)
    else:
        print(f"total: cost {fmt(total)}, time {run.wall_s:.1f} s{unit}")
    for line in run_account(rep):
        print(line)
    for note in rep.notes:
        print(f"note: {note}")
    if args.compare:
        others = {name: pipeline.compare_run(planning, name) for name in pipeline.solver_names()[1:]
                  if name != args.solver}
        print(compare_table(results, args.solver, others))
    report: dict[Path, bytes] = {}
    if devices:
        uses, missing = device_comparison(problem, args.solver, run.planned.batchings)
        print(to_text(device_blocks(uses)))
        for m in missing:
            print(f"note: no devices for {m}")
        if args.report is not None:
            report = devices_report(args.report, uses, f"Devices needed: {source}")
    print(verdict(list(results), list(run.evaluation.global_problems)))
    summary = solve_summary(problem, results, run.evaluation.ok, rep, args.solver, words, str(args.out),
                            str(scenario.path) if scenario else None, [str(r) for r in args.requests],
                            pipeline.compare_run(problem, STACK_RULE) if args.solver != STACK_RULE else None)
    print("\n".join(summary_lines(summary)))
    data = document_bytes(document("solve", summary, {"buckets": bucket_rows(results, problem.cost)}))
    if not run.evaluation.ok:
        finish_json(sink, data)
        print("nothing written" if not sink.files(data) else f"no plans written; wrote {args.json}")
        return 1
    # the plans, the report that describes them and the JSON document land together, or none does
    also = {path: [data] for path, data in report.items()} | sink.files(data)
    paths = pipeline.write(args.out, problem, run.plans, also=also)
    if report:
        print(f"wrote {', '.join(map(str, report))}")
    print(f"wrote {', '.join(map(str, (*paths, *sink.files(data))))}")
    sink.emit(data)
    return 0


STACK_RULE = "pow2"  # the reference every summary names: a rule stacks compile by default (model.deploy.summaries)


def finish_json(sink: JsonOut, data: bytes | dict) -> None:
    """The document of a run that writes nothing else: to its file (alone, all or nothing) or to stdout."""
    from model.report.json_doc import document_bytes

    data = data if isinstance(data, bytes) else document_bytes(data)
    files = sink.files(data)
    if files:
        write_together(files)
        print(f"wrote {sink.spec}")
    sink.emit(data)


def holdout_tables(check) -> dict:
    """The hold-out check's table as data: each plan's shapes and its cost in and out of sample."""
    from model.deploy.holdout import Holdout
    from model.report.json_doc import DataTable, cost_unit

    unit = cost_unit(check.split.test.cost)
    rows = [(f"{check.solver}: shapes chosen on the first part", list(check.shapes), check.in_sample,
             Holdout.cost(check.fixed), check.loss),
            (f"{check.solver}: held-out part's own shapes", [] if check.own is None else
             sorted({int(s) for r in check.own.evaluation.results if r.metrics for s in r.metrics.shapes}), None,
             Holdout.cost(check.own), 0.0 if check.own is not None else None),
            ("pow2 rule", [] if check.pow2 is None else
             sorted({int(s) for r in check.pow2.evaluation.results if r.metrics for s in r.metrics.shapes}),
             check.pow2_in_sample, Holdout.cost(check.pow2), check.pow2_excess)]
    return {"holdout": DataTable(("plan", "shapes", "cost_first_part", "cost_held_out", "vs_held_out_optimum"),
                                 ("", "tokens", unit, unit, "share"), tuple(rows))}


def output_targets(args: argparse.Namespace, plans: bool) -> list[Target]:
    """Every output path of an in-memory solve: the plans' folder (unless nothing is written, as with
    --holdout) and the report folder with the four files it will hold."""
    from model.deploy.window_devices import DEVICE_REPORT_FILES

    targets = [Target("--out", args.out, "folder", "give a folder for plan_<bucket>.jsonl")] if plans else []
    targets += json_targets(args.json)
    if args.report is not None:
        targets += [Target("--report", args.report, "folder", "give a folder for the report"),
                    *files_in("--report", args.report, DEVICE_REPORT_FILES)]
    return targets


# what the Dask engine does not do (yet): each is refused by name with --engine dask
DASK_UNSUPPORTED = ("--scenario", "--holdout", "--window", "--time-column", "--shapes", "--shapes-from", "--report",
                    "--compare")


def main_dask(args: argparse.Namespace, sink: JsonOut) -> int:
    """``--engine dask``: each input a folder or glob of partitions; plans written as partitioned datasets."""
    from model import pipeline
    from model.deploy.summaries import command_line, solve_summary
    from model.distributed import require_dask
    from model.distributed.cluster import connect
    from model.distributed.engine import load, solve, write
    from model.distributed.read import partitions
    from model.distributed.write import dataset_path
    from model.report.json_doc import bucket_rows, cost_unit, document, document_bytes
    from model.report.summary import summary_lines
    from model.report.tables import bucket_table, fmt, verdict

    log_progress(args.quiet)
    check_time_limit(args.time_limit)
    if not args.requests:
        raise InputError("--engine", None, None, "dask needs request folders or globs of partitions")
    folder = Target("--out", args.out, "folder", "give a folder for the plan datasets")
    check_targets([folder, *json_targets(args.json)], given_inputs(args))
    settings = replace(dask_settings(args), plan_from=args.plan_from or "auto")
    sources = [partitions(r, args.format) for r in args.requests]
    for source in sources:  # the workers read them; the client records them for the output guard
        for file in source.files:
            note_input(file)
    check_targets([folder, *json_targets(args.json),
                   *(Target("--out", dataset_path(args.out, s.name), "dataset") for s in sources)])
    require_dask()
    with connect(args.scheduler) as client:
        loaded = load(client, sources, settings)
        problem = loaded.problem
        hist_cells = sum(h.n_cells for h in loaded.hists)
        print(f"input: {', '.join(s.given for s in sources)}; {counted(len(problem.buckets), 'bucket')}, "
              f"{counted(sum(len(s.files) for s in sources), 'partition')}, "
              f"{counted(sum(loaded.n_requests), 'request')}, {counted(hist_cells, 'cell')}; K = {problem.max_shapes}; "
              f"cost model {problem.cost.name}; engine dask "
              f"({counted(len(client.scheduler_info().get('workers', {})), 'worker')}), planned from "
              f"{'the histogram' if loaded.cells is not None else 'requests'}")
        run = solve(loaded, args.solver, args.backend, args.time_limit)
        source = ", ".join(s.given for s in sources)
        pipeline.check_finite_metrics(run.evaluation, source)
        rep = run.report
        for i, result in enumerate(run.evaluation.results):
            extra = {"solver": f"{args.solver} ({rep.backend} {rep.version}), status {rep.status.value}"}
            if rep.bucket_bounds is not None:
                cost = result.metrics.cost if result.metrics else None
                lb = rep.bucket_bounds[i]
                gap = None if cost is None else (cost - lb) / cost if cost else 0.0
                unit = cost_unit(problem.cost)
                extra["lower bound"] = f"{fmt(lb)} {unit} (gap {gap:.3%})" if gap is not None else f"{fmt(lb)} {unit}"
            print(bucket_table(result, extra, problem.cost, None))
        results = run.evaluation.results
        total = sum(r.metrics.cost for r in results if r.metrics)
        chosen = sorted({s for r in results if r.metrics for s in r.metrics.shapes})
        print(f"chosen shapes ({len(chosen)}): {', '.join(map(str, chosen))} (prompt lengths in tokens)")
        bound = f", lower bound {fmt(rep.bound)}, gap {rep.gap:.3%}" if rep.bound is not None and rep.gap is not None \
            else ""
        print(f"total: cost {fmt(total)}{bound}, time {run.wall_s:.1f} s")
        for note in rep.notes:
            print(f"note: {note}")
        print(verdict(list(results), list(run.evaluation.global_problems)))
        summary = solve_summary(problem, results, run.evaluation.ok, rep, args.solver, input_words(args),
                                str(args.out), None, [str(r) for r in args.requests], None)
        if run.evaluation.ok:  # the datasets are judged again partition-wise (model.export reads plan files)
            summary = replace(summary, next_command=command_line(
                "evaluate", "--engine", "dask",
                *[w for s in sources for w in (s.given, str(dataset_path(args.out, s.name)))]))
        print("\n".join(summary_lines(summary)))
        data = document_bytes(document("solve", summary, {"buckets": bucket_rows(results, problem.cost)}))
        if not run.evaluation.ok:
            finish_json(sink, data)
            print("nothing written")
            return 1
        paths = write(client, args.out, loaded, run)
    print(f"wrote {', '.join(map(str, paths))} (partitioned Parquet datasets, each with manifest.json)")
    finish_json(sink, data)  # after the datasets (which are not written with write_together)
    return 0


def entry() -> None:
    """Console-script entry point."""
    run_main(main, hard_exit=True)


if __name__ == "__main__":
    entry()
