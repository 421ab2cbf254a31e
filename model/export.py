"""``python -m model.export``: write the graphs a set of plans runs in a serving stack's format, or check a config.

    python -m model.export --plans DIR --format F --out FILE [--block-size 128] [--max-model-len N]
    python -m model.export --plans DIR --format nxdi --out neuron.json --scenario S.toml
    python -m model.export --plans DIR --format gaudi-file --out buckets.txt --requests chat.jsonl short.jsonl
    python -m model.export --check buckets.txt --format gaudi-file [--plans DIR --scenario S.toml]

Reads every ``plan_*.jsonl`` in DIR.  F is one of gaudi-file, gaudi-env, nxdi, vllm-neuron,
vllm-tpu, json (or list); ``model.serving.formats`` says what each writes.  The file holds
exactly the graphs the plans run -- a batch of n requests at shape s runs the graph
(n, s), or (B, s) with B the smallest batch bucket >= n when the plans were made with
batch buckets (``--batch-buckets LIST``, else the device profile's), and its decode graph
covers s + the longest generation -- and the server
settings the stack needs for them; a format that cannot express them is refused with
the reason and the format that can.  The header and the printed line give the number
of graphs the stack will compile and the warm-up (graphs x compile_ms of
``--device-profile`` or the scenario's device profile).

Plans alone determine the shapes and the batch sizes used at each shape.  Plans do not
carry generation lengths, so the decode/context buckets (context = shape + longest
generation of the batches; Gaudi decode buckets in KV blocks of --block-size) need
the requests: ``--scenario S.toml`` (bucket <name> is plan_<name>.jsonl) or
``--requests FILE ...`` (chat.jsonl goes with plan_chat.jsonl).  Without them the
formats with decode graphs (gaudi-file, gaudi-env, nxdi) are refused.
``--max-model-len`` caps every shape and context.

``--check FILE`` writes nothing: it lists the graphs the stack compiles from FILE by its
rules (settings from the file or ``--server-settings NAME=N,...``) and, with ``--plans``,
compares them with the plans' graphs.

FILE is written atomically (a temporary file in its folder, then renamed): on any error
an existing FILE is left as it was.  Exit status: 0 written (or: the check found the
config exactly the plans); 1 the check found a difference (missing or extra graphs,
graphs a setting drops); 2 bad input, one line naming file, line and field, nothing
written.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from model.base.errors import InputError, unknown_name
from model.base.numbers import int_flag
from model.cli_common import CommandParser, run_main
from model.cli_json import JsonOut, add_json_arg, json_output, json_targets
from model.load.outputs import Target, check_targets, file_flag, write_together

if TYPE_CHECKING:  # imported where used, after run_main's signal handlers are in place (see model.cli_common)
    from model.domain.schema import Bucket

PLAN_PREFIX = "plan_"


def plan_files(folder: Path) -> list[Path]:
    """Every plan_*.jsonl in folder, sorted (the export must not depend on listing order)."""
    try:
        is_folder = folder.is_dir()
    except (OSError, ValueError) as exc:  # a NUL byte, a name longer than the file system allows
        raise InputError(str(folder), None, None, f"cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    if not is_folder:
        raise InputError(str(folder), None, None, "not a folder (--plans names the folder of plan_*.jsonl)")

    files = sorted(p for p in folder.glob(f"{PLAN_PREFIX}*.jsonl") if p.is_file())
    if not files:
        raise InputError(str(folder), None, None, f"no {PLAN_PREFIX}*.jsonl files")
    return files


def bucket_name(plan_file: Path) -> str:
    """The bucket a plan file belongs to: plan_<name>.jsonl -> name."""
    return plan_file.stem[len(PLAN_PREFIX):]


def request_buckets(scenario: Path | None, requests: list[Path]) -> dict[str, Bucket] | None:
    """The requests behind the plans, by bucket name; None when neither option is given."""
    from model.load.requests import load_requests
    from model.load.scenario import load_scenario
    from model.pipeline import check_unique_names

    if scenario is not None and requests:
        raise InputError("<command line>", None, None, "give --scenario or --requests, not both")
    if scenario is not None:
        loaded = load_scenario(scenario)
        return dict(zip(loaded.names, loaded.buckets, strict=True))
    if requests:
        buckets = tuple(load_requests(f) for f in requests)
        check_unique_names(buckets)
        return {b.name: b for b in buckets}
    return None


def write_atomic(target: Path, text: str) -> None:
    """Write the export through the project's all-or-nothing writer (its target checked by ``main`` first)."""
    write_together({target: [text.encode("utf-8")]})


def positive_option(name: str, value: int | None) -> int | None:
    """A positive integer option up to 2**20 (or None when not given)."""
    from model.load.requests import MAX_LEN

    if value is not None and not 1 <= value <= MAX_LEN:
        raise InputError(name, None, None, f"must be a positive integer up to {MAX_LEN}, got {value}")
    return value


def plan_buckets(files: list[Path], scenario: Path | None, requests: list[Path]) -> list[Bucket | None]:
    """The requests of each plan file (None each when neither --scenario nor --requests is given)."""
    by_name = request_buckets(scenario, requests)
    buckets: list[Bucket | None] = [None] * len(files)
    if by_name is not None:
        for i, f in enumerate(files):
            if bucket_name(f) not in by_name:
                raise InputError(str(f), None, None, f"no requests for bucket {bucket_name(f)!r} "
                                 f"(known: {', '.join(sorted(by_name))})")
            buckets[i] = by_name[bucket_name(f)]
    return buckets


def regular_file(flag: str, path: Path) -> Path:
    """A file the command reads: a folder, a FIFO or a device is refused before anything opens it."""
    try:
        folder, other = path.is_dir(), path.exists() and not path.is_file()
    except (OSError, ValueError) as exc:  # a NUL byte, a name longer than the file system allows
        raise InputError(str(path), None, None, f"cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    if folder:
        raise InputError(str(path), None, None, f"is a folder; {flag} names a file")
    if other:

        raise InputError(str(path), None, None, f"not a regular file (a FIFO, device or socket); {flag} names a file")
    return path


def device_settings(device_profile: Path | None, scenario: Path | None, buckets_flag: str | None
                    ) -> tuple[float | None, tuple[int, ...] | None]:
    """(compile_ms, batch buckets) of the plans' stack: --device-profile's, else the scenario's device profile;
    ``--batch-buckets`` replaces the profile's buckets.  ``auto`` names no list: the export needs the one the
    planner chose (model.solve prints it)."""
    from model.cost.device import AUTO_BUCKETS
    from model.deploy.flags import parse_batch_buckets
    from model.load.profile import load_profile
    from model.load.scenario import load_scenario

    profile = None
    if device_profile is not None:
        profile = load_profile(regular_file("--device-profile", device_profile))
    elif scenario is not None:
        cost = load_scenario(scenario, load=False).cost
        profile = cost.params if cost.device_time else None
    given = parse_batch_buckets(buckets_flag)
    auto = given == AUTO_BUCKETS or (given is None and profile is not None and profile.auto_buckets)
    if auto:
        raise InputError("--batch-buckets", None, None, "auto chooses the buckets while planning; the export needs "
                         "the list the plans were made with: give the one model.solve printed (\"batch buckets "
                         "chosen by the planner\")")
    buckets = given if given is not None else profile.batch_buckets if profile is not None else None
    return (profile.compile_ms if profile is not None else None), buckets


def run_check(args: argparse.Namespace, block_size: int | None, max_model_len: int | None,
              compile_ms: float | None, sink: JsonOut, batch_buckets: tuple[int, ...] | None = None) -> int:
    """--check FILE: the graphs FILE makes its stack compile, and (with --plans) how they differ from the plans'."""
    from model.deploy.graph_check import GraphCheck, check_lines
    from model.load.plans import read_plan
    from model.report.json_doc import DataTable, document, document_bytes
    from model.report.summary import summary_lines
    from model.serving.formats import compile_config, planned
    from model.serving.plan_use import shape_uses
    from model.serving.settings import Setting, Settings, parse_flag
    from model.serving.spec import DEFAULT_BLOCK_SIZE, ExportSpec

    if args.out is not None:
        raise InputError("--out", None, None, "--check writes nothing; leave --out out")
    given = {n: v for n, v in (("block_size", block_size), ("max_model_len", max_model_len)) if v is not None}
    flags = Settings({n: Setting(v, "--" + n.replace("_", "-"), None, n) for n, v in given.items()})
    settings = parse_flag(args.server_settings).merged(flags)
    compiled = compile_config(regular_file("--check", args.check), args.format, settings)
    if compiled.graphs is None:
        raise InputError(str(args.check), None, None, "cannot count the graphs: " + "; ".join(compiled.notes))
    graphs = None
    decode_known = True
    if args.plans is not None:
        files = plan_files(args.plans)
        buckets = plan_buckets(files, args.scenario, args.requests)
        known = dict(compiled.settings)
        spec = ExportSpec(shape_uses([read_plan(f) for f in files], buckets, batch_buckets),
                          known.get("block_size", DEFAULT_BLOCK_SIZE), known.get("max_model_len"), compile_ms)
        graphs, decode_known = planned(args.format, spec), spec.has_contexts
    elif args.scenario is not None or args.requests:
        raise InputError("--plans", None, None, "--scenario and --requests go with --plans (the plans to compare)")
    result = GraphCheck(str(args.check), args.format, compiled, graphs, decode_known, compile_ms)
    print("\n".join(check_lines(result)))
    for note in compiled.notes:
        print(f"warning: {note}", file=sys.stderr)
    summary = check_summary(result, args, compile_ms)
    print("\n".join(summary_lines(summary)))
    data = document_bytes(document("export", summary, {"graphs": DataTable(
        ("kind", "dims"), ("", "the stack's dimensions (batch, tokens or blocks)"),
        tuple((g.kind, list(g.dims)) for g in compiled.graphs))}))
    if sink.files(data):
        write_together(sink.files(data))
        print(f"wrote {args.json}")
    sink.emit(data)
    return 0 if result.ok else 1


def check_summary(result, args: argparse.Namespace, compile_ms: float | None):
    """export --check: the graphs the config compiles, their warm-up, whether they are the plans' graphs."""
    from model.deploy.summaries import command_line
    from model.report.summary import Certainty, Summary, device_cost

    n = len(result.compiled.graphs)
    same = "no plans to compare (give --plans)" if result.planned is None else \
        "exactly the plans' graphs" if result.ok else "NOT the plans' graphs (see the differences above)"
    nxt = ("the config is ready: start the server with it" if result.ok and result.planned is not None else
           command_line("export", "--plans", args.plans or "DIR", "--format", args.format, "--out", "NEW_FILE")
           + " (writes a config with exactly the plans' graphs)")
    return Summary("export", f"{args.check} ({args.format}) makes the stack compile {n} graphs; {same}", result.ok,
                   None if compile_ms is None else device_cost(n * compile_ms, None), None,
                   Certainty("evaluation", detail="the graphs listed by the stack's own rules from the file"),
                   None, None, None, nxt)
def build_parser() -> argparse.ArgumentParser:
    """The export command's flags (heavy modules imported here run after run_main's signal handlers are set)."""
    from model.serving.formats import WRITERS
    from model.serving.spec import DEFAULT_BLOCK_SIZE

    parser = CommandParser("model.export", __doc__)
    parser.add_argument("--plans", type=Path, help="folder of plan_*.jsonl, e.g. --plans out/")
    parser.add_argument("--format", required=True, help=f"output format: {', '.join(WRITERS)}, e.g. --format nxdi")
    parser.add_argument("--out", type=file_flag("--out"), help="file to write (atomically), e.g. --out neuron.json")
    parser.add_argument("--check", type=Path, metavar="FILE", help="list the graphs FILE makes its stack compile "
                        "(and, with --plans, compare them with the plans'); writes nothing, e.g. "
                        "--check buckets.txt")
    parser.add_argument("--block-size", type=int_flag("--block-size"), default=None,
                        help=f"KV block size for Gaudi decode buckets, e.g. --block-size 256 "
                             f"(default {DEFAULT_BLOCK_SIZE})")
    parser.add_argument("--max-model-len", type=int_flag("--max-model-len"), default=None,
                        help="the server's max model length, e.g. --max-model-len 16384")
    parser.add_argument("--scenario", type=Path, help="scenario.toml of the plans (gives generation lengths), "
                                                           "e.g. --scenario data/default/scenario.toml")
    parser.add_argument("--requests", type=Path, nargs="+", default=[],
                        help="request files of the plans, <name>.jsonl for plan_<name>.jsonl, e.g. --requests "
                             "chat.jsonl short.jsonl")
    parser.add_argument("--device-profile", type=Path, help="device profile TOML: warm-up = graphs x its compile_ms, "
                                                                 "e.g. --device-profile P.toml")
    parser.add_argument("--batch-buckets", help="the batch buckets the plans were made with (a batch of n runs in "
                        "graph (B, shape), B the smallest bucket >= n), e.g. --batch-buckets 1,4,16; default: the "
                        "device profile's, else each batch's own size")
    parser.add_argument("--server-settings", help="with --check: settings the config does not state, e.g. "
                        "max_num_batched_tokens=8192,max_num_seqs=64")
    add_json_arg(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    # heavy modules only now: run_main's signal handlers are in place (see model.cli_common)
    args = build_parser().parse_args(argv)
    with json_output(args.json) as sink:
        return run_export(args, sink)


def run_export(args: argparse.Namespace, sink: JsonOut) -> int:
    """Check a config (--check) or write the plans' graphs in the stack's format, with the summary."""
    from model.deploy.summaries import export_summary
    from model.load.plans import read_plan
    from model.report.json_doc import DataTable, document, document_bytes
    from model.report.summary import summary_lines
    from model.serving.formats import WRITERS, planned, render
    from model.serving.graphs import FREE_BATCH_NOTE, count_text
    from model.serving.plan_use import shape_uses
    from model.serving.spec import DEFAULT_BLOCK_SIZE, ExportSpec

    if args.format not in WRITERS:
        raise InputError("--format", None, None, unknown_name("format", args.format, WRITERS))
    block_size = positive_option("--block-size", args.block_size)
    max_model_len = positive_option("--max-model-len", args.max_model_len)
    compile_ms, batch_buckets = device_settings(args.device_profile, args.scenario, args.batch_buckets)
    if args.check is not None:
        check_targets(json_targets(args.json), [args.check, *args.requests, *filter(None, [args.scenario])])
        return run_check(args, block_size, max_model_len, compile_ms, sink, batch_buckets)
    for flag, value in (("--plans", args.plans), ("--out", args.out)):
        if value is None:
            raise InputError(flag, None, None, "required (or --check FILE to check a config)")
    if args.server_settings is not None:
        raise InputError("--server-settings", None, None, "only with --check: an export writes the settings its "
                         "graphs need")
    target = [Target("--out", args.out, "file", "give the path of the file to write"), *json_targets(args.json)]
    check_targets(target, [*args.requests, *([args.scenario] if args.scenario else [])])  # before any reading
    files = plan_files(args.plans)
    plans = [read_plan(f) for f in files]
    buckets = plan_buckets(files, args.scenario, args.requests)
    check_targets(target)  # not one of the plans or requests just read
    spec = ExportSpec(shape_uses(plans, buckets, batch_buckets), block_size or DEFAULT_BLOCK_SIZE, max_model_len,
                      compile_ms)
    text = render(args.format, spec)
    stack = args.format not in ("list", "json")  # shapeplan's own formats name no stack
    graph_list = planned(args.format if stack else "json", spec)
    summary = export_summary(str(args.out), args.format, spec.shapes, len(graph_list), compile_ms, stack)
    table = DataTable(("shape", "batch_sizes", "context"), ("tokens", "requests", "tokens"),
                      tuple((u.shape, list(u.batch_sizes), u.context) for u in spec.uses))
    data = document_bytes(document("export", summary, {"shapes": table}))
    write_together({args.out: [text.encode("utf-8")]} | sink.files(data))  # the export and its JSON together
    graphs = count_text(graph_list, compile_ms)
    print(f"wrote {args.out} ({args.format}) from {len(files)} plans: shapes {list(spec.shapes)}, "
          f"batch sizes {list(spec.batch_sizes)}; " + ("the stack compiles " if stack else "the plans run ") + graphs)
    if sink.files(data):
        print(f"wrote {args.json}")
    if compile_ms is None:
        print(f"note: {FREE_BATCH_NOTE}")
    if not spec.has_contexts:
        print("note: no --scenario or --requests, so no decode/context buckets (plans carry no generation lengths)")
    print("\n".join(summary_lines(summary)))
    sink.emit(data)
    return 0


def entry() -> None:
    """Console-script entry point."""
    run_main(main)


if __name__ == "__main__":
    entry()
