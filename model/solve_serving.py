"""``python -m model.solve --cost-model serving``: choose the graphs a continuous-batching server should compile.

    python -m model.solve --cost-model serving REQUESTS... --device-profile P.toml [--stack gaudi|nxdi]
        (--limit-graphs N | --max-warmup-s S) [--slo-ttft-ms T --slo-tpot-ms U --slo-quantile Q]
        [--replicas R] [--rate-scale X] [--out DIR] [--json FILE|-] [--backend highs] [--time-limit S]

The trace (arrival times as ``model.replay`` reads them) is replayed on the profile's
``[server]`` settings (flags replace its keys); ``model.serveplan.plan`` alternates
replay and MIP until the graph set is stable and keeps, over the prefill caps tried,
the set with the least busy device time that compiles nothing at run time and meets
the SLOs in the replay.  The replay of that set is what is printed.  ``--out DIR``
writes ``graphs.json`` (the replay's json), ``plan.json`` (this output) and every stack
config the set can be written as (``model.serveplan.configs``), all together or none.
Exit status: 0 planned (and written); 1 no set met every limit (nothing written); 2
bad input; 4 the time limit passed before any set was accepted; 130 / 143 interrupted.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from model.base.errors import InputError, NoPlanFound
from model.base.numbers import float_flag, int_flag
from model.cli_common import check_time_limit
from model.load.outputs import Target, check_targets, files_in, write_together

MODE = "serving"
MAX_GRAPHS = 4096
OUT_FILES = ("graphs.json", "plan.json", "gaudi-buckets.txt", "gaudi.env", "nxdi.json")
DEFAULT_TIME_LIMIT = 120.0
PREFILL_NOTE = " (gaudi: the most prompts a step may batch; the planner tries caps up to it)"


def serving_requested(argv: list[str]) -> bool:
    """Whether the command line asks for serving mode (``--cost-model serving`` or ``--cost-model=serving``)."""
    for i, word in enumerate(argv):
        if word == "--cost-model" and i + 1 < len(argv) and argv[i + 1] == MODE:
            return True
        if word == f"--cost-model={MODE}":
            return True
    return False


def parser() -> argparse.ArgumentParser:
    from model.cli_common import CommandParser
    from model.deploy.serving_flags import SERVER_EXAMPLES, SERVER_KEYS, add_slo_args, add_trace_args

    p = CommandParser("model.solve", __doc__)
    p.prog = f"{p.prog} --cost-model serving"  # its own flags: the usage line says how this parser is reached
    p.description = __doc__.split("\n")[0]
    p.add_argument("requests", nargs="+", type=Path,
                   help="request files with arrival times (JSONL, CSV, Parquet), e.g. trace.csv")
    p.add_argument("--cost-model", choices=(MODE,), required=True,
                   help="serving: plan graphs for continuous batching, judged by the replay, e.g. "
                        "--cost-model serving")
    p.add_argument("--device-profile", type=Path, required=True,
                   help="profile TOML: [device] and [server] tables, e.g. "
                        "--device-profile data/examples/serving/profile.toml")
    add_trace_args(p)
    for key in SERVER_KEYS:
        flag = "--" + key.replace("_", "-")
        p.add_argument(flag, type=str if key == "stack" else int_flag(flag), default=None,
                       help=f"replaces [server] {key}" + (PREFILL_NOTE if key == "max_prefill_seqs" else "")
                       + f", e.g. {SERVER_EXAMPLES[key]}")
    p.add_argument("--limit-graphs", type=int_flag("--limit-graphs"),
                   help="at most N graphs compiled before serving, e.g. --limit-graphs 24")
    p.add_argument("--max-warmup-s", type=float_flag("--max-warmup-s"),
                   help="warm-up (compile_ms x graphs) at most S s, e.g. --max-warmup-s 600")
    p.add_argument("--replicas", type=int_flag("--replicas"), default=1,
                   help="replicas, dealt round-robin, e.g. --replicas 4 (default 1)")
    p.add_argument("--rate-scale", type=float_flag("--rate-scale"), default=1.0,
                   help="divide arrival times by this, e.g. --rate-scale 2 (twice the rate; default 1)")
    add_slo_args(p)
    p.add_argument("--backend", default="highs", help="MIP backend: highs, cpsat, pulp, e.g. --backend cpsat")
    p.add_argument("--out", type=Path,
                   help="folder for graphs.json, plan.json and the stack configs, e.g. --out serving-plan/")
    p.add_argument("--json", help="write the plan as JSON to this file ('-': stdout), e.g. --json plan.json")
    p.add_argument("--time-limit", type=float_flag("--time-limit"), default=DEFAULT_TIME_LIMIT,
                   help=f"seconds for the whole run apart from loading and writing, e.g. --time-limit 300 "
                        f"(default {DEFAULT_TIME_LIMIT:g})")
    return p


def graph_table(g):
    """The chosen graphs as the JSON document's table: one row per graph, its kind and its dimensions."""
    from model.report.json_doc import DataTable

    rows = ([("prompt", [b, s]) for b, s in g.prompt] + [("decode", [b, x]) for b, x in g.decode]
            if g.stack == "gaudi" else
            [("context", [c]) for c in g.context] + [("token_generation", [n]) for n in g.token_generation])
    return DataTable(("kind", "dims"), ("", "the stack's dimensions (batch, tokens or blocks)"), tuple(rows))


def graph_cap(limit_graphs: int | None, max_warmup_s: float | None, compile_ms: float) -> int:
    """N: --limit-graphs, or the graphs --max-warmup-s pays for at compile_ms each (the smaller when both)."""
    from model.deploy.flags import parse_graph_caps

    parse_graph_caps(limit_graphs, max_warmup_s, MAX_GRAPHS)
    if limit_graphs is None and max_warmup_s is None:
        raise InputError("--limit-graphs", None, None, "serving mode needs --limit-graphs N or --max-warmup-s S "
                         "(the graphs compiled before serving)")
    caps = [limit_graphs] if limit_graphs is not None else []
    if max_warmup_s is not None:
        caps.append(MAX_GRAPHS if compile_ms <= 0 else min(MAX_GRAPHS, math.floor(max_warmup_s * 1000 / compile_ms)))
    n = min(caps)
    if n < 2:
        flag = "--limit-graphs" if limit_graphs == n else "--max-warmup-s"
        raise InputError(flag, None, None, f"allows {n} graph{'s' if n != 1 else ''}; a server needs at least one "
                         f"prompt and one decode graph (compile_ms {compile_ms:g})")
    return n


def replay_command(args: argparse.Namespace, chosen, table) -> str:
    """The ``model.replay`` line that replays the written config (the flags where the set's settings differ from
    the profile's [server] table: the bucket file states them, and a disagreement is an error)."""
    config, fmt = ("gaudi-buckets.txt", "gaudi-file") if chosen.stack == "gaudi" else ("nxdi.json", "nxdi")
    words = ["python -m model.replay", *map(str, args.requests), "--device-profile", str(args.device_profile),
             "--graphs", str(args.out / config), "--shapes-format", fmt]
    if args.columns:
        words += ["--columns", args.columns]
    if args.time_column:
        words += ["--time-column", args.time_column]
    if args.stack:
        words += ["--stack", args.stack]
    for key in ("max_num_seqs", "max_num_batched_tokens", "block_size", "ctx_batch_size"):
        if getattr(args, key) is not None:
            words += ["--" + key.replace("_", "-"), str(getattr(args, key))]
    if chosen.stack == "gaudi":
        words += ["--max-prefill-seqs", str(chosen.max_prefill_seqs)]
    if args.replicas != 1:
        words += ["--replicas", str(args.replicas)]
    if args.rate_scale != 1.0:
        words += ["--rate-scale", f"{args.rate_scale:g}"]
    return " ".join(words)


def main_serving(argv: list[str] | None = None) -> int:
    # heavy modules only now: run_main's signal handlers are in place (see model.cli_common)
    from model.base.runtime import Deadline
    from model.cost.serving import ServingCost
    from model.deploy.serving_flags import (
        MAX_RATE_SCALE,
        MAX_REPLICAS,
        SERVER_KEYS,
        load_buckets,
        parse_slo,
        positive_number,
    )
    from model.deploy.summaries import command_line, serving_plan_summary
    from model.evaluation.replay_run import check_fits, trace_of
    from model.load.profile import load_profile_file
    from model.load.server import server_settings
    from model.report.json_doc import document, document_bytes
    from model.report.serving_plan import plan_doc, plan_lines
    from model.report.summary import summary_lines
    from model.serveplan.candidates import dense_set
    from model.serveplan.configs import write_all
    from model.serveplan.plan import PlanSpec, plan, recorded_gap_text
    from solvers.backends import get_backend

    args = parser().parse_args(argv)
    if not 1 <= args.replicas <= MAX_REPLICAS:
        raise InputError("--replicas", None, None, f"must be an integer from 1 to {MAX_REPLICAS}, got {args.replicas}")
    positive_number("--rate-scale", args.rate_scale, MAX_RATE_SCALE)
    check_time_limit(args.time_limit)
    get_backend(args.backend)
    slo = parse_slo(args)
    targets = []
    if args.out is not None:
        targets += [Target("--out", args.out, "folder", "give a folder for the graph set and its configs"),
                    *files_in("--out", args.out, OUT_FILES)]
    if args.json not in (None, "-"):
        targets.append(Target("--json", Path(args.json), "file", "give the path of the JSON file to write"))
    check_targets(targets, [*args.requests, args.device_profile])
    profile, table = load_profile_file(args.device_profile)
    settings = server_settings(table, {key: getattr(args, key) for key in SERVER_KEYS}, str(args.device_profile))
    max_graphs = graph_cap(args.limit_graphs, args.max_warmup_s, profile.compile_ms)
    trace = trace_of(load_buckets(args), args.rate_scale)
    check_targets(targets)
    if not len(trace):
        raise InputError(str(args.requests[0]), None, None, "no requests")
    longest = int((trace.prompt + trace.gen).max())
    pool = settings.total_blocks(profile.kv_capacity_tokens or 0)
    check_fits(trace, settings, dense_set(settings.stack, settings, 1, int(trace.prompt.max()), longest, pool),
               profile.kv_capacity_tokens)
    out = sys.stderr if args.json == "-" else sys.stdout
    cost = ServingCost(profile)
    deadline = Deadline.after(args.time_limit)
    print(f"serving plan: {len(trace)} requests from {', '.join(map(str, args.requests))}; stack {settings.stack}; "
          f"at most {max_graphs} graphs; {args.replicas} replica{'s' if args.replicas > 1 else ''}", file=out)
    result = plan(trace, PlanSpec(settings, max_graphs, slo, args.replicas, args.backend), cost, deadline)
    print("\n".join(plan_lines(result)), file=out)
    if result.best is None:
        if result.timed_out:
            raise NoPlanFound(f"no graph set was accepted within --time-limit {args.time_limit:g} s; nothing written")
        print("no graph set met every limit; nothing written", file=out)
        return 1
    trace_words = [*(["--columns", args.columns] if args.columns else []),
                   *(["--time-column", args.time_column] if args.time_column else []),
                   *[w for key in SERVER_KEYS if getattr(args, key, None) is not None
                     for w in ("--" + key.replace("_", "-"), str(getattr(args, key)))]]
    nxt = (command_line("audit", "--cost-model", "serving", *map(str, args.requests), *trace_words,
                        "--device-profile", str(args.device_profile), "--shapes-from", "TODAY_CONFIG",
                        "--shapes-format", "F", "--graphs", str(args.out / "graphs.json"))
           + " (TODAY_CONFIG, F: the config your server runs today and its format)" if args.out is not None else
           "add --out DIR to write the graph set and its stack configs")
    summary = serving_plan_summary(result.best, len(trace), recorded_gap_text(result.best.mip), nxt)
    # the plan's own keys after the documented common ones (docs/json.md); plan.json in --out is the same document
    text = document_bytes(document("solve", summary, {"graphs": graph_table(result.best.graphs)},
                                   plan_doc(result))).decode("utf-8")
    files: dict[Path, list[bytes]] = {}
    if args.out is not None:
        best = result.best
        what = (f"{best.graphs.count} graphs planned by shapeplan for {len(trace)} requests "
                f"({', '.join(p.name for p in args.requests)}).")
        written = write_all(best.graphs, best.settings, longest, what)
        for w in written:
            if w.text is not None:
                files[args.out / w.name] = [w.text.encode()]
            else:
                print(f"note: no {w.fmt} config: {w.refused}", file=out)
        files[args.out / "plan.json"] = [text.encode()]
    if args.json not in (None, "-"):
        files[Path(args.json)] = [text.encode()]
    if files:
        write_together(files)
        print("wrote " + ", ".join(map(str, files)), file=out)
    if args.out is not None:
        print("replay the export: " + replay_command(args, result.best.settings, table), file=out)
    print("\n".join(summary_lines(summary)), file=out)
    if args.json == "-":
        sys.stdout.write(text)
    return 0
