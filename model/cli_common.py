"""Argument pieces shared by the command-line entry points (solve, evaluate, sweep)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from model.cost.analytic import CostParams
from model.cost.common import MODES
from model.errors import InfeasibleError, InputError
from model.load.requests import Columns, load_requests
from model.load.scenario import load_scenario
from model.schema import Bucket, Limits, Problem, Scenario


def add_input_args(parser: argparse.ArgumentParser) -> None:
    """Options that say what to plan or judge and under which cost model."""
    parser.add_argument("--scenario", type=Path, help="scenario.toml (request paths relative to it)")
    parser.add_argument("--columns", help="column mapping: 'azure' or PROMPT,GEN[,ID] (CSV/Parquet inputs)")
    parser.add_argument("--format", choices=("jsonl", "csv", "parquet"), help="input format (default: by suffix)")
    parser.add_argument("--cost-model", choices=MODES, default=None,
                        help="reference (default) or strict (declared shape is paid for)")
    parser.add_argument("--cost-params", type=Path, help="TOML file overriding cost-model coefficients")
    parser.add_argument("--limit-shapes", type=int, default=None, help="at most K shapes across all buckets")
    parser.add_argument("--max-seq-len", type=int, default=None, help="largest shape the accelerator allows")


def add_limit_args(parser: argparse.ArgumentParser) -> None:
    """Per-bucket limits given on the command line (they apply to every request file)."""
    parser.add_argument("--max-cost", type=float)
    parser.add_argument("--max-pad-ratio", type=float)
    parser.add_argument("--max-p95-latency-ms", type=float)
    parser.add_argument("--max-sequential-ms", type=float)


def cli_limits(args: argparse.Namespace) -> Limits:
    """Limits from flags; a negative one is an input error."""
    values = {}
    for key in ("max_cost", "max_pad_ratio", "max_p95_latency_ms", "max_sequential_ms"):
        v = getattr(args, key, None)
        if v is not None:
            if not v >= 0:
                raise InputError("--" + key.replace("_", "-"), None, None, f"must be a non-negative number, got {v}")
            values[key] = v
    return Limits(**values)


def build_problem(args: argparse.Namespace, files: list[Path], default_scenario: Path | None = None,
                  limits: Limits | None = None) -> tuple[Problem, Scenario | None]:
    """The Problem described by --scenario, by request files, or by the embedded default.

    Limit flags (``limits``, by default read from ``args``) apply to every bucket; with
    a scenario they override its limits one by one, so ``--max-cost`` tightens a
    scenario without silently being ignored.
    """
    params = CostParams.from_toml(args.cost_params) if args.cost_params else None
    if args.limit_shapes is not None and args.limit_shapes < 1:
        raise InputError("--limit-shapes", None, None, f"must be a positive integer, got {args.limit_shapes}")
    if args.max_seq_len is not None and (args.max_seq_len < 64 or args.max_seq_len % 64):
        raise InputError("--max-seq-len", None, None, f"must be a positive multiple of 64, got {args.max_seq_len}")
    limits = limits if limits is not None else cli_limits(args)
    scenario = None
    if args.scenario is not None or (not files and default_scenario is not None):
        scenario = load_scenario(args.scenario or default_scenario)
        problem = scenario.problem(max_shapes=args.limit_shapes, params=params, mode=args.cost_model,
                                   max_batch_size=getattr(args, "max_batch_size", None),
                                   max_seq_len=args.max_seq_len,
                                   limits=tuple(overridden(lim, limits) for lim in scenario.limits))
    else:
        if not files:
            raise InputError("<command line>", None, None, "no input: give request files or --scenario")
        columns = Columns.parse(args.columns) if args.columns else None
        buckets = tuple(load_requests(f, None, columns, args.format) for f in files)
        check_unique_names(buckets)
        problem = Problem(buckets=buckets, limits=tuple(limits for _ in buckets),
                          max_shapes=args.limit_shapes or 8, params=params or CostParams(),
                          mode=args.cost_model or "reference",
                          max_batch_size=getattr(args, "max_batch_size", None), max_seq_len=args.max_seq_len)
    check_seq_len(problem)
    return problem, scenario


def overridden(base: Limits, flags: Limits) -> Limits:
    """base with every limit that flags sets replaced by the flag's value."""
    return replace(base, **{k: v for k, v in vars(flags).items() if v is not None})


def check_unique_names(buckets: tuple[Bucket, ...]) -> None:
    """Bucket names come from file names and name the plan files, so two must not collide."""
    seen: dict[str, str] = {}
    for b in buckets:
        if b.name in seen:
            raise InputError(b.source, None, None,
                             f"bucket name {b.name!r} is also the name of {seen[b.name]}; "
                             "bucket names come from file names and must differ")
        seen[b.name] = b.source


def check_seq_len(problem: Problem) -> None:
    """A prompt longer than the largest allowed shape can never be planned: name it."""
    if problem.max_seq_len is None:
        return
    for b in problem.buckets:
        over = b.prompt_len > problem.max_seq_len
        if over.any():
            k = int(over.argmax())
            raise InputError(b.source, int(b.lines[k]), "prompt_len",
                             f"{int(b.prompt_len[k])} is longer than the largest allowed shape {problem.max_seq_len}")


def run_main(main) -> None:
    """Run an entry point: bad input -> one line on stderr and exit 2; infeasible -> exit 3."""
    try:
        sys.exit(main())
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    except InfeasibleError as exc:
        print(f"infeasible: {exc}", file=sys.stderr)
        sys.exit(3)
