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
from model.base.numbers import float_flag, int_flag
from model.cli_common import (
    add_engine_args,
    add_input_args,
    add_limit_args,
    build_problem,
    check_engine_flags,
    check_time_limit,
    cli_limits,
    dask_settings,
    given_inputs,
    run_main,
)
from model.load.files import note_input
from model.load.outputs import Target, check_targets, files_in

log = logging.getLogger("shapeplan")


def main(argv: list[str] | None = None) -> int:
    from model.solve_serving import main_serving, serving_requested

    if serving_requested(sys.argv[1:] if argv is None else argv):  # its own flags: model/solve_serving.py
        return main_serving(argv)
    # heavy modules only now: run_main's signal handlers are in place (see model.cli_common)
    from model import pipeline
    from model.deploy.flags import add_holdout_args, add_shape_args, add_window_args, parse_fraction
    from model.deploy.holdout import holdout
    from model.deploy.present import holdout_blocks
    from model.deploy.window_devices import device_blocks, device_comparison, devices_report
    from model.evaluation.validate import time_text
    from model.report.compare import compare_table
    from model.report.document import to_text
    from model.report.tables import bucket_table, device_units, fmt, graph_totals, verdict

    parser = argparse.ArgumentParser(prog="python -m model.solve", description=__doc__.split("\n")[0])
    parser.add_argument("requests", nargs="*", type=Path, help="request files, one bucket each")
    add_input_args(parser)
    add_limit_args(parser)
    parser.add_argument("--solver", default="mip", help=f"planner: {', '.join(pipeline.solver_names())}")
    parser.add_argument("--backend", default="highs", help="MIP backend: highs, cpsat, pulp")
    parser.add_argument("--time-limit", type=float_flag("--time-limit"), default=60.0,
                        help="seconds for planning: the whole run apart from loading and writing (default 60)")
    parser.add_argument("--max-batch-size", type=int_flag("--max-batch-size"),
                        default=None, help="at most this many requests per batch")
    parser.add_argument("--out", type=Path, default=Path("out"), help="folder for plan_<bucket>.jsonl (default out/)")
    parser.add_argument("--compare", action="store_true", help="also run every heuristic packer and compare")
    parser.add_argument("--quiet", action="store_true", help="no progress log")
    parser.add_argument("--report", type=Path, help="with --window in device mode: folder for report.md, "
                                                    "report.html, devices.png and devices.csv")
    add_shape_args(parser)
    add_holdout_args(parser)
    add_window_args(parser)
    add_engine_args(parser)
    parser.add_argument("--plan-from", choices=("auto", "requests", "histogram"), default=None,
                        help="with --engine dask: plan from every request's lengths (the in-memory planner, its "
                             "plan exactly), or from the group-by histogram alone (the MIP on cells; no request "
                             "reaches this process, for 10^8 requests); auto (default) takes the histogram above "
                             "2*10^7 requests in the reference and strict modes")
    args = parser.parse_args(argv)
    check_engine_flags(args, DASK_UNSUPPORTED)
    if args.plan_from is not None and args.engine != "dask":
        raise InputError("--plan-from", None, None, "needs --engine dask")
    if args.engine == "dask":
        return main_dask(args)
    fraction = parse_fraction(args.holdout)
    targets = output_targets(args, fraction is None)
    check_targets(targets, given_inputs(args))  # before anything is loaded or planned
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO,
                        format="[%(relativeCreated)6.0f ms] %(message)s")
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
    print(f"input: {source}; {len(problem.buckets)} buckets, "
          f"{sum(len(b) for b in problem.buckets)} requests; K = {problem.max_shapes}; cost model {problem.cost.name}"
          + (f"; allowed shapes {' '.join(map(str, problem.allowed_shapes))}" if problem.allowed_shapes else "")
          + (f"; arrival windows of {problem.windowing.seconds:g} s from the first arrival, "
             f"{time_text(problem.windowing.origin_s)}" if problem.windowing else ""))
    if fraction is not None:
        check, train = holdout(problem, fraction, args.solver, args.backend, args.time_limit)
        print(to_text(holdout_blocks(check)))
        if check.fixed is None:  # proven: as model.audit says it (exit 3, not "a plan breaks a limit")
            raise InfeasibleError("hold-out: the shapes chosen on the first part cannot plan the held-out part: "
                                  + "; ".join(check.messages))
        print("hold-out check only: no plans written")
        return 0 if train.evaluation.ok and check.ok else 1
    run = pipeline.run(problem, args.solver, args.backend, args.time_limit)
    pipeline.check_finite_metrics(run.evaluation, source)
    results = run.evaluation.results
    rep = run.planned.report
    for i, result in enumerate(results):
        extra = {"solver": f"{args.solver} ({rep.backend} {rep.version}), status {rep.status.value}"}
        if rep.bucket_bounds is not None:
            lb = rep.bucket_bounds[i]
            cost = result.metrics.cost if result.metrics else None
            gap = None if cost is None else (cost - lb) / cost if cost else 0.0  # all-zero coefficients: cost 0
            extra["lower bound"] = f"{fmt(lb)} (gap {gap:.3%})" if gap is not None else fmt(lb)
        print(bucket_table(result, extra, problem.cost, problem.windowing))
    total = sum(r.metrics.cost for r in results if r.metrics)
    chosen = sorted({s for r in results if r.metrics for s in r.metrics.shapes})
    print(f"chosen shapes ({len(chosen)}): {', '.join(map(str, chosen))}")
    print(graph_totals(list(results), problem.cost))
    units = device_units(total, problem.cost)
    if units:
        print(f"total device time: {fmt(total)} ms = {units}")
    if rep.bound is not None and rep.objective is not None:
        print(f"total: cost {fmt(total)}, lower bound {fmt(rep.bound)}, gap {rep.gap:.3%}, time {run.wall_s:.1f} s")
    else:
        print(f"total: cost {fmt(total)}, time {run.wall_s:.1f} s")
    for note in rep.notes:
        print(f"note: {note}")
    if args.compare:
        others = {name: pipeline.compare_run(problem, name) for name in pipeline.solver_names()[1:]
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
    if not run.evaluation.ok:
        print("nothing written")
        return 1
    # the plans and the report that describes them land together, or neither does
    paths = pipeline.write(args.out, problem, run.plans, also={path: [data] for path, data in report.items()})
    if report:
        print(f"wrote {', '.join(map(str, report))}")
    print(f"wrote {', '.join(map(str, paths))}")
    return 0


def output_targets(args: argparse.Namespace, plans: bool) -> list[Target]:
    """Every output path of an in-memory solve: the plans' folder (unless nothing is written, as with
    --holdout) and the report folder with the four files it will hold."""
    from model.deploy.window_devices import DEVICE_REPORT_FILES

    targets = [Target("--out", args.out, "folder", "give a folder for plan_<bucket>.jsonl")] if plans else []
    if args.report is not None:
        targets += [Target("--report", args.report, "folder", "give a folder for the report"),
                    *files_in("--report", args.report, DEVICE_REPORT_FILES)]
    return targets


# what the Dask engine does not do (yet): each is refused by name with --engine dask
DASK_UNSUPPORTED = ("--scenario", "--holdout", "--window", "--time-column", "--shapes", "--shapes-from", "--report",
                    "--compare")


def main_dask(args: argparse.Namespace) -> int:
    """``--engine dask``: each input a folder or glob of partitions; plans written as partitioned datasets."""
    from model import pipeline
    from model.distributed import require_dask
    from model.distributed.cluster import connect
    from model.distributed.engine import load, solve, write
    from model.distributed.read import partitions
    from model.distributed.write import dataset_path
    from model.report.tables import bucket_table, fmt, verdict

    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO,
                        format="[%(relativeCreated)6.0f ms] %(message)s")
    check_time_limit(args.time_limit)
    if not args.requests:
        raise InputError("--engine", None, None, "dask needs request folders or globs of partitions")
    folder = Target("--out", args.out, "folder", "give a folder for the plan datasets")
    check_targets([folder], given_inputs(args))
    settings = replace(dask_settings(args), plan_from=args.plan_from or "auto")
    sources = [partitions(r, args.format) for r in args.requests]
    for source in sources:  # the workers read them; the client records them for the output guard
        for file in source.files:
            note_input(file)
    check_targets([folder, *(Target("--out", dataset_path(args.out, s.name), "dataset") for s in sources)])
    require_dask()
    with connect(args.scheduler) as client:
        loaded = load(client, sources, settings)
        problem = loaded.problem
        hist_cells = sum(h.n_cells for h in loaded.hists)
        print(f"input: {', '.join(s.given for s in sources)}; {len(problem.buckets)} buckets, "
              f"{sum(len(s.files) for s in sources)} partitions, {sum(loaded.n_requests)} requests, "
              f"{hist_cells} cells; K = {problem.max_shapes}; cost model {problem.cost.name}; engine dask "
              f"({len(client.scheduler_info().get('workers', {}))} workers), planned from "
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
                extra["lower bound"] = f"{fmt(lb)} (gap {gap:.3%})" if gap is not None else fmt(lb)
            print(bucket_table(result, extra, problem.cost, None))
        results = run.evaluation.results
        total = sum(r.metrics.cost for r in results if r.metrics)
        chosen = sorted({s for r in results if r.metrics for s in r.metrics.shapes})
        print(f"chosen shapes ({len(chosen)}): {', '.join(map(str, chosen))}")
        bound = f", lower bound {fmt(rep.bound)}, gap {rep.gap:.3%}" if rep.bound is not None and rep.gap is not None \
            else ""
        print(f"total: cost {fmt(total)}{bound}, time {run.wall_s:.1f} s")
        for note in rep.notes:
            print(f"note: {note}")
        print(verdict(list(results), list(run.evaluation.global_problems)))
        if not run.evaluation.ok:
            print("nothing written")
            return 1
        paths = write(client, args.out, loaded, run)
    print(f"wrote {', '.join(map(str, paths))} (partitioned Parquet datasets, each with manifest.json)")
    return 0


def entry() -> None:
    """Console-script entry point."""
    run_main(main, hard_exit=True)


if __name__ == "__main__":
    entry()
