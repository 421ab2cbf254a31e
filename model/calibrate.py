"""Fit a device profile to measured step times and write it as a [device] TOML table.

    python -m model.calibrate data/examples/calibrate/measurements.csv --out profile.toml --report fit/
    python -m model.calibrate measurements.csv --out profile.toml --compile-ms 45000 --kv-capacity-tokens 2000000
    python -m model.calibrate measurements.csv --out profile.toml --stack gaudi --max-num-seqs 64 \\
        --max-num-batched-tokens 8192 --block-size 128
    python -m model.calibrate data/examples/calibrate/step-log.csv --out log.toml \\
        --columns phase=kind,batch_size=num_seqs,seq_len=padded_len,seconds=elapsed_s
    python -m model.calibrate data/examples/calibrate/nxdi/*/benchmark_report.json --out nxdi.toml
    python -m model.calibrate data/examples/calibrate/distserve-profile.json --model facebook/opt-13b --tp 1 \\
        --out distserve.toml

Each FILE is told by its content (model/calibration/inputs.py): our measurements CSV, a
per-step timing CSV with ``--columns``, NxD Inference ``benchmark_report.json`` files (one per
run, placed by the ``neuron_config.json`` beside each or by flags), or DistServe's profile JSON
(already fitted: taken as the profile, its assumptions written in the header).
Prints the fit of each phase (rows, R^2, mean and max relative error), then writes
the profile -- and with ``--report`` one predicted-vs-measured PNG per phase -- all
together or not at all: bad input exits 2 with ``file:line`` and leaves every
existing file as it was.  The measurements say nothing about compile time or KV
capacity, so those come from flags (compile_ms defaults to 20 s per shape, the
shared example's assumption) and the output says where they came from.  The file ends
with serving mode's ``[server]`` table: the settings given as flags (checked as the
replay checks them), or a commented skeleton to fill in.
"""

from __future__ import annotations

import argparse
import json
import math
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING

from model.base.errors import InputError
from model.base.numbers import float_flag, int_flag, integer_text
from model.cli_common import CommandParser, run_main
from model.cli_json import JsonOut, add_json_arg, json_output, json_targets
from model.deploy.serving_flags import SERVER_EXAMPLES
from model.load.outputs import Target, check_targets, file_flag, files_in, write_together

if TYPE_CHECKING:  # imported where used, after run_main's signal handlers are in place (see model.cli_common)
    from model.calibration.fit import Calibration, Split
    from model.calibration.inputs import Read
    from model.cost.device import DeviceProfile
    from model.domain.server import ServerSettings

# the [server] keys (model.domain.server.SERVER_KEYS, spelt here so the flags need no import before run_main)
SERVER_KEYS = ("stack", "max_num_seqs", "max_num_batched_tokens", "block_size", "max_prefill_seqs",
               "ctx_batch_size")

KEY_ORDER = ("name", "prefill", "decode", "decode_large", "decode_large_from", "batch_overhead_ms", "compile_ms",
             "kv_capacity_tokens", "cost_per_device_hour", "runtime_compile_ms")


def parse_split(text: str) -> Split:
    """``--decode-split``: auto, none, or the first batch size that runs decode_large."""
    from model.load.profile import MAX_COUNT

    if text in ("auto", "none"):
        return text  # type: ignore[return-value]
    value = integer_text(text)
    if value is None or not 1 <= value <= MAX_COUNT:
        raise InputError("--decode-split", None, None, f"must be auto, none or a positive integer"
                         f"{'' if value is None or value < 1 else f' up to {MAX_COUNT}'}, got {text!r}")
    return value


def toml_string(text: str, field: str) -> str:
    """A TOML basic string (JSON's escapes are TOML's; DEL is the one control JSON leaves raw)."""
    quoted = json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")
    try:
        quoted.encode("utf-8")
    except UnicodeEncodeError:
        raise InputError(field, None, None, f"cannot be written as UTF-8: {text!r}") from None
    return quoted


def comment_text(text: str) -> str:
    """Arbitrary text made safe for one TOML comment line (ASCII, no control characters)."""
    return json.dumps(text, ensure_ascii=True).replace("\x7f", "\\u007f")


def _value(value) -> str:
    """A profile value in TOML: floats by repr (round-trips exactly), coefficient lists, integers."""
    if isinstance(value, tuple):
        return "[" + ", ".join(repr(float(v)) for v in value) + "]"
    return repr(value)


def fit_lines(cal: Calibration) -> list[str]:
    """The per-phase table: rows used, batch sizes, R^2, mean and max relative error, coefficients."""
    out = [f"{'phase':<13} {'rows':>6} {'batch sizes':>12} {'R^2':>9} {'mean err':>9} {'max err':>8}  coefficients"]
    for f in cal.fits:
        sizes = f"{f.batch_sizes[0]}-{f.batch_sizes[1]}"
        coeffs = ", ".join(f"{c:.6g}" for c in f.coefficients)
        out.append(f"{f.phase:<13} {f.rows:>6} {sizes:>12} {f.r2:>9.5f} {100 * f.mean_rel_error:>8.2f}% "
                   f"{100 * f.max_rel_error:>7.2f}%  [{coeffs}]")
    return out


def notes(cal: Calibration, compile_given: bool) -> list[str]:
    """Where every profile value not fitted to a row came from, and how the decode split was chosen."""
    p = cal.profile
    tried = len(cal.split_candidates)
    if cal.split_mode == "auto" and p.decode_large_from is not None:
        split = (f"decode split: auto chose decode_large from batch size {p.decode_large_from} "
                 f"(best of {tried} candidate splits, and better than one line by BIC)")
    elif cal.split_mode == "auto":
        split = f"decode split: auto found no split better than one line by BIC ({tried} candidates tried)"
    elif cal.split_mode == "fixed":
        split = f"decode split: decode_large from batch size {p.decode_large_from} (--decode-split)"
    else:
        split = "decode split: none (--decode-split none)"
    compile_ms = (f"compile_ms = {p.compile_ms:g} ms from --compile-ms" if compile_given else
                  f"compile_ms = {p.compile_ms:g} ms is ASSUMED (default): the measurements do not carry "
                  "compile time; set it with --compile-ms")
    kv = (f"kv_capacity_tokens = {p.kv_capacity_tokens} from --kv-capacity-tokens" if p.kv_capacity_tokens
          else "kv_capacity_tokens not set: the measurements do not carry it; set it with --kv-capacity-tokens")
    return [split, compile_ms, kv]


SERVER_SKELETON = [
    "# Serving mode (python -m model.replay, docs/serving_model.md) also reads a [server] table: fill it in and",
    "# uncomment it, or give these settings as flags of model.calibrate or model.replay. In [device],",
    "# runtime_compile_ms = N prices a graph compiled while serving (default: compile_ms).",
    "# [server]",
    '# stack = "gaudi"                 # gaudi or nxdi: the lookup rules, KV pool and run-time compiles',
    "# max_num_seqs = 64               # requests running at once",
    "# max_num_batched_tokens = 8192   # token budget of a step; at least the longest prompt (no chunked prefill)",
    "# block_size = 128                # gaudi: KV block size in tokens",
    "# max_prefill_seqs = 4            # gaudi: prompts a step (default: the largest batch of the prompt graphs)",
    "# ctx_batch_size = 1              # nxdi, instead of the two gaudi keys: the context-encoding batch",
]


def flag_name(key: str) -> str:
    """The flag of a [server] key (``max_num_seqs`` -> ``--max-num-seqs``), as model.replay spells it."""
    return "--" + key.replace("_", "-")


def server_lines(server: ServerSettings | None, given: dict[str, object]) -> list[str]:
    """The [server] table with the settings given as flags, or the commented skeleton when none were."""
    if server is None:
        return SERVER_SKELETON
    lines = ["", "[server]"]
    for key in SERVER_KEYS:
        if given.get(key) is not None:
            lines.append(f"{key} = {toml_string(str(given[key]), flag_name(key)) if key == 'stack' else given[key]}")
    return lines


def profile_toml(cal: Calibration, note_lines: list[str], server: list[str] | None = None) -> str:
    """The profile file: a comment header (source, fit quality, assumptions), the [device] table and the
    [server] table (or its commented skeleton)."""
    head = [f"# Device profile fitted by shapeplan-calibrate (model/calibrate.py) from {comment_text(cal.source)}",
            "# by non-negative least squares on relative error (see model/calibration/fit.py). Fit per phase:"]
    head += [f"#   {line}" for line in fit_lines(cal)]
    return profile_text(cal.profile, head, note_lines, server)


def profile_text(profile: DeviceProfile, head: list[str], note_lines: list[str], server: list[str] | None) -> str:
    """Comment header lines, the notes as comments, the [device] table and the [server] table (or skeleton)."""
    head = head + [f"# {comment_text(line)[1:-1]}" for line in note_lines]
    body = ["[device]"]
    for key in KEY_ORDER:
        value = getattr(profile, key)
        if value is None:
            continue
        body.append(f"{key} = {toml_string(value, '--name') if key == 'name' else _value(value)}")
    return "\n".join(head + body + (server if server is not None else SERVER_SKELETON)) + "\n"


def check_loads_back(text: str, profile: DeviceProfile, target: Path, server: ServerSettings | None = None) -> None:
    """The written text must load (with the loader's own checks) to exactly the fitted profile and server."""
    from model.load.profile import profile_from_table
    from model.load.server import server_settings, server_table

    data = tomllib.loads(text)
    loaded = profile_from_table(data["device"], str(target), text)
    if loaded != profile:
        raise AssertionError(f"profile text does not load back: {loaded} != {profile}")
    table = server_table(data["server"], str(target), text) if "server" in data else None
    if (server_settings(table, {}) if table is not None else None) != server:
        raise AssertionError(f"server table does not load back: {table} != {server}")


def build_parser() -> argparse.ArgumentParser:
    """The calibrate command's flags (heavy modules imported here run after run_main's signal handlers are set)."""
    from model.calibration.fit import DEFAULT_COMPILE_MS

    parser = CommandParser("model.calibrate", __doc__)
    parser.add_argument("measurements", type=Path, nargs="+", metavar="FILE",
                        help="CSV phase,batch_size,seq_len,ms[,weight]; a timing CSV with --columns; NxD Inference "
                             "benchmark_report.json files; or a DistServe profile JSON (told by content), e.g. "
                             "measurements.csv")
    parser.add_argument("--columns", help="a timing CSV's columns: phase=COL,batch_size=COL,seq_len=COL,ms=COL "
                        "(or seconds=COL)[,weight=COL]; other columns are ignored, e.g. "
                        "--columns phase=kind,batch_size=num_seqs,seq_len=padded_len,seconds=elapsed_s")
    parser.add_argument("--batch-size", type=int_flag("--batch-size"), default=None,
                        help="NxD Inference reports without a neuron_config.json beside them: the run's batch size, "
                             "e.g. --batch-size 4")
    parser.add_argument("--context-length", type=int_flag("--context-length"), default=None,
                        help="... and its max_context_length, e.g. --context-length 1024 (default: --seq-len)")
    parser.add_argument("--seq-len", type=int_flag("--seq-len"), default=None,
                        help="... and its seq_len, e.g. --seq-len 2048")
    parser.add_argument("--model", help="a DistServe profile of several models: which one, e.g. "
                                        "--model facebook/opt-13b")
    parser.add_argument("--tp", help="a DistServe profile: which tensor-parallel degree, e.g. --tp 2")
    parser.add_argument("--out", type=file_flag("--out"), required=True,
                        help="profile TOML to write, e.g. --out profile.toml")
    parser.add_argument("--report", type=Path, help="folder for prefill.png and decode.png, e.g. --report fit/")
    parser.add_argument("--decode-split", default="auto",
                        help="auto (default), none, or the first batch size decode_large prices, e.g. "
                             "--decode-split 32")
    parser.add_argument("--compile-ms", type=float_flag("--compile-ms"), default=None,
                        help=f"compile time per shape in ms, not measurable from step times, e.g. --compile-ms 45000 "
                             f"(default {DEFAULT_COMPILE_MS:g})")
    parser.add_argument("--kv-capacity-tokens", type=int_flag("--kv-capacity-tokens"), default=None,
                        help="KV-cache capacity in tokens, e.g. --kv-capacity-tokens 2000000")
    parser.add_argument("--name", help="profile name, e.g. --name 'llama-8b trn1 tp2' (default: 'calibrated from "
                                                 "<measurements file>')")
    for key in SERVER_KEYS:
        parser.add_argument(flag_name(key), type=str if key == "stack" else int_flag(flag_name(key)), default=None,
                            help=f"[server] {key} (serving mode; with any of these the table is written, else a "
                                 f"commented skeleton), e.g. {SERVER_EXAMPLES[key]}")
    return parser


def main(argv: list[str] | None = None) -> int:
    # heavy modules only now: run_main's signal handlers are in place (see model.cli_common)
    parser = build_parser()
    add_json_arg(parser)
    args = parser.parse_intermixed_args(argv)  # files may come after flags: calibrate A.json --tp 1 B.json
    with json_output(args.json) as sink:
        return run_calibrate(args, sink)


def run_calibrate(args: argparse.Namespace, sink: JsonOut) -> int:
    """Fit, check the profile text loads back, write it (with the pictures and the JSON) together, summarise."""
    from model.calibration import fit_plots
    from model.calibration.fit import DEFAULT_COMPILE_MS, fit_profile
    from model.calibration.fit_plots import REPORT_FILES
    from model.calibration.inputs import Options, read_inputs
    from model.calibration.measurements import parse_column_map
    from model.deploy.summaries import calibrate_summary
    from model.load.profile import MAX_COUNT, MAX_VALUE
    from model.load.server import server_settings
    from model.report.json_doc import DataTable, document, document_bytes
    from model.report.summary import summary_lines

    targets = [Target("--out", args.out, "file", "give the path of the profile TOML to write"),
               *json_targets(args.json)]
    if args.report is not None:
        targets += [Target("--report", args.report, "folder", "give a folder for prefill.png and decode.png"),
                    *files_in("--report", args.report, REPORT_FILES)]
    besides = [p.parent / "neuron_config.json" for p in args.measurements]
    check_targets(targets, [*args.measurements, *(p for p in besides if p.is_file())])  # before any reading
    split = parse_split(args.decode_split)
    for flag in ("--batch-size", "--context-length", "--seq-len"):
        value = getattr(args, flag[2:].replace("-", "_"))
        if value is not None and value < 1:
            raise InputError(flag, None, None, f"must be a positive integer, got {value}")
    compile_ms = DEFAULT_COMPILE_MS if args.compile_ms is None else args.compile_ms
    if not (math.isfinite(compile_ms) and compile_ms >= 0):
        raise InputError("--compile-ms", None, None, f"must be a finite non-negative number, got {compile_ms}")
    if compile_ms > MAX_VALUE:  # what a profile may hold (else the written file would not load back)
        raise InputError("--compile-ms", None, None, f"must be at most {MAX_VALUE:g}, got {compile_ms:g}")
    if args.kv_capacity_tokens is not None and args.kv_capacity_tokens < 1:
        raise InputError("--kv-capacity-tokens", None, None,
                         f"must be a positive integer, got {args.kv_capacity_tokens}")
    if args.kv_capacity_tokens is not None and args.kv_capacity_tokens > MAX_COUNT:  # what a profile may hold
        raise InputError("--kv-capacity-tokens", None, None,
                         f"must be at most {MAX_COUNT} (2**53), got {args.kv_capacity_tokens}")
    given = {key: getattr(args, key) for key in SERVER_KEYS}
    server = server_settings(None, given) if any(v is not None for v in given.values()) else None
    options = Options(parse_column_map(args.columns) if args.columns is not None else None, args.batch_size,
                      args.context_length, args.seq_len, args.model, args.tp)
    read = read_inputs(args.measurements, options)
    if read.distserve_text is not None:
        return write_distserve(args, read, compile_ms, server, given)
    files = args.measurements
    name = args.name if args.name is not None else (f"calibrated from {files[0].name}" if len(files) == 1 else
                                                     f"calibrated from {len(files)} files ({files[0]}, ...)")
    assert read.measurements is not None
    cal = fit_profile(read.measurements, split, compile_ms, args.kv_capacity_tokens, name)
    note_lines = [*input_notes(read.kinds), *notes(cal, args.compile_ms is not None)]
    text = profile_toml(cal, note_lines, server_lines(server, given))
    check_loads_back(text, cal.profile, args.out, server)
    files = {args.out: text.encode("utf-8")}
    if args.report is not None:
        files.update({args.report / file: data for file, data in fit_plots.report_pngs(cal).items()})
    summary = calibrate_summary(cal, str(args.out))
    fits = DataTable(("phase", "rows", "batch_sizes", "r2", "mean_rel_error", "max_rel_error", "coefficients"),
                     ("", "rows", "requests", "", "share", "share", "ms, ms per token, ms per token^2 or request"),
                     tuple((f.phase, f.rows, list(f.batch_sizes), f.r2, f.mean_rel_error, f.max_rel_error,
                            list(f.coefficients)) for f in cal.fits))
    data = document_bytes(document("calibrate", summary, {"fits": fits}))
    write_together({path: [data] for path, data in files.items()} | sink.files(data))
    print("\n".join(fit_lines(cal) + note_lines))
    print("wrote " + ", ".join(str(p) for p in (*files, *sink.files(data))))
    print("\n".join(summary_lines(summary)))
    sink.emit(data)
    return 0


def input_notes(kinds: tuple[str, ...]) -> list[str]:
    """What was assumed to turn NxD Inference benchmark reports into rows (nothing for CSV rows)."""
    if "nxdi" not in kinds:
        return []
    return ["NxD Inference reports: prefill row = context_encoding_model latency_ms_p50 at ctx_batch_size x "
            "max_context_length (ASSUMED: the benchmark's prompt fills the context window); decode row = "
            "token_generation_model latency_ms_avg at tkg_batch_size and the mean context (max_context_length + "
            "seq_len) / 2 (ASSUMED: the steps run evenly from the prompt's end to seq_len)"]


def write_distserve(args: argparse.Namespace, read: Read, compile_ms: float, server: ServerSettings | None,
                    given: dict[str, object]) -> int:
    """A DistServe profile: its chosen coefficients written as ours (nothing fitted, nothing to draw)."""
    from model.calibration.distserve import read_entry

    if args.report is not None:
        raise InputError("--report", None, None, "a DistServe profile holds fitted coefficients, no measurements "
                         "to draw")
    if args.decode_split != "auto":
        raise InputError("--decode-split", None, None, "a DistServe profile brings its own split "
                         "(decoding_large_small_bs_threshold)")
    assert read.distserve_text is not None
    text_in, data, source = read.distserve_text
    entry = read_entry(text_in, data, source, args.model, args.tp, compile_ms, args.kv_capacity_tokens, args.name)
    compile_note = (f"compile_ms = {compile_ms:g} ms from --compile-ms" if args.compile_ms is not None else
                    f"compile_ms = {compile_ms:g} ms is ASSUMED (default): DistServe's profile is of a GPU, which "
                    "compiles nothing; set it with --compile-ms")
    kv_note = (f"kv_capacity_tokens = {args.kv_capacity_tokens} from --kv-capacity-tokens"
               if args.kv_capacity_tokens else "kv_capacity_tokens not set: DistServe keeps it in "
               "max_num_tokens.csv; set it with --kv-capacity-tokens")
    note_lines = [*entry.notes, compile_note, kv_note]
    head = [f"# Device profile written by shapeplan-calibrate (model/calibrate.py) from the DistServe profile "
            f"{comment_text(source)}", "# (model/calibration/distserve.py says how its terms map onto ours)."]
    text = profile_text(entry.profile, head, note_lines, server_lines(server, given))
    check_loads_back(text, entry.profile, args.out, server)
    write_together({args.out: [text.encode("utf-8")]})
    print("\n".join(note_lines))
    print(f"wrote {args.out}")
    return 0


def entry() -> None:
    """Console-script entry point."""
    run_main(main)


if __name__ == "__main__":
    entry()
