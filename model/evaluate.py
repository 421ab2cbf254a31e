"""``python -m model.evaluate``: validate plans and judge them by the reference cost model.

    python -m model.evaluate REQUESTS PLAN [REQUESTS PLAN ...] [--limit-shapes K] [limit flags]
    python -m model.evaluate --scenario S.toml --plans DIR     # DIR/plan_<bucket>.jsonl
    python -m model.evaluate trace.csv plan.jsonl --columns azure --window 60   # batches must not mix windows
    python -m model.evaluate --engine dask reqs/ DIR/plan_reqs     # partitions and a plan dataset, on Dask

Exit status: 0 every plan valid and within every limit; 1 a rule or limit fails;
2 bad input (named by file, line and field).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from model.base.errors import InputError, NoPlanFound
from model.base.numbers import float_flag
from model.base.runtime import Deadline, DeadlineExceeded
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
    run_main,
)
from model.cli_json import JsonOut, add_json_arg, cost_flag_given, input_words, json_output, json_targets
from model.load.outputs import check_targets, write_together


def build_parser() -> argparse.ArgumentParser:
    """The evaluate command's flags (heavy modules imported here run after run_main's signal handlers are set)."""
    from model.deploy.flags import add_shape_args, add_window_args

    parser = CommandParser("model.evaluate", __doc__)
    parser.add_argument("pairs", nargs="*", type=Path, help="REQUESTS PLAN pairs, e.g. chat.jsonl out/plan_chat.jsonl")
    parser.add_argument("--plans", type=Path, help="with --scenario: folder of plan_<bucket>.jsonl, e.g. --plans out/")
    add_input_args(parser)
    add_limit_args(parser)
    add_shape_args(parser)
    add_window_args(parser, time_column=True)
    add_engine_args(parser)
    add_json_arg(parser)
    parser.add_argument("--time-limit", type=float_flag("--time-limit"), default=None,
                        help="seconds for the whole run (loading, judging every plan, writing), e.g. --time-limit "
                             "600 (default: no limit); past it: exit 4, nothing written")
    return parser


def main(argv: list[str] | None = None) -> int:
    # heavy modules only now: run_main's signal handlers are in place (see model.cli_common)
    args = build_parser().parse_args(argv)
    check_engine_flags(args, DASK_UNSUPPORTED)
    check_targets(json_targets(args.json), given_inputs(args) + [Path(p) for p in [args.plans] if p])
    deadline = Deadline.never() if args.time_limit is None else Deadline.after(check_time_limit(args.time_limit))
    with json_output(args.json) as sink:
        if args.engine == "dask":
            return main_dask(args, sink)
        try:
            return evaluate_in_memory(args, sink, lambda: deadline.tick("evaluate"))
        except DeadlineExceeded:
            raise NoPlanFound(f"the evaluation did not finish within --time-limit {args.time_limit:g} s; nothing "
                              "written") from None


def evaluate_in_memory(args: argparse.Namespace, sink: JsonOut, tick: Callable[[], None] = lambda: None) -> int:
    """The in-memory engine: load the requests and plans, judge every plan, print the tables and the summary;
    ``tick`` between the phases and the buckets (the run's --time-limit: it raises once the limit has passed)."""
    import numpy as np

    from model import pipeline
    from model.deploy.summaries import STACK_RULE, evaluate_summary
    from model.domain.schema import Evaluation
    from model.evaluation.validate import evaluate_plans, time_text
    from model.load.plans import read_plan
    from model.report.json_doc import bucket_rows, document, document_bytes
    from model.report.summary import mode_note, summary_lines
    from model.report.tables import bucket_table, graph_totals, verdict

    if args.scenario is not None:
        if args.pairs:
            raise InputError("<command line>", None, None, "give either --scenario or REQUESTS PLAN pairs, not both")
        if args.plans is None:
            raise InputError("<command line>", None, None, "--scenario needs --plans DIR")
        problem, _ = build_problem(args, [])
        plan_files = [pipeline.plan_path(args.plans, b.name) for b in problem.buckets]
    else:
        if not args.pairs or len(args.pairs) % 2:
            raise InputError("<command line>", None, None, "expected REQUESTS PLAN pairs (an even number of paths)")
        problem, _ = build_problem(args, args.pairs[0::2], limits=cli_limits(args))
        plan_files = args.pairs[1::2]
    if problem.choose_buckets:
        raise InputError("--batch-buckets", None, None, "auto chooses the buckets while planning; plans are judged "
                         "under a list: give the one model.solve printed (\"batch buckets chosen by the planner\")")
    tick()
    plans = []
    for f in plan_files:
        plans.append(read_plan(f))
        tick()
    plans = tuple(plans)
    check_targets(json_targets(args.json))  # against every file read (a scenario's requests, the plans)
    with np.errstate(over="ignore", invalid="ignore"):  # an overflow is reported below, by bucket and plan file
        results, global_problems = evaluate_plans(problem, plans, tick)
    for result, f in zip(results, plan_files, strict=True):
        pipeline.check_finite_metrics(Evaluation((result,), ()), str(f))
    print(f"cost model: {problem.cost.name}; shape cap K = {problem.max_shapes} per bucket and across all buckets")
    print(mode_note(problem.cost, args.scenario is not None, cost_flag_given(args)))
    if args.scenario is None and args.cost_model is None and args.device_profile is None:
        print(f"note: {REFERENCE_DEFAULT}")
    if problem.windowing is not None:
        w = problem.windowing
        print(f"arrival windows of {w.seconds:g} s from the first arrival, {time_text(w.origin_s)}: a batch must not "
              "mix requests of two windows")
    for result, f in zip(results, plan_files, strict=True):
        print(bucket_table(result, {"plan": str(f)}, problem.cost, problem.windowing))
    print(graph_totals(results, problem.cost))
    print(verdict(results, global_problems))
    ok = all(r.ok for r in results) and not global_problems
    summary = evaluate_summary(problem, results, ok, [str(f) for f in plan_files],
                               input_words(args, "none") if args.scenario else
                               [*map(str, args.pairs[0::2]), *input_words(args, "none")],
                               pipeline.compare_run(problem, STACK_RULE))
    print("\n".join(summary_lines(summary)))
    tick()  # the last look before anything is written
    finish(sink, document_bytes(document("evaluate", summary, {"buckets": bucket_rows(results, problem.cost)})))
    return 0 if ok else 1


def finish(sink: JsonOut, data: bytes) -> None:
    """The JSON document to its file (whole or not at all) or to stdout."""
    files = sink.files(data)
    if files:
        write_together(files)
        print(f"wrote {sink.spec}")
    sink.emit(data)


# plan files hold records only, not the cost model they were made under: say which one judges them
REFERENCE_DEFAULT = ("judged by the reference cost model (no --cost-model or --device-profile given); a plan made for "
                     "a device (model.solve --device-profile P.toml) is judged as it was planned only with the same "
                     "--device-profile P.toml")
DASK_UNSUPPORTED = ("--scenario", "--plans", "--window", "--time-column", "--shapes", "--shapes-from",
                    "--time-limit")


def main_dask(args: argparse.Namespace, sink: JsonOut) -> int:
    """``--engine dask``: REQUESTS (a folder or glob of partitions) PLAN (a plan dataset folder) pairs, judged
    partition-wise on the cluster with exact global metrics."""
    import numpy as np

    from model import pipeline
    from model.distributed import require_dask
    from model.distributed.cluster import connect
    from model.distributed.judge import judge_bucket
    from model.distributed.read import check_unique_ids, partitions, request_frame
    from model.domain.schema import Evaluation
    from model.evaluation.validate import joint_shape_cap
    from model.report.json_doc import bucket_rows, document, document_bytes
    from model.report.summary import Certainty, Summary, cost_of, summary_lines
    from model.report.tables import bucket_table, verdict

    if not args.pairs or len(args.pairs) % 2:
        raise InputError("<command line>", None, None, "expected REQUESTS PLAN pairs (an even number of paths)")
    settings = dask_settings(args)
    pairs = [(partitions(r, args.format), partitions(p, "parquet", what="plan"))
             for r, p in zip(args.pairs[0::2], args.pairs[1::2], strict=True)]
    require_dask()
    results = []
    with connect(args.scheduler) as client:
        for req_src, plan_src in pairs:
            reqs = request_frame(client, req_src, settings.columns, persist=False)  # read again by each pass
            check_unique_ids(client, reqs, req_src)
            with np.errstate(over="ignore", invalid="ignore"):
                result = judge_bucket(client, req_src.name, req_src, reqs, plan_src, settings.limits,
                                      settings.max_shapes, settings.max_seq_len, settings.cost)
            pipeline.check_finite_metrics(Evaluation((result,), ()), plan_src.given)
            results.append(result)
    global_problems = joint_shape_cap({s for r in results if r.metrics for s in r.metrics.shapes},
                                      settings.max_shapes)
    print(f"cost model: {settings.cost.name}; shape cap K = {settings.max_shapes} per bucket and across all buckets; "
          "engine dask (partition-wise, exact metrics)")
    if args.cost_model is None and args.device_profile is None:
        print(f"note: {REFERENCE_DEFAULT}")
    for result, (_, plan_src) in zip(results, pairs, strict=True):
        print(bucket_table(result, {"plan": plan_src.given}, settings.cost, None))
    print(verdict(results, global_problems))
    ok = all(r.ok for r in results) and not global_problems
    shapes = sorted({int(s) for r in results if r.metrics for s in r.metrics.shapes})
    summary = Summary("evaluate", f"the plans in {', '.join(p.given for _, p in pairs)}: {len(shapes)} shapes "
                      f"({', '.join(map(str, shapes))}) of K = {settings.max_shapes} allowed", ok,
                      None if any(r.metrics is None for r in results) else
                      cost_of(sum(r.metrics.cost for r in results), settings.cost), None,
                      Certainty("evaluation", detail="the given plans judged exactly, partition-wise; an "
                                "evaluation proves no bound"), tuple(shapes), settings.max_shapes)
    print("\n".join(summary_lines(summary)))
    finish(sink, document_bytes(document("evaluate", summary, {"buckets": bucket_rows(results, settings.cost)})))
    return 0 if ok else 1


def entry() -> None:
    """Console-script entry point."""
    run_main(main)


if __name__ == "__main__":
    entry()
