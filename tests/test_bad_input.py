"""Bad input: the exact one-line message (file, line, field), exit status 2, nothing written.

Every case runs through the real entry point (``run_main(main)``, what ``python -m``
calls) in-process, so the table stays fast; the same table also runs as real
subprocesses under ``-m slow``, and a few representative cases always do.  Each
run starts with a good plan already in the output folder and checks that its bytes
-- and the folder's listing -- are unchanged afterwards.
"""

from __future__ import annotations

import io
import subprocess
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from model import evaluate, solve, sweep
from model.base.errors import InputError
from model.cli_common import run_main
from model.load.requests import load_requests

GOOD = ('{"request_id": "a", "prompt_len": 10, "gen_len": 5}\n'
        '{"request_id": "b", "prompt_len": 100, "gen_len": 7}\n')
GOOD_PLAN = ('{"request_id": "a", "batch_id": "b-1", "shape": {"seq_align": 128, "heads_align": 32, "hidden_align": 4096}}\n'
             '{"request_id": "b", "batch_id": "b-1", "shape": {"seq_align": 128, "heads_align": 32, "hidden_align": 4096}}\n')
OLD_PLAN = b'{"old": "plan that must survive"}\n'
HUGE = "1" + "0" * 400  # a valid TOML integer no float64 holds
HUGE_SHOWN = HUGE[:57] + "..."  # messages cut a value at 60 characters


def jsonl(*rows: str) -> str:
    """Request lines joined as a file (rows are written verbatim, blank ones included)."""
    return "".join(r + "\n" for r in rows)


def scenario(*bucket_lines: str, top: str = "max_shapes = 8") -> str:
    """A one-bucket scenario over req.jsonl with extra lines in its [[bucket]] table."""
    return "\n".join([top, "", "[[bucket]]", 'name = "b1"', 'requests = "req.jsonl"', *bucket_lines]) + "\n"


def shape_plan(shape: str) -> str:
    """GOOD_PLAN with the second record's shape replaced."""
    first = GOOD_PLAN.splitlines()[0]
    return f'{first}\n{{"request_id": "b", "batch_id": "b-1", "shape": {shape}}}\n'


@dataclass(frozen=True)
class Case:
    """A bad input: files to lay out, the command, and the exact error line.

    ``bucket`` names the plan solve would write (out/plan_<bucket>.jsonl), which is
    pre-created so we can see it is left alone.
    """

    id: str
    files: dict[str, str | bytes]
    argv: tuple[str, ...]
    error: str
    module: str = "solve"
    bucket: str = "req"
    loader: bool = field(default=True)  # the message also comes straight from load_requests(argv[0])

    def with_files(self, files: dict[str, str | bytes]) -> Case:
        """The same case with more files laid out."""
        return replace(self, files={**self.files, **files})


def solve_case(id: str, name: str, content: str | bytes, error: str, *extra: str, loader: bool = True) -> Case:
    """solve REQUESTS --solver cells --out out, on one request file."""
    return Case(id, {name: content}, (name, "--solver", "cells", "--out", "out", *extra), error,
                bucket=Path(name).stem, loader=loader)


def eval_case(id: str, plan: str, error: str) -> Case:
    """evaluate req.jsonl plan.jsonl with a good request file and a bad plan."""
    return Case(id, {"req.jsonl": GOOD, "plan.jsonl": plan}, ("req.jsonl", "plan.jsonl"), error,
                module="evaluate", loader=False)


def scenario_case(id: str, toml: str, error: str) -> Case:
    """solve --scenario s.toml on a good bucket b1."""
    return Case(id, {"s.toml": toml, "req.jsonl": GOOD}, ("--scenario", "s.toml", "--solver", "cells", "--out", "out"),
                error, bucket="b1", loader=False)


def sweep_case(id: str, error: str, *extra: str, files: dict[str, str | bytes] | None = None) -> Case:
    """sweep req.jsonl --solvers greedy with extra flags (validated before any work or write)."""
    return Case(id, {"req.jsonl": GOOD, **(files or {})}, ("req.jsonl", "--solvers", "greedy", "--quiet", *extra),
                error, module="sweep", loader=False)


def parquet(**columns) -> bytes:
    """A Parquet file's bytes holding the given columns (lists of Python values, types inferred by pyarrow)."""
    sink = io.BytesIO()
    pq.write_table(pa.table({k: pa.array(v) for k, v in columns.items()}), sink)
    return sink.getvalue()


def params_case(id: str, toml: str, error: str, *extra: str) -> Case:
    """solve req.jsonl --cost-params c.toml on good requests."""
    return Case(id, {"req.jsonl": GOOD, "c.toml": toml},
                ("req.jsonl", "--cost-params", "c.toml", "--solver", "cells", "--out", "out", *extra), error, loader=False)


def named(name_toml: str) -> str:
    """A one-bucket scenario over req.jsonl whose bucket name is the given TOML value (line 4)."""
    return f"max_shapes = 8\n\n[[bucket]]\nname = {name_toml}\nrequests = \"req.jsonl\"\n"


NAME_RULE = "is not plain (letters, digits, '-', '_' and '.', not starting with '.', at most 100 characters)"
FILE_NAME_HINT = "; rename the file or use a scenario with a plain bucket name"

ROW_A = '{"request_id": "a", "prompt_len": 10, "gen_len": 5}'

CASES = [
    # JSONL structure
    solve_case("malformed-json", "bad.jsonl", jsonl(ROW_A, '{"request_id": "b", "prompt_len": 10, "gen_len": 5'),
               "bad.jsonl:2: malformed JSON: Expecting ',' delimiter (column 51)"),
    solve_case("not-an-object", "bad.jsonl", jsonl(ROW_A, "[1, 2, 3]"),
               "bad.jsonl:2: expected a JSON object, got an array"),
    solve_case("nan-literal", "bad.jsonl", jsonl(ROW_A, '{"request_id": "b", "prompt_len": NaN, "gen_len": 5}'),
               "bad.jsonl:2: malformed JSON: NaN is not valid JSON"),  # the strict pass reads every float column
    # fields
    solve_case("missing-field-after-blank-lines", "bad.jsonl", jsonl(ROW_A, "", "  ", '{"request_id": "b", "prompt_len": 10}'),
               "bad.jsonl:4: field 'gen_len': missing"),
    solve_case("null-field", "bad.jsonl", jsonl(ROW_A, '{"request_id": "b", "prompt_len": null, "gen_len": 5}'),
               "bad.jsonl:2: field 'prompt_len': missing"),
    solve_case("missing-id", "bad.jsonl", jsonl(ROW_A, '{"prompt_len": 10, "gen_len": 5}'),
               "bad.jsonl:2: field 'request_id': missing"),
    solve_case("length-abc", "bad.jsonl", jsonl(ROW_A, '{"request_id": "b", "prompt_len": "abc", "gen_len": 5}'),
               "bad.jsonl:2: field 'prompt_len': expected an integer, got 'abc'"),
    solve_case("length-12.5", "bad.jsonl", jsonl(ROW_A, '{"request_id": "b", "prompt_len": 12.5, "gen_len": 5}'),
               "bad.jsonl:2: field 'prompt_len': expected an integer, got 12.5"),
    solve_case("length-true", "bad.jsonl", jsonl(ROW_A, '{"request_id": "b", "prompt_len": 10, "gen_len": true}'),
               "bad.jsonl:2: field 'gen_len': expected an integer, got True"),
    solve_case("length-zero", "bad.jsonl", jsonl(ROW_A, '{"request_id": "b", "prompt_len": 10, "gen_len": 0}'),
               "bad.jsonl:2: field 'gen_len': must be a positive integer, got 0"),
    solve_case("length-negative", "bad.jsonl", jsonl(ROW_A, '{"request_id": "b", "prompt_len": -3, "gen_len": 5}'),
               "bad.jsonl:2: field 'prompt_len': must be a positive integer, got -3"),
    solve_case("length-overflows-int64", "bad.jsonl",
               jsonl(ROW_A, '{"request_id": "b", "prompt_len": 99999999999999999999, "gen_len": 5}'),
               "bad.jsonl:2: field 'prompt_len': must be at most 1048576, got 99999999999999999999"),
    solve_case("first-bad-line-wins", "bad.jsonl",
               jsonl('{"request_id": "a", "prompt_len": 10, "gen_len": 0}', '{"request_id": "b", "prompt_len": -1, "gen_len": 5}'),
               "bad.jsonl:1: field 'gen_len': must be a positive integer, got 0"),
    solve_case("field-error-before-malformed-line", "bad.jsonl",
               jsonl('{"request_id": "a", "prompt_len": 0, "gen_len": 5}', "{oops"),
               "bad.jsonl:1: field 'prompt_len': must be a positive integer, got 0"),
    # ids
    solve_case("duplicate-id", "bad.jsonl", jsonl(ROW_A, "", '{"request_id": "a", "prompt_len": 20, "gen_len": 5}'),
               "bad.jsonl:3: field 'request_id': duplicate id 'a' (first on line 1)"),
    solve_case("fractional-id", "bad.jsonl", jsonl('{"request_id": 1, "prompt_len": 10, "gen_len": 5}',
                                                   '{"request_id": 2.5, "prompt_len": 10, "gen_len": 5}'),
               "bad.jsonl:2: field 'request_id': expected a string or integer id, got 2.5"),
    solve_case("empty-id", "bad.jsonl", jsonl('{"request_id": "", "prompt_len": 10, "gen_len": 5}'),
               "bad.jsonl:1: field 'request_id': must not be empty"),
    # files
    solve_case("empty-file", "empty.jsonl", "", "empty.jsonl: no requests (empty file)"),
    solve_case("blank-lines-only", "blank.jsonl", "\n  \n\r\n", "blank.jsonl: no requests (empty file)"),
    Case("missing-file", {}, ("nope.jsonl", "--solver", "cells", "--out", "out"),
         "nope.jsonl: cannot read: No such file or directory", bucket="nope"),
    Case("unreadable-file-is-a-folder", {"dir.jsonl/x": "x"}, ("dir.jsonl", "--solver", "cells", "--out", "out"),
         "dir.jsonl: is a folder, not a request file; name the files in it (e.g. dir.jsonl/*.jsonl), one bucket each",
         bucket="dir"),
    solve_case("unknown-suffix", "req.txt", GOOD,
               "req.txt: cannot tell the format from suffix '.txt'; use .jsonl, .csv or .parquet, or say it with --format "
               "jsonl|csv|parquet"),
    # CSV and Parquet
    solve_case("csv-non-numeric-cell", "bad.csv", "request_id,prompt_len,gen_len\na,10,5\nb,x,5\n",
               "bad.csv:3: field 'prompt_len': expected an integer, got 'x'"),
    solve_case("csv-line-after-blank-line", "bad.csv", "request_id,prompt_len,gen_len\na,10,5\n\nb,10,0\n",
               "bad.csv:4: field 'gen_len': must be a positive integer, got 0"),
    solve_case("csv-ragged-row", "bad.csv", "request_id,prompt_len,gen_len\na,10,5\nb,10\n",
               "bad.csv:3: malformed CSV: expected 3 fields, got 2"),
    solve_case("csv-missing-column", "bad.csv", "request_id,prompt_len\na,10\n",
               "bad.csv:1: field 'gen_len': no such column (the file has: request_id, prompt_len); map yours with "
               "--columns PROMPT,GEN[,ID], e.g. --columns input_tokens,output_tokens,id (or --columns azure for the "
               "Azure traces)"),
    solve_case("csv-header-only", "bad.csv", "request_id,prompt_len,gen_len\n", "bad.csv: no requests (only a header)"),
    solve_case("parquet-that-is-not", "bad.parquet", b"request_id,prompt_len\n",
               "bad.parquet: not a Parquet file (no PAR1 magic bytes)"),
    # limits and settings
    solve_case("prompt-longer-than-max-seq-len", "req.jsonl", GOOD,
               "req.jsonl:2: field 'prompt_len': 100 is longer than the largest allowed shape 64",
               "--max-seq-len", "64", loader=False),
    solve_case("max-seq-len-not-multiple-of-64", "req.jsonl", GOOD,
               "--max-seq-len: must be a positive multiple of 64, got 100", "--max-seq-len", "100", loader=False),
    solve_case("negative-limit-flag", "req.jsonl", GOOD, "--max-pad-ratio: must be a finite non-negative number, got -0.1",
               "--max-pad-ratio=-0.1", loader=False),
    solve_case("nan-limit-flag", "req.jsonl", GOOD, "--max-cost: must be a finite non-negative number, got nan",
               "--max-cost", "nan", loader=False),
    solve_case("zero-shapes", "req.jsonl", GOOD, "--limit-shapes: must be a positive integer, got 0",
               "--limit-shapes", "0", loader=False),
    solve_case("bad-columns-spec", "req.jsonl", GOOD,
               "--columns: expected a preset (default, azure) or PROMPT,GEN[,ID], got 'onlyone'",
               "--columns", "onlyone", loader=False),
    scenario_case("scenario-negative-pad-limit", scenario("max_cost = 1e9", "max_pad_ratio = -0.1"),
                  "s.toml:7: field 'bucket.max_pad_ratio': must be a finite non-negative number, got -0.1"),
    scenario_case("scenario-unknown-top-key", scenario(top="max_shapes = 8\nmax_shapez = 3"),
                  "s.toml:2: field 'max_shapez': unknown scenario key"),
    scenario_case("scenario-unknown-bucket-key", scenario("max_pad = 0.1"),
                  "s.toml:6: field 'bucket.max_pad': unknown bucket key"),
    scenario_case("scenario-zero-shapes", scenario(top="max_shapes = 0"),
                  "s.toml:1: field 'max_shapes': must be a positive integer, got 0"),
    scenario_case("scenario-malformed-toml", "max_shapes = 8\n[[bucket]\n",
                  "s.toml:2: malformed TOML: Expected ']]' at the end of an array declaration (column 9)"),
    scenario_case("scenario-missing-requests", scenario().replace("req.jsonl", "gone.jsonl"),
                  "gone.jsonl: cannot read: No such file or directory"),
    # numbers must be finite (and counts sane): NaN and inf never reach the planner
    params_case("cost-param-nan", "Kp_attn = 1.0\nKd_attn = nan\n", "c.toml:2: field 'Kd_attn': expected a finite non-negative number, got nan"),
    params_case("cost-param-inf-in-table", "# costs\n[cost_model]\nKp_attn = inf\n",
                "c.toml:3: field 'Kp_attn': expected a finite non-negative number, got inf"),
    params_case("cost-param-negative-inf", "Tp_attn = -inf\n", "c.toml:1: field 'Tp_attn': expected a finite non-negative number, got -inf"),
    params_case("cost-param-hidden-fraction", "hidden = 1.5\n", "c.toml:1: field 'hidden': expected a positive integer, got 1.5"),
    params_case("cost-param-unknown-key-line", "Kp_attn = 1\nKp_atn = 2\n", "c.toml:2: field 'Kp_atn': unknown cost-model coefficient"),
    params_case("cost-param-malformed", "Kp_attn = \n", "c.toml:1: malformed TOML: Invalid value (column 11)"),
    params_case("cost-overflows-float64", "Kd_attn = 1e308\n",
                "c.toml: costs overflow float64 with these coefficients: a plan of these requests could have cost inf"),
    params_case("latency-overflows-float64", "Tshape_compile_ms = 1.7e308\nTbatch_overhead_ms = 1.7e308\n",
                "c.toml: costs overflow float64 with these coefficients: a plan of these requests could have latency inf"),
    scenario_case("scenario-cost-model-inf", scenario(top="max_shapes = 8\n[cost_model]\nKp_attn = inf"),
                  "s.toml:3: field 'cost_model.Kp_attn': expected a finite non-negative number, got inf"),
    scenario_case("scenario-inline-cost-model-nan", scenario(top="max_shapes = 8\ncost_model = { Kd_attn = nan }"),
                  "s.toml:2: field 'cost_model.Kd_attn': expected a finite non-negative number, got nan"),
    scenario_case("scenario-cost-overflow", scenario(top="max_shapes = 8\ncost_model = { Kshape_attn = 1e308 }"),
                  "s.toml: costs overflow float64 with these coefficients: a plan of these requests could have cost inf"),
    # an integer too large for a float64 is refused like inf (it passed the range check, then float() raised)
    params_case("cost-param-huge-int", f"Kp_attn = {HUGE}\n",
                f"c.toml:1: field 'Kp_attn': expected a finite non-negative number, got {HUGE_SHOWN}"),
    params_case("cost-param-huge-hidden", f"hidden = {2**40}\n",
                f"c.toml:1: field 'hidden': expected a positive integer up to 1048576, got {2**40}"),
    scenario_case("scenario-limit-huge-int", scenario(f"max_cost = {HUGE}"),
                  f"s.toml:6: field 'bucket.max_cost': must be a finite non-negative number, got {HUGE_SHOWN}"),
    scenario_case("scenario-inline-device-huge-int",
                  scenario(top=f"max_shapes = 8\n[device]\nprefill = [1, 1, 1]\ndecode = [1, 1, 1]\ncompile_ms = {HUGE}"),
                  f"s.toml:5: field 'device.compile_ms': must be a finite non-negative number, got {HUGE_SHOWN}"),
    scenario_case("scenario-device-file-huge-int", scenario(top='max_shapes = 8\ndevice = "p.toml"'),
                  f"p.toml:2: field 'device.prefill': value 3 of [p0, p1, p2] must be a finite non-negative number, "
                  f"got {HUGE_SHOWN}").with_files({"p.toml": f"[device]\nprefill = [1, 1, {HUGE}]\ndecode = [1, 1, 1]\n"
                                                            "compile_ms = 1\n"}),
    scenario_case("scenario-400-digit-max-shapes", scenario(top=f"max_shapes = {HUGE}"),
                  f"s.toml:1: field 'max_shapes': must be at most 16384, got {HUGE_SHOWN}"),
    # numeric flags: ASCII digits only, one line naming the flag (argparse's int()/float() read 1_0 as 10)
    solve_case("flag-underscore-digits", "req.jsonl", GOOD, "--max-cost: expected a number, got '1_0'",
               "--max-cost", "1_0", loader=False),
    solve_case("flag-arabic-digits", "req.jsonl", GOOD, "--limit-shapes: expected an integer, got '\u0664'",
               "--limit-shapes", "\u0664", loader=False),
    solve_case("time-column-empty", "req.jsonl", GOOD, "--time-column: expected a column name, got ''",
               "--time-column=", loader=False),
    solve_case("columns-empty", "req.jsonl", GOOD,
               "--columns: expected a preset (default, azure) or PROMPT,GEN[,ID], got ''", "--columns=", loader=False),
    sweep_case("sweep-empty-factors", "--factors: expected positive numbers, got ''", "--sweep-limit", "max_cost",
               "--max-cost", "1e30", "--factors="),
    solve_case("flag-not-a-number", "req.jsonl", GOOD, "--time-limit: expected a number, got 'soon'",
               "--time-limit", "soon", loader=False),
    solve_case("limit-flag-inf", "req.jsonl", GOOD, "--max-sequential-ms: must be a finite non-negative number, got inf",
               "--max-sequential-ms", "inf", loader=False),
    scenario_case("scenario-limit-inf", scenario("max_cost = inf"),
                  "s.toml:6: field 'bucket.max_cost': must be a finite non-negative number, got inf"),
    scenario_case("scenario-limit-nan", scenario("max_p95_latency_ms = nan"),
                  "s.toml:6: field 'bucket.max_p95_latency_ms': must be a finite non-negative number, got nan"),
    solve_case("huge-max-batch-size", "req.jsonl", GOOD, f"--max-batch-size: must be at most 2147483647, got {10**20}",
               "--max-batch-size", str(10**20), loader=False),
    solve_case("zero-max-batch-size", "req.jsonl", GOOD, "--max-batch-size: must be a positive integer, got 0",
               "--max-batch-size", "0", loader=False),
    solve_case("huge-limit-shapes", "req.jsonl", GOOD, f"--limit-shapes: must be at most 16384, got {10**20}",
               "--limit-shapes", str(10**20), loader=False),
    solve_case("huge-max-seq-len", "req.jsonl", GOOD, f"--max-seq-len: must be at most 1048576, got {64 * 2**64}",
               "--max-seq-len", str(64 * 2**64), loader=False),
    scenario_case("scenario-huge-max-shapes", scenario(top="max_shapes = 9223372036854775807"),
                  "s.toml:1: field 'max_shapes': must be at most 16384, got 9223372036854775807"),
    scenario_case("scenario-huge-max-seq-len", scenario(top="max_shapes = 8\nmax_seq_len = 1048640"),
                  "s.toml:2: field 'max_seq_len': must be at most 1048576, got 1048640"),
    scenario_case("scenario-huge-max-batch-size", scenario(top="max_shapes = 8\nmax_batch_size = 2147483648"),
                  "s.toml:2: field 'max_batch_size': must be at most 2147483647, got 2147483648"),
    Case("evaluation-overflows-float64", {"req.jsonl": GOOD, "plan.jsonl": shape_plan(
        '{"seq_align": 1048576, "heads_align": 32, "hidden_align": 4096}').replace('"seq_align": 128', '"seq_align": 1048576'),
        "c.toml": "Kshape_attn = 1e300\n"}, ("req.jsonl", "plan.jsonl", "--cost-params", "c.toml"),
         "plan.jsonl: costs overflow float64 with these coefficients: bucket req has cost inf", module="evaluate", loader=False),
    eval_case("plan-seq-align-huge", shape_plan('{"seq_align": 4611686018427387904, "heads_align": 32, "hidden_align": 4096}'),
              "plan.jsonl:2: field 'shape.seq_align': must be at most 1048576, got 4611686018427387904"),
    # bucket names become plan file names: only plain ones (nothing may be written outside --out)
    scenario_case("name-escapes-out", named('"x/../../victim/out/plan_b1"'),
                  f"s.toml:4: field 'bucket.name': bucket name 'x/../../victim/out/plan_b1' {NAME_RULE}"),
    scenario_case("name-with-slash", named('"sub/b1"'), f"s.toml:4: field 'bucket.name': bucket name 'sub/b1' {NAME_RULE}"),
    scenario_case("name-dot-dot", named('".."'), f"s.toml:4: field 'bucket.name': bucket name '..' {NAME_RULE}"),
    scenario_case("name-absolute", named('"/tmp/evil"'),
                  f"s.toml:4: field 'bucket.name': bucket name '/tmp/evil' {NAME_RULE}"),
    scenario_case("name-hidden", named('".b1"'), f"s.toml:4: field 'bucket.name': bucket name '.b1' {NAME_RULE}"),
    scenario_case("name-nul-byte", named('"b\\u0000x"'),
                  f"s.toml:4: field 'bucket.name': bucket name 'b\\x00x' {NAME_RULE}"),
    scenario_case("name-too-long", named('"' + "n" * 101 + '"'),
                  f"s.toml:4: field 'bucket.name': bucket name '{'n' * 101}' {NAME_RULE}"),
    solve_case("file-name-not-plain", "my plan.jsonl", GOOD,
               f"my plan.jsonl: bucket name 'my plan' taken from this file's name {NAME_RULE}{FILE_NAME_HINT}"),
    solve_case("file-name-hidden", ".req.jsonl", GOOD,
               f".req.jsonl: bucket name '.req' taken from this file's name {NAME_RULE}{FILE_NAME_HINT}"),
    # text that is not Unicode, types that are not ids or lengths: one line, never a traceback
    solve_case("lone-surrogate-id", "bad.jsonl", jsonl(ROW_A, '{"request_id": "\\ud800", "prompt_len": 10, "gen_len": 5}'),
               "bad.jsonl:2: field 'request_id': not valid Unicode (a lone surrogate in '\\ud800')"),
    solve_case("lone-surrogate-key", "bad.jsonl", jsonl('{"request_id": "a", "prompt_len": 10, "gen_len": 5, "\\udfff": 1}'),
               "bad.jsonl:1: key '\\udfff' is not valid Unicode (a lone surrogate)"),
    solve_case("parquet-list-id", "bad.parquet", parquet(request_id=[[1], [1]], prompt_len=[10, 20], gen_len=[5, 6]),
               "bad.parquet:1: field 'request_id': expected a string or integer id, got [1]"),
    solve_case("parquet-struct-id", "bad.parquet", parquet(request_id=[{"a": 1}], prompt_len=[10], gen_len=[5]),
               "bad.parquet:1: field 'request_id': expected a string or integer id, got {'a': 1}"),
    solve_case("parquet-text-length", "bad.parquet", parquet(request_id=["a", "b"], prompt_len=[10, 20], gen_len=["5", "6"]),
               "bad.parquet:1: field 'gen_len': expected an integer, got '5'"),
    solve_case("parquet-bytes-length", "bad.parquet", parquet(request_id=["a"], prompt_len=[b"10"], gen_len=[5]),
               "bad.parquet:1: field 'prompt_len': expected an integer, got b'10'"),
    solve_case("parquet-list-length", "bad.parquet", parquet(request_id=["a"], prompt_len=[[10]], gen_len=[5]),
               "bad.parquet:1: field 'prompt_len': expected an integer, got [10]"),
    solve_case("invalid-utf8-in-a-key", "bad.jsonl", ROW_A.encode() + b'\n{"\xffequest_id": "b", "prompt_len": 1, "gen_len": 1}\n',
               "bad.jsonl:2: not UTF-8 text (byte 0xff at column 3)"),  # found by test_fuzz_input: pyarrow crashed
    solve_case("invalid-utf8-csv", "bad.csv", b"request_id,prompt_len,gen_len\na\xc3,10,5\n",
               "bad.csv:2: not UTF-8 text (byte 0xc3 at column 2)"),
    eval_case("plan-invalid-utf8", GOOD_PLAN.replace('"b-1"', '"b-\udcff"', 1).encode("utf-8", "surrogateescape"),
              "plan.jsonl:1: not UTF-8 text (byte 0xff at column 36)"),
    scenario_case("scenario-nul-in-requests-path", scenario().replace('"req.jsonl"', '"req\\u0000.jsonl"'),
                  "req\\x00.jsonl: cannot read: embedded null byte"),
    scenario_case("scenario-nul-in-device-path", scenario(top='max_shapes = 8\ndevice = "p\\u0000.toml"'),
                  "p\\x00.toml: cannot read: embedded null byte"),
    scenario_case("scenario-newline-in-requests-path", scenario().replace('"req.jsonl"', '"a\\nb.jsonl"'),
                  "a\\nb.jsonl: cannot read: No such file or directory"),  # still one line
    scenario_case("scenario-columns-not-a-string", scenario('columns = ["azure"]'),
                  "s.toml:6: field 'bucket.columns': expected a non-empty string, got ['azure']"),
    scenario_case("scenario-bucket-not-a-table", "max_shapes = 8\nbucket = [1]\n",
                  "s.toml:2: field 'bucket': at least one [[bucket]] table is required"),
    # lengths are integers as written: no text, no exponent (12.0 is accepted: see test_load)
    solve_case("length-text-12", "bad.jsonl", jsonl(ROW_A, '{"request_id": "b", "prompt_len": "12", "gen_len": 5}'),
               "bad.jsonl:2: field 'prompt_len': expected an integer, got '12'"),
    solve_case("length-exponent", "bad.jsonl", jsonl(ROW_A, '{"request_id": "b", "prompt_len": 1e3, "gen_len": 5}'),
               "bad.jsonl:2: field 'prompt_len': expected an integer, got 1e3"),
    solve_case("length-exponent-fraction", "bad.jsonl", jsonl('{"request_id": "b", "prompt_len": 10, "gen_len": 1.5E1}'),
               "bad.jsonl:1: field 'gen_len': expected an integer, got 1.5E1"),
    solve_case("id-exponent", "bad.jsonl", jsonl(ROW_A, '{"request_id": 1e3, "prompt_len": 10, "gen_len": 5}'),
               "bad.jsonl:2: field 'request_id': expected a string or integer id, got 1e3"),
    solve_case("csv-exponent", "bad.csv", "request_id,prompt_len,gen_len\na,10,5\nb,1e3,5\n",
               "bad.csv:3: field 'prompt_len': expected an integer, got '1e3'"),
    solve_case("csv-leading-space", "bad.csv", "request_id,prompt_len,gen_len\na,10,5\nb,10, 12\n",
               "bad.csv:3: field 'gen_len': expected an integer, got ' 12'"),
    solve_case("csv-fraction", "bad.csv", "request_id,prompt_len,gen_len\na,10.5,5\n",
               "bad.csv:2: field 'prompt_len': expected an integer, got '10.5'"),
    solve_case("csv-plus-sign", "bad.csv", "request_id,prompt_len,gen_len\na,+10,5\n",
               "bad.csv:2: field 'prompt_len': expected an integer, got '+10'"),
    solve_case("csv-empty-cell", "bad.csv", "request_id,prompt_len,gen_len\na,10,5\nb,,5\n",
               "bad.csv:3: field 'prompt_len': missing"),
    # a key given twice in one record (JSON leaves it open; Python kept the last) is refused everywhere
    solve_case("duplicate-key", "bad.jsonl", jsonl(ROW_A, '{"request_id": "b", "prompt_len": 10, "gen_len": 5, "gen_len": 6}'),
               "bad.jsonl:2: field 'gen_len': duplicate key: given twice in one record"),
    solve_case("duplicate-unknown-key", "bad.jsonl", jsonl('{"request_id": "b", "x": 1, "prompt_len": 10, "x": 2, "gen_len": 5}'),
               "bad.jsonl:1: field 'x': duplicate key: given twice in one record"),
    eval_case("plan-duplicate-key", GOOD_PLAN.replace('"batch_id": "b-1"', '"batch_id": "b-1", "batch_id": "b-2"', 1),
              "plan.jsonl:1: field 'batch_id': duplicate key: given twice in one record"),
    eval_case("plan-duplicate-shape-key", shape_plan('{"seq_align": 128, "seq_align": 192, "heads_align": 32, "hidden_align": 4096}'),
              "plan.jsonl:2: field 'seq_align': duplicate key: given twice in one record"),
    eval_case("plan-lone-surrogate-id", GOOD_PLAN.replace('"request_id": "b"', '"request_id": "\\ud800"'),
              "plan.jsonl:2: field 'request_id': not valid Unicode (a lone surrogate in '\\ud800')"),
    # the sweep checks its flags before loading, solving or writing anything
    sweep_case("sweep-negative-tolerance", "--tolerance: must be a finite non-negative share, got -1.0", "--tolerance", "-1"),
    sweep_case("sweep-nan-tolerance", "--tolerance: must be a finite non-negative share, got nan", "--tolerance", "nan"),
    sweep_case("sweep-report-is-a-file", "--report: rep.txt is a file; give a folder for report.md, report.html and the PNGs",
               "--report", "rep.txt", files={"rep.txt": "not a folder\n"}),
    sweep_case("sweep-out-is-a-folder", "--out: out is a folder; give the path of the CSV file to write", "--out", "out"),
    sweep_case("sweep-out-below-a-file", "--out: rep.txt is not a folder", "--out", "rep.txt/sweep.csv",
               files={"rep.txt": "a file\n"}),
    sweep_case("sweep-empty-k", "--k: expected K values like 1-16 or 2,4,8, got ''", "--k="),
    sweep_case("sweep-huge-k", "--k: K must be at most 16384, got 100000", "--k", "1-100000"),
    sweep_case("sweep-factors-without-limit", "--factors: needs --sweep-limit (the limit the factors scale)",
               "--factors", "0.5,1"),
    sweep_case("sweep-bad-tolerance-before-bad-input", "--tolerance: must be a finite non-negative share, got inf",
               "--tolerance", "inf", "--scenario", "missing.toml"),
    # plan files (evaluate)
    eval_case("plan-shape-keys", shape_plan('{"seq_align": 128, "heads": 32, "hidden_align": 4096}'),
              "plan.jsonl:2: field 'shape': must hold exactly seq_align, heads_align, hidden_align "
              "(missing heads_align; unexpected heads)"),
    eval_case("plan-heads-align", shape_plan('{"seq_align": 128, "heads_align": 16, "hidden_align": 4096}'),
              "plan.jsonl:2: field 'shape.heads_align': must be 32, got 16"),
    eval_case("plan-heads-align-float", shape_plan('{"seq_align": 128, "heads_align": 32.0, "hidden_align": 4096}'),
              "plan.jsonl:2: field 'shape.heads_align': must be 32, got 32.0"),
    eval_case("plan-seq-align-not-64", shape_plan('{"seq_align": 100, "heads_align": 32, "hidden_align": 4096}'),
              "plan.jsonl:2: field 'shape.seq_align': must be a positive multiple of 64, got 100"),
    eval_case("plan-malformed-json", GOOD_PLAN.splitlines()[0] + "\n\n{nope\n",
              "plan.jsonl:3: malformed JSON: Expecting property name enclosed in double quotes (column 2)"),
    eval_case("plan-missing-batch-id", GOOD_PLAN + '{"request_id": "c", "shape": {}}\n',
              "plan.jsonl:3: field 'batch_id': missing"),
    eval_case("plan-empty", "", "plan.jsonl: empty plan"),
    Case("evaluate-odd-pairs", {"req.jsonl": GOOD}, ("req.jsonl",),
         "<command line>: expected REQUESTS PLAN pairs (an even number of paths)", module="evaluate", loader=False),
]

MODULES = {"solve": solve.main, "evaluate": evaluate.main, "sweep": sweep.main}


def lay_out(tmp: Path, case: Case) -> dict[str, bytes]:
    """Write the case's files and a pre-existing plan; return every file's bytes for comparison."""
    for name, content in case.files.items():
        path = tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content.encode() if isinstance(content, str) else content)
    (tmp / "out").mkdir()
    (tmp / "out" / f"plan_{case.bucket}.jsonl").write_bytes(OLD_PLAN)
    return snapshot(tmp)


def snapshot(tmp: Path) -> dict[str, bytes]:
    """Every file below tmp with its bytes (a new, changed or removed file shows up as a difference)."""
    return {str(p.relative_to(tmp)): p.read_bytes() for p in sorted(tmp.rglob("*")) if p.is_file()}


def run_in_process(case: Case, capsys) -> tuple[int, str]:
    """Exit status and stderr of the entry point, exactly as ``python -m`` would run it."""
    with pytest.raises(SystemExit) as stop:
        run_main(lambda: MODULES[case.module](list(case.argv)))
    return stop.value.code, capsys.readouterr().err


def run_subprocess(case: Case, cwd: Path) -> tuple[int, str]:
    """Exit status and stderr of ``python -m model.<module>`` in a fresh interpreter."""
    done = subprocess.run([sys.executable, "-m", f"model.{case.module}", *case.argv], cwd=cwd,
                          capture_output=True, text=True, timeout=120)
    return done.returncode, done.stderr


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_in_process(case: Case, tmp_path: Path, monkeypatch, capsys):
    before = lay_out(tmp_path, case)
    monkeypatch.chdir(tmp_path)
    status, err = run_in_process(case, capsys)
    assert (status, err) == (2, f"error: {case.error}\n")
    assert snapshot(tmp_path) == before


SMOKE = {"malformed-json", "plan-seq-align-not-64"}  # a real process for solve and for evaluate; the rest in process


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id, marks=() if c.id in SMOKE else pytest.mark.slow)
                                  for c in CASES])
def test_bad_input_subprocess(case: Case, tmp_path: Path):
    before = lay_out(tmp_path, case)
    status, err = run_subprocess(case, tmp_path)
    assert (status, err) == (2, f"error: {case.error}\n")
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("case", [c for c in CASES if c.loader], ids=[c.id for c in CASES if c.loader])
def test_loader_raises_the_same_line(case: Case, tmp_path: Path, monkeypatch):
    lay_out(tmp_path, case)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError) as exc:
        load_requests(case.argv[0])
    assert str(exc.value) == case.error
    assert "\n" not in str(exc.value)


def test_the_harness_writes_when_input_is_good(tmp_path: Path, monkeypatch, capsys):
    """The same command on good input exits 0 and replaces the old plan: the checks above can fail."""
    case = solve_case("good", "req.jsonl", GOOD, "")
    before = lay_out(tmp_path, case)
    monkeypatch.chdir(tmp_path)
    status, err = run_in_process(case, capsys)
    assert (status, err) == (0, "")
    after = snapshot(tmp_path)
    assert after["out/plan_req.jsonl"] != before["out/plan_req.jsonl"]
    assert set(after) == set(before)


def test_evaluate_harness_accepts_a_good_plan(tmp_path: Path, monkeypatch, capsys):
    case = eval_case("good", GOOD_PLAN, "")
    lay_out(tmp_path, case)
    monkeypatch.chdir(tmp_path)
    status, err = run_in_process(case, capsys)
    assert (status, err) == (0, "")
