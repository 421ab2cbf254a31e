"""Argument pieces shared by the command-line entry points (solve, evaluate, sweep, audit, export, calibrate).

Start-up.  A command line's ``entry()`` calls ``run_main`` first, which installs the SIGINT and
SIGTERM handlers before anything heavy is imported: this module and the command-line modules
import only the standard library and ``model.base`` / ``model.load.files`` / ``model.load.outputs``
at their top, and everything else (numpy, pandas, pyarrow, the solvers: about two seconds)
inside the functions that use it.  Ctrl-C during those imports is then exit 130 with one line,
as at any other moment, instead of a KeyboardInterrupt traceback and death by signal.
``tests/test_robustness.py`` holds a start-up import back until it is signalled.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from model.base.errors import InfeasibleError, InputError, NoPlanFound, closest
from model.base.numbers import float_flag, int_flag
from model.base.runtime import Interrupted, leave, shielded, signal_handlers
from model.load.files import recorded_inputs

if TYPE_CHECKING:
    from model.domain.schema import Limits, Problem, Scenario

ABANDONED_WAIT_S = 5.0  # at exit, a solver left behind gets this long to end before the process leaves anyway


PACKAGE = "shapeplan"  # the distribution whose metadata gives --version (pyproject's [project] name)
SCRIPT_PREFIX = "shapeplan-"  # pyproject's [project.scripts]: shapeplan-solve runs model.solve:entry


def program_name(module: str, argv0: str | None = None) -> str:
    """The program as the user invoked it, for usage lines, errors and examples: ``shapeplan-solve`` when the
    console script ran (``sys.argv[0]`` names it), else ``python -m model.solve``."""
    script = SCRIPT_PREFIX + module.rsplit(".", 1)[-1]
    name = Path(sys.argv[0] if argv0 is None else argv0).name
    # pip's Windows launchers are shapeplan-solve.exe (and -script.py)
    return script if name in (script, f"{script}.exe", f"{script}-script.py") else f"python -m {module}"


def package_version() -> str:
    """The installed package's version (its metadata, so it is the version pip installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(PACKAGE)
    except PackageNotFoundError:
        return "unknown (not installed: pip install -e . in the repository)"


def help_texts(doc: str, module: str, prog: str) -> tuple[str, str]:
    """The description (the docstring's first line) and the epilog (its examples and the rest of its text) of a
    command, with ``python -m model.X`` replaced by the program as invoked."""
    first, _, rest = doc.strip().partition("\n")
    invoked = f"python -m {module}"
    description = first.replace(f"``{invoked}``: ", "").replace("``", "")
    body = rest.strip("\n").replace(invoked, prog).replace("``", "")
    examples, _, prose = body.partition("\n\n")
    return description, "examples:\n" + examples + ("\n\n" + prose if prose else "")


class CommandParser(argparse.ArgumentParser):
    """A command's parser: errors as one line with a hint (not 22 lines of usage), "did you mean" for a misspelt
    flag or choice, ``--version``, a usage line naming the program as invoked, and examples in the epilog.

    Every error still exits 2, as argparse's own do and as bad input does (README, "Exit statuses").
    """

    def __init__(self, module: str, doc: str, **kwargs) -> None:
        prog = program_name(module)
        description, epilog = help_texts(doc, module, prog)
        super().__init__(prog=prog, description=description, epilog=epilog,
                         formatter_class=argparse.RawDescriptionHelpFormatter, **kwargs)
        self.add_argument("--version", action="version", version=f"%(prog)s {package_version()}",
                          help="print the program's version and exit, e.g. --version")

    def error(self, message: str):
        """One line on stderr, then exit 2: the message, and where the full list of flags is."""
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def parse_args(self, args=None, namespace=None):
        """As argparse's, but an unknown flag is named with the closest known one, and before a missing required
        flag is (``--shapes-frm X``: the typo is the news, not the missing --shapes-from)."""
        argv = list(sys.argv[1:] if args is None else args)
        flags = list(self._option_string_actions)
        typos = unknown_flags(argv, flags)
        if typos:
            self.error(unknown_arguments(typos, flags))
        parsed, extras = self.parse_known_args(argv, namespace)
        if extras:
            self.error(unknown_arguments(extras, flags))
        return parsed

    def parse_intermixed_args(self, args=None, namespace=None):
        """As argparse's (positionals may follow flags), with the same "did you mean" for a misspelt flag."""
        argv = list(sys.argv[1:] if args is None else args)
        flags = list(self._option_string_actions)
        typos = unknown_flags(argv, flags)
        if typos:
            self.error(unknown_arguments(typos, flags))
        return super().parse_intermixed_args(argv, namespace)

    def _check_value(self, action, value):  # argparse's hook for choices=
        if action.choices is not None and value not in action.choices:
            near = closest(str(value), action.choices)
            hint = f"; did you mean {near!r}?" if near is not None else ""
            raise argparse.ArgumentError(action, f"invalid choice {value!r}{hint} (choose from "
                                                 f"{', '.join(map(str, action.choices))})")


def unknown_flags(argv: list[str], flags: list[str]) -> list[str]:
    """The tokens before ``--`` that look like long flags and match no flag, not even as an abbreviation."""
    out = []
    for arg in argv:
        if arg == "--":
            break
        flag = arg.partition("=")[0]
        if flag.startswith("--") and len(flag) > 2 and " " not in flag and not any(f.startswith(flag) for f in flags):
            out.append(arg)
    return out


def unknown_arguments(extras: list[str], flags: list[str]) -> str:
    """The message for arguments no option takes: the first unknown flag with its closest known spelling."""
    for arg in extras:
        if arg.startswith("-") and len(arg) > 1:
            flag = arg.partition("=")[0]
            near = closest(flag, [f for f in flags if f.startswith("--")])
            more = f" (and {len(extras) - 1} more unrecognised argument{'s' if len(extras) > 2 else ''})" \
                if len(extras) > 1 else ""
            return f"unknown flag {flag}" + (f"; did you mean {near}?" if near else "") + more
    return f"unrecognised argument{'s' if len(extras) > 1 else ''}: {' '.join(extras)}"




def add_input_args(parser: argparse.ArgumentParser) -> None:
    """Options that say what to plan or judge and under which cost model."""
    from model.cost.common import MODES
    from model.deploy.flags import add_batch_buckets_arg, add_graph_cap_args

    parser.add_argument("--scenario", type=Path,
                        help="scenario TOML naming the request files (paths relative to it), their limits and cost "
                             "model, e.g. --scenario data/default/scenario.toml")
    parser.add_argument("--columns",
                        help="which columns hold the lengths (and the id): 'azure' or PROMPT,GEN[,ID], e.g. "
                             "--columns input_tokens,output_tokens,id (without an ID the rows are numbered)")
    parser.add_argument("--format", choices=("jsonl", "csv", "parquet"),
                        help="request file format, e.g. --format csv (default: by suffix)")
    parser.add_argument("--cost-model", choices=MODES, default=None,
                        help="reference (default), strict (declared shape is paid for) or device "
                             "(measured step times of --device-profile), e.g. --cost-model strict")
    parser.add_argument("--device-profile", type=Path,
                        help="device profile TOML ([device] table of measured step times): device mode, e.g. "
                             "--device-profile data/profiles/opt13b-a100-tp1.toml")
    parser.add_argument("--cost-params", type=Path,
                        help="TOML file overriding cost-model coefficients, e.g. --cost-params params.toml")
    parser.add_argument("--limit-shapes", type=int_flag("--limit-shapes"),
                        default=None, help="at most K shapes across all buckets, e.g. --limit-shapes 8")
    parser.add_argument("--max-seq-len", type=int_flag("--max-seq-len"),
                        default=None, help="largest shape (tokens) the accelerator allows, a multiple of 64, e.g. "
                                           "--max-seq-len 16384")
    add_batch_buckets_arg(parser)
    add_graph_cap_args(parser)


def add_limit_args(parser: argparse.ArgumentParser) -> None:
    """Per-bucket limits given on the command line (they apply to every request file)."""
    parser.add_argument("--max-cost", type=float_flag("--max-cost"),
                        help="each bucket's cost at most this, in the cost model's unit (device mode: device-ms), "
                             "e.g. --max-cost 2e6")
    parser.add_argument("--max-pad-ratio", type=float_flag("--max-pad-ratio"),
                        help="each bucket's padded tokens at most this share of its tokens, e.g. --max-pad-ratio 0.2")
    parser.add_argument("--max-p95-latency-ms", type=float_flag("--max-p95-latency-ms"),
                        help="each bucket's 95th-percentile request latency at most this many ms, e.g. "
                             "--max-p95-latency-ms 5000")
    parser.add_argument("--max-sequential-ms", type=float_flag("--max-sequential-ms"),
                        help="each bucket's batches run one after another in at most this many ms, e.g. "
                             "--max-sequential-ms 600000")


def cli_limits(args: argparse.Namespace) -> Limits:
    """Limits from flags; a negative one is an input error."""
    from model.domain.schema import LIMIT_KEYS, Limits

    values = {}
    for key in LIMIT_KEYS:
        v = getattr(args, key, None)
        if v is not None:
            if not 0 <= v < math.inf:
                raise InputError("--" + key.replace("_", "-"), None, None,
                                 f"must be a finite non-negative number, got {v}")
            values[key] = v
    return Limits(**values)


def check_count(flag: str, value: int | None, most: int) -> None:
    """An integer setting from the command line: 1 <= value <= most (None: not given)."""
    if value is not None and not 1 <= value <= most:
        raise InputError(flag, None, None, f"must be a positive integer, got {value}" if value < 1
                         else f"must be at most {most}, got {value}")


def check_sizes(args: argparse.Namespace) -> None:
    """--limit-shapes, --max-seq-len (a positive multiple of the granularity) and --max-batch-size in range."""
    from model.cost.common import GRANULARITY
    from model.load.scenario import MAX_BATCH, MAX_SEQ_LEN, MAX_SHAPES

    check_count("--limit-shapes", args.limit_shapes, MAX_SHAPES)
    if args.max_seq_len is not None and (args.max_seq_len < GRANULARITY or args.max_seq_len % GRANULARITY):
        raise InputError("--max-seq-len", None, None,
                         f"must be a positive multiple of {GRANULARITY}, got {args.max_seq_len}")
    check_count("--max-seq-len", args.max_seq_len, MAX_SEQ_LEN)
    check_count("--max-batch-size", getattr(args, "max_batch_size", None), MAX_BATCH)


def build_problem(args: argparse.Namespace, files: list[Path], default_scenario: Path | None = None,
                  limits: Limits | None = None) -> tuple[Problem, Scenario | None]:
    """The Problem the parsed arguments describe (see ``pipeline.load_problem``).

    Limit flags (``limits``, by default read from ``args``) apply to every bucket; with
    a scenario they override its limits one by one.
    """
    from model.deploy.flags import allowed_from_args, parse_batch_buckets, parse_graph_caps
    from model.domain.windowing import parse_window
    from model.load.params import cost_params_from_toml
    from model.load.profile import load_profile
    from model.load.requests import Columns
    from model.load.scenario import MAX_BATCH, MAX_SHAPES
    from model.pipeline import InputSpec, load_problem

    check_sizes(args)
    if args.columns is not None:
        Columns.parse(args.columns)  # an empty --columns is bad input, not "no mapping"
    window_s = parse_window(getattr(args, "window", None))
    limits = limits if limits is not None else cli_limits(args)
    params = cost_params_from_toml(args.cost_params) if args.cost_params else None
    device = load_profile(args.device_profile) if getattr(args, "device_profile", None) else None
    allowed, warning = allowed_from_args(args)
    if warning:
        print(f"warning: {warning}", file=sys.stderr)
    max_graphs, max_warmup_s = parse_graph_caps(getattr(args, "limit_graphs", None),
                                                getattr(args, "max_warmup_s", None),
                                                MAX_SHAPES * MAX_BATCH)  # a graph is a (batch bucket, shape) pair
    spec = InputSpec(files=tuple(files), scenario=args.scenario, columns=args.columns, fmt=args.format,
                     limits=limits, max_shapes=args.limit_shapes, params=params, device=device, mode=args.cost_model,
                     max_batch_size=getattr(args, "max_batch_size", None), max_seq_len=args.max_seq_len,
                     params_source=str(args.cost_params) if args.cost_params else None,
                     allowed_shapes=allowed, time_column=getattr(args, "time_column", None), window_s=window_s,
                     batch_buckets=parse_batch_buckets(getattr(args, "batch_buckets", None)), max_graphs=max_graphs,
                     max_warmup_s=max_warmup_s)
    return load_problem(spec, default_scenario)


ENGINES = ("memory", "dask")


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    """``--engine memory|dask`` and the Dask cluster to use."""
    parser.add_argument("--engine", choices=ENGINES, default="memory",
                        help="memory (default: files loaded into this process) or dask (each input a folder or glob "
                             "of Parquet/CSV/JSONL partitions, planned and judged on a Dask cluster; "
                             "pip install -e '.[dask]'), e.g. --engine dask")
    parser.add_argument("--scheduler", metavar="ADDRESS",
                        help="with --engine dask: join this Dask scheduler, e.g. --scheduler tcp://10.0.0.5:8786 "
                             "(default: a local cluster for the run)")


def check_engine_flags(args: argparse.Namespace, unsupported: tuple[str, ...]) -> None:
    """``--engine dask`` with a flag it does not support (named, all of them), ``--scheduler`` without it or
    with an empty address (which would silently start a local cluster instead): exit 2."""
    if args.scheduler is not None and not args.scheduler.strip():
        raise InputError("--scheduler", None, None, "empty address; give one like tcp://HOST:8786, or leave the "
                         "flag out for a local cluster")
    if args.engine != "dask":
        if args.scheduler is not None:
            raise InputError("--scheduler", None, None, "needs --engine dask")
        return
    given = [flag for flag in unsupported if getattr(args, flag.lstrip("-").replace("-", "_"), None) not in
             (None, False, [])]
    if given:
        raise InputError("--engine", None, None, f"dask does not support {', '.join(given)}")


def dask_settings(args: argparse.Namespace):
    """The engine settings the flags describe, checked as ``build_problem`` checks them for request files."""
    from model.cost.model import cost_from_flags, flag_coefficients
    from model.distributed.engine import Settings
    from model.load.params import cost_params_from_toml
    from model.load.profile import load_profile

    check_sizes(args)
    given = [flag for flag in ("--batch-buckets", "--limit-graphs", "--max-warmup-s")
             if getattr(args, flag.lstrip("-").replace("-", "_"), None) is not None]
    if given:
        raise InputError("--engine", None, None, f"dask does not support {', '.join(given)}")
    params = cost_params_from_toml(args.cost_params) if args.cost_params else None
    device = load_profile(args.device_profile) if getattr(args, "device_profile", None) else None
    cost = cost_from_flags(*flag_coefficients(args.cost_model, params, device))
    if cost.batch_buckets is not None or (cost.device_time and cost.params.auto_buckets):
        raise InputError("--engine", None, None, "dask does not support compiled batch sizes (batch_buckets in the "
                         "device profile): plan graphs with the memory engine")
    return Settings(limits=cli_limits(args), max_shapes=args.limit_shapes or 8, cost=cost,
                    max_batch_size=getattr(args, "max_batch_size", None), max_seq_len=args.max_seq_len,
                    params_source=str(args.cost_params) if args.cost_params else None,
                    columns=args.columns, fmt=args.format)


INPUT_FLAGS = ("requests", "pairs", "scenario", "device_profile", "cost_params", "shapes_from", "config",
               "measurements")  # the argparse destinations that name input files


def given_inputs(args: argparse.Namespace) -> list[Path]:
    """Every input path the command line names (what outputs must not overwrite before anything is read; the
    files a scenario names are added as the loaders read them, ``model.load.files``)."""
    out: list[Path] = []
    for name in INPUT_FLAGS:
        value = getattr(args, name, None)
        out += [Path(v) for v in value] if isinstance(value, list) else [Path(value)] if value is not None else []
    return out


def log_progress(quiet: bool) -> None:
    """Progress lines on stderr, each stamped with the ms since start; warnings only with --quiet."""
    logging.basicConfig(level=logging.WARNING if quiet else logging.INFO,
                        format="[%(relativeCreated)6.0f ms] %(message)s")


def check_time_limit(seconds: float) -> float:
    """``--time-limit``: a positive, finite number of seconds (negative, zero, NaN or inf is bad input)."""
    if not (seconds > 0 and math.isfinite(seconds)):
        raise InputError("--time-limit", None, None, f"must be a positive number of seconds, got {seconds}")
    return seconds


def run_main(main, hard_exit: bool = False) -> None:
    """Run an entry point and turn its outcome into an exit status (see README, "Exit statuses").

    Bad input -> one line on stderr, exit 2; limits proven unmeetable -> exit 3; no
    plan found without such a proof (time limit, solver failure) -> exit 4; SIGINT or
    SIGTERM -> exit 130 or 143 (nothing written: the solvers are stopped, their child
    processes and temporary files removed).  ``hard_exit`` (the command lines' own
    process): leave without the interpreter's shutdown if a solver thread that ignored
    its stop is still running (``model.base.runtime.leave``); in-process callers get SystemExit.
    """
    code = 1
    with signal_handlers(), recorded_inputs():
        try:
            code = main()
        except InputError as exc:
            code = _fail(2, f"error: {exc}")
        except InfeasibleError as exc:
            code = _fail(3, f"infeasible: {exc}")
        except NoPlanFound as exc:
            code = _fail(4, str(exc))
        except Interrupted as exc:
            code = _fail(exc.exit_code, f"{exc}; nothing written")
        except KeyboardInterrupt:
            code = _fail(130, "interrupted by SIGINT; nothing written")
    if hard_exit:
        leave(code, 0.0 if code in (130, 143) else ABANDONED_WAIT_S)
    sys.exit(code)


def _fail(code: int, message: str) -> int:
    """Say why on stderr (a second signal meanwhile is only recorded) and return the exit status."""
    with shielded():
        print(message, file=sys.stderr)
    return code
