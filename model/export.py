"""``python -m model.export``: write the shapes a set of plans uses in a serving stack's format.

    python -m model.export --plans DIR --format F --out FILE [--block-size 128] [--max-model-len N]
    python -m model.export --plans DIR --format nxdi --out neuron.json --scenario S.toml
    python -m model.export --plans DIR --format gaudi-file --out buckets.txt --requests chat.jsonl short.jsonl

Reads every ``plan_*.jsonl`` in DIR.  F is one of gaudi-file, gaudi-env, nxdi, vllm-neuron,
vllm-tpu, json (or list); ``model.serving.formats`` says what each writes and what reading
the file back gives.

Plans alone determine the shapes and the batch sizes used at each shape.  Plans do not
carry generation lengths, so the decode/context buckets (context = shape + longest
generation of the shape's batches; Gaudi decode buckets in KV blocks of --block-size)
need the requests: ``--scenario S.toml`` (bucket <name> is plan_<name>.jsonl) or
``--requests FILE ...`` (chat.jsonl goes with plan_chat.jsonl).  Without them those
buckets are left out and the file says so.  ``--max-model-len`` caps every shape and
context (and is the TPU ladder's and NxDI's seq_len maximum when given).

FILE is written atomically (a temporary file in its folder, then renamed): on any error
an existing FILE is left as it was.  Exit status: 0 written; 2 bad input, one line
naming file, line and field, nothing written.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from model.base.errors import InputError
from model.base.numbers import int_flag
from model.cli_common import run_main
from model.load.outputs import Target, check_targets, write_together

if TYPE_CHECKING:  # imported where used, after run_main's signal handlers are in place (see model.cli_common)
    import numpy as np

    from model.domain.schema import Bucket, Plan
    from model.serving.spec import ShapeUse

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


def plan_batches(plan: Plan, bucket: Bucket | None) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(shape, size, context or None) of every batch of one plan.

    A batch declaring two shapes is an error naming its line; with requests, the plan
    must cover them exactly once (model.validate's rule) so every generation is known.
    """
    import numpy as np

    from model.cost.metrics import batch_index
    from model.evaluation.validate import plan_rows

    codes, ids = batch_index(plan.batch_ids)
    first = np.unique(codes, return_index=True)[1]
    shape = plan.seq_align[first]
    mixed = plan.seq_align != shape[codes]
    if mixed.any():
        k = int(mixed.argmax())
        line = int(plan.lines[k]) if plan.lines is not None else None
        raise InputError(plan.source, line, "shape.seq_align",
                         f"batch {ids[codes[k]]!r} declares two shapes, {int(shape[codes[k]])} and "
                         f"{int(plan.seq_align[k])}")
    size = np.bincount(codes, minlength=len(ids))
    if bucket is None:
        return shape, size, None
    rows, problems = plan_rows(bucket, plan)
    if problems:
        raise InputError(plan.source, None, "request_id", f"plan and requests {bucket.source} disagree: "
                         f"{problems[0].message}")
    g_max = np.zeros(len(ids), dtype=np.int64)
    np.maximum.at(g_max, codes, bucket.gen_len[rows])
    return shape, size, shape + g_max


def shape_uses(plans: list[Plan], buckets: list[Bucket | None]) -> tuple[ShapeUse, ...]:
    """Per shape across all plans: the batch sizes used at it and its longest context."""
    from model.serving.spec import ShapeUse

    sizes: dict[int, set[int]] = {}
    context: dict[int, int] = {}
    known = all(b is not None for b in buckets)
    for plan, bucket in zip(plans, buckets, strict=True):
        shape, size, ctx = plan_batches(plan, bucket)
        for k, s in enumerate(shape.tolist()):
            sizes.setdefault(s, set()).add(int(size[k]))
            if ctx is not None:
                context[s] = max(context.get(s, 0), int(ctx[k]))
    return tuple(ShapeUse(s, tuple(sorted(sizes[s])), context[s] if known else None) for s in sorted(sizes))


def write_atomic(target: Path, text: str) -> None:
    """Write the export through the project's all-or-nothing writer (its target checked by ``main`` first)."""
    write_together({target: [text.encode("utf-8")]})


def positive_option(name: str, value: int | None) -> int | None:
    """A positive integer option up to 2**20 (or None when not given)."""
    from model.load.requests import MAX_LEN

    if value is not None and not 1 <= value <= MAX_LEN:
        raise InputError(name, None, None, f"must be a positive integer up to {MAX_LEN}, got {value}")
    return value


def main(argv: list[str] | None = None) -> int:
    # heavy modules only now: run_main's signal handlers are in place (see model.cli_common)
    from model.load.plans import read_plan
    from model.serving.formats import WRITERS, render
    from model.serving.spec import DEFAULT_BLOCK_SIZE, ExportSpec

    parser = argparse.ArgumentParser(prog="python -m model.export", description=__doc__.split("\n")[0])
    parser.add_argument("--plans", type=Path, required=True, help="folder of plan_*.jsonl")
    parser.add_argument("--format", required=True, help=f"output format: {', '.join(WRITERS)}")
    parser.add_argument("--out", type=Path, required=True, help="file to write (atomically)")
    parser.add_argument("--block-size", type=int_flag("--block-size"), default=DEFAULT_BLOCK_SIZE,
                        help=f"KV block size for Gaudi decode buckets (default {DEFAULT_BLOCK_SIZE})")
    parser.add_argument("--max-model-len", type=int_flag("--max-model-len"),
                        default=None, help="the server's max model length")
    parser.add_argument("--scenario", type=Path, help="scenario.toml of the plans (gives generation lengths)")
    parser.add_argument("--requests", type=Path, nargs="+", default=[],
                        help="request files of the plans, <name>.jsonl for plan_<name>.jsonl")
    args = parser.parse_args(argv)
    if args.format not in WRITERS:
        raise InputError("--format", None, None, f"unknown format {args.format!r} ({', '.join(WRITERS)})")
    block_size = positive_option("--block-size", args.block_size)
    max_model_len = positive_option("--max-model-len", args.max_model_len)
    target = [Target("--out", args.out, "file", "give the path of the file to write")]
    check_targets(target, [*args.requests, *([args.scenario] if args.scenario else [])])  # before any reading
    files = plan_files(args.plans)
    plans = [read_plan(f) for f in files]
    by_name = request_buckets(args.scenario, args.requests)
    check_targets(target)  # not one of the plans or requests just read
    buckets: list[Bucket | None] = [None] * len(files)
    if by_name is not None:
        for i, f in enumerate(files):
            if bucket_name(f) not in by_name:
                raise InputError(str(f), None, None, f"no requests for bucket {bucket_name(f)!r} "
                                 f"(known: {', '.join(sorted(by_name))})")
            buckets[i] = by_name[bucket_name(f)]
    spec = ExportSpec(shape_uses(plans, buckets), block_size, max_model_len)
    text = render(args.format, spec)
    write_atomic(args.out, text)
    print(f"wrote {args.out} ({args.format}) from {len(files)} plans: shapes {list(spec.shapes)}, "
          f"batch sizes {list(spec.batch_sizes)}")
    if not spec.has_contexts:
        print("note: no --scenario or --requests, so no decode/context buckets (plans carry no generation lengths)")
    return 0


def entry() -> None:
    """Console-script entry point."""
    run_main(main)


if __name__ == "__main__":
    entry()
