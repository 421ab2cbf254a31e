"""Serving-stack formats: the documented examples, export-then-import round trips, rounding warnings,
hostile input (always an InputError naming file, line and field), and ``python -m model.export`` end to end.
"""

from __future__ import annotations

import ast
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from model import export
from model.base.errors import InputError
from model.deploy.graph_check import GraphCheck
from model.load.plans import read_plan
from model.load.requests import MAX_LEN, load_requests
from model.serving.formats import READERS, WRITERS, compile_config, planned, read_shapes, render
from model.serving.gaudi import exp_ladder, lin_ladder
from model.serving.graphs import Graph
from model.serving.neuron import nxdi_default
from model.serving.parse import MAX_BUCKETS
from model.serving.settings import parse_flag
from model.serving.spec import ExportSpec, ShapeUse, align
from model.serving.tpu import tpu_ladder

REPO = Path(__file__).resolve().parent.parent
SCENARIO = Path("data") / "default" / "scenario.toml"
SETTINGS = settings(max_examples=30, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def put(folder: Path, name: str, content: str | bytes) -> Path:
    """A file with exactly this content (bytes are written as they are)."""
    path = folder / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


def read_back(folder: Path, fmt: str, spec: ExportSpec, max_model_len: int | None = None):
    """Export spec as fmt, then import the file again."""
    path = put(folder, f"export.{fmt}", render(fmt, spec))
    return read_shapes(path, fmt, max_model_len)


def refused(path: Path, fmt: str, max_model_len: int | None = None, settings=None) -> InputError:
    """The InputError reading path raises (the test fails if it raises nothing or anything else)."""
    with pytest.raises(InputError) as exc:
        read_shapes(path, fmt, max_model_len, settings)
    assert exc.value.file == str(path)
    assert "\n" not in exc.value.render()
    return exc.value


# ---------------------------------------------------------------- the documented examples


def test_gaudi_lin_doc_example_and_its_rounding_warning(tmp_path: Path):
    """MIN 2, STEP 32, MAX 64 -> 2, 4, 8, 16, 32, 64; at 64-token granularity that is one shape."""
    assert lin_ladder(2, 32, 64) == [2, 4, 8, 16, 32, 64]
    path = put(tmp_path, "gaudi.env", "VLLM_BUCKETING_STRATEGY=lin\nexport VLLM_PROMPT_QUERY_BUCKET_MIN=2\n"
               "VLLM_PROMPT_QUERY_BUCKET_STEP=32\nVLLM_PROMPT_QUERY_BUCKET_MAX=64  # doc example\n")
    got = read_shapes(path, "gaudi-env")
    assert got.shapes == (64,)
    assert got.rounded == ((2, 64), (4, 64), (8, 64), (16, 64), (32, 64))
    assert "2 -> 64" in got.warning() and "32 -> 64" in got.warning() and str(path) in got.warning()


def test_gaudi_legacy_seq_names_and_the_deprecated_exponential_switch(tmp_path: Path):
    """Legacy VLLM_PROMPT_SEQ_BUCKET_* work; VLLM_EXPONENTIAL_BUCKETING=false forces lin over exp."""
    path = put(tmp_path, "g.env", "VLLM_BUCKETING_STRATEGY=exp\nVLLM_EXPONENTIAL_BUCKETING=false\n"
               "VLLM_PROMPT_SEQ_BUCKET_MIN=128\nVLLM_PROMPT_SEQ_BUCKET_STEP=256\nVLLM_PROMPT_SEQ_BUCKET_MAX=1024\n")
    assert read_shapes(path, "gaudi-env").shapes == (128, 256, 512, 768, 1024)


def test_gaudi_exp_strategy_follows_todays_rule_and_warns_about_what_it_ignores(tmp_path: Path):
    """vllm-gaudi's own docstring example; since October 2025 exp's query range runs up to the token budget
    (max_num_batched_tokens) with ceil(log2) points, and the user's bucket values are overwritten."""
    assert exp_ladder(128, 128, 2048, 10) == [128, 256, 384, 512, 640, 896, 1152, 1536, 2048]
    path = put(tmp_path, "g.env", "VLLM_PROMPT_QUERY_BUCKET_MIN=64\nMAX_NUM_BATCHED_TOKENS=2048\nMAX_MODEL_LEN=4096\n")
    got = read_shapes(path, "gaudi-env")  # exp is the default
    assert got.shapes == tuple(exp_ladder(128, 128, 2048, 11)) == (128, 256, 384, 512, 768, 896, 1280, 1664, 2048)
    assert any("overwrites VLLM_PROMPT_QUERY_BUCKET_MIN" in w for w in got.warnings())
    bare = put(tmp_path, "bare.env", "VLLM_BUCKETING_STRATEGY=exp\n")
    budget = parse_flag("max_num_batched_tokens=2048")
    assert read_shapes(bare, "gaudi-env", max_model_len=4096, settings=budget).shapes == got.shapes
    err = refused(bare, "gaudi-env", max_model_len=4096)
    assert err.field == "max_num_batched_tokens" and "--server-settings" in err.message


def test_gaudi_bucket_file_doc_example_ranges_and_decode_lines(tmp_path: Path):
    """Lists expand to the product; decode tuples (middle 1) are not shapes; range() is recognised."""
    doc = ("# prompt: (batch, query_len, ctx_blocks)\n([1, 2, 4], [128, 256, 512, 1024, 2048], 0)\n"
           "# decode: (batch, 1, total KV blocks)\n([1, 2, 4, 8, 16, 32], 1, [8, 16, 32, 64, 128, 256])\n")
    assert read_shapes(put(tmp_path, "doc.txt", doc), "gaudi-file").shapes == (128, 256, 512, 1024, 2048)
    ranged = ("# setting: VLLM_PROMPT_BS_BUCKET_MAX=2\n"
              "(1, range(128, 1025, 128), 0)\n(range(1, 5), 1, range(8, 64, 8))\n(2, [1, 100], range(0, 3))\n")
    got = read_shapes(put(tmp_path, "r.txt", ranged), "gaudi-file")
    assert got.shapes == (128, 256, 384, 512, 640, 768, 896, 1024) and got.rounded == ((100, 128),)


def test_gaudi_bucket_file_doc_example_compiles_42_graphs_under_its_settings(tmp_path: Path):
    """By vllm-gaudi's filters, worked by hand: with VLLM_PROMPT_BS_BUCKET_MAX 4 and a budget of 8192 all 15
    prompt graphs stay; a decode graph needs a block per sequence and is capped at batch x ceil(4096 / 128)
    blocks, which leaves 3 + 4 + 5 + 6 + 5 + 4 = 27 of the 36 decode tuples; unset, the prefill cap is 1."""
    doc = put(tmp_path, "doc.txt", "([1, 2, 4], [128, 256, 512, 1024, 2048], 0)\n"
                                   "([1, 2, 4, 8, 16, 32], 1, [8, 16, 32, 64, 128, 256])\n")
    settings = parse_flag("VLLM_PROMPT_BS_BUCKET_MAX=4,max_num_batched_tokens=8192,max_model_len=4096")
    graphs = read_shapes(doc, "gaudi-file", settings=settings).graphs
    assert sum(g.kind == "prompt" for g in graphs) == 15 and sum(g.kind == "decode" for g in graphs) == 27
    assert Graph("decode", (1, 1, 32)) in graphs and Graph("decode", (16, 1, 8)) not in graphs
    default = read_shapes(doc, "gaudi-file", settings=parse_flag("max_num_batched_tokens=8192,max_model_len=4096"))
    assert {g.dims[0] for g in default.graphs if g.kind == "prompt"} == {1}
    assert any("VLLM_PROMPT_BS_BUCKET_MAX 1 (its default when unset)" in d.reason for d in default.compiled.dropped)


def test_gaudi_env_can_point_at_a_bucket_file(tmp_path: Path):
    """VLLM_BUCKETING_FROM_FILE wins over the strategy; a relative path is taken from the env file's folder."""
    put(tmp_path, "buckets.txt", "(1, [192, 704, 1536], 0)\n")
    env = put(tmp_path, "g.env", "VLLM_BUCKETING_STRATEGY=exp\nVLLM_BUCKETING_FROM_FILE=buckets.txt\n")
    assert read_shapes(env, "gaudi-env").shapes == (192, 704, 1536)
    missing = put(tmp_path, "m.env", "VLLM_BUCKETING_FROM_FILE=nowhere.txt\n")
    assert (refused(missing, "gaudi-env").line, refused(missing, "gaudi-env").field) == (1, "VLLM_BUCKETING_FROM_FILE")


def test_nxdi_cli_example_and_the_vllm_override_form(tmp_path: Path):
    """The doc's CLI example as NeuronConfig JSON (sorted on load), and nested under override_neuron_config."""
    conf = {"enable_bucketing": True, "context_encoding_buckets": [512, 128, 256],
            "token_generation_buckets": [512, 1024], "seq_len": 1024, "max_context_length": 512}
    assert read_shapes(put(tmp_path, "n.json", json.dumps(conf)), "nxdi").shapes == (128, 256, 512)
    nested = put(tmp_path, "v.json", json.dumps({"override_neuron_config": conf}))
    assert read_shapes(nested, "nxdi").shapes == (128, 256, 512)
    over = put(tmp_path, "o.json", json.dumps({**conf, "max_context_length": 256}))
    err = refused(over, "nxdi")
    assert err.field == "context_encoding_buckets[0]" and "max_context_length 256" in err.message


def test_nxdi_without_lists_uses_its_default_powers_of_two(tmp_path: Path):
    assert nxdi_default(2048) == [128, 256, 512, 1024, 2048]
    on = put(tmp_path, "d.json", '{"neuron_config": {"enable_bucketing": true, "max_context_length": 3000}}')
    assert read_shapes(on, "nxdi").shapes == (128, 256, 512, 1024, 2048, 3008)
    off = put(tmp_path, "off.json", '{"max_context_length": 1024}')
    assert read_shapes(off, "nxdi").shapes == (1024,)


def test_vllm_neuron_largest_buckets_must_equal_the_maxima(tmp_path: Path):
    """The doc's --additional-config object; a largest bucket that is not the maximum is refused."""
    conf = {"neuron_config": {"num_batched_tokens_buckets": [1024, 256, 512], "num_seqs_buckets": [1, 8]}}
    assert read_shapes(put(tmp_path, "a.json", json.dumps(conf)), "vllm-neuron").shapes == (256, 512, 1024)
    wrong = put(tmp_path, "w.json", json.dumps({**conf, "max_num_batched_tokens": 2048}))
    err = refused(wrong, "vllm-neuron")
    assert err.field == "max_num_batched_tokens" and err.line == 1 and "must equal" in err.message


def test_tpu_doc_example_and_compilation_sizes(tmp_path: Path):
    """max 512, gap 64 -> 16, 32, 64, 128, 192, ..., 512; gap 0 -> powers of two; extra sizes are added.  The
    ladder runs up to the token budget (MAX_NUM_BATCHED_TOKENS), not the model length."""
    assert tpu_ladder(64, 512) == [16, 32, 64, 128, 192, 256, 320, 384, 448, 512]
    assert tpu_ladder(0, 512) == [16, 32, 64, 128, 256, 512]
    path = put(tmp_path, "t.env", "VLLM_TPU_BUCKET_PADDING_GAP=64\nMAX_NUM_BATCHED_TOKENS=512\nMAX_MODEL_LEN=4096\n")
    got = read_shapes(path, "vllm-tpu")
    assert got.shapes == tuple(range(64, 513, 64)) and got.rounded == ((16, 64), (32, 64))
    assert len(got.graphs) == 10  # one graph per padding, 16 and 32 included
    extra = put(tmp_path, "e.env", 'VLLM_TPU_BUCKET_PADDING_GAP=0\nCOMPILATION_SIZES="704,1216"\n')
    budget = parse_flag("max_num_batched_tokens=2048")
    assert read_shapes(extra, "vllm-tpu", settings=budget).shapes == (64, 128, 256, 512, 704, 1024, 1216, 2048)
    old = put(tmp_path, "old.env", "VLLM_TPU_BUCKET_PADDING_GAP=64\nMAX_MODEL_LEN=512\n")
    assert refused(old, "vllm-tpu").field == "MAX_NUM_BATCHED_TOKENS"


def test_rounding_up_names_every_length_that_moved(tmp_path: Path):
    got = read_shapes(put(tmp_path, "l.txt", "100, 128,\n130\n# comment\n64\n"), "list")
    assert got.shapes == (64, 128, 192)
    assert got.rounded == ((100, 128), (130, 192))
    assert "100 -> 128" in got.warning() and "130 -> 192" in got.warning()
    assert read_shapes(put(tmp_path, "k.txt", "64\n"), "list").warning() is None


# ---------------------------------------------------------------- round trips

shape_sets = st.lists(st.integers(1, 48), min_size=1, max_size=10, unique=True).map(
    lambda ks: tuple(sorted(64 * k for k in ks)))


@st.composite
def specs(draw) -> ExportSpec:
    """Shapes with random batch sizes and, sometimes, contexts per batch size: what plans and requests give."""
    shapes = draw(shape_sets)
    with_contexts = draw(st.booleans())
    uses = []
    for s in shapes:
        sizes = tuple(sorted(draw(st.sets(st.integers(1, 64), min_size=1, max_size=5))))
        per = tuple(s + draw(st.integers(1, 2000)) for _ in sizes) if with_contexts else ()
        uses.append(ShapeUse(s, sizes, max(per) if per else None, per))
    return ExportSpec(tuple(uses), draw(st.sampled_from([16, 64, 128])), None)


def ladder_spec(ladder: list[int]) -> ExportSpec:
    """Every shape at batch 1, its context twice the shape: a set gaudi-env's lin product makes exactly."""
    return ExportSpec(tuple(ShapeUse(s, (1,), 2 * s, (2 * s,)) for s in ladder))


def check_round_trip(folder: Path, fmt: str, spec: ExportSpec) -> None:
    """Every export that is written reads back, via --shapes-from and via --check, to exactly the plans' graphs;
    one that is refused names the reason and what to do instead."""
    try:
        text = render(fmt, spec)
    except InputError as exc:
        assert "\n" not in exc.render() and ("--format" in exc.message or "--scenario" in exc.message), exc.render()
        return
    path = put(folder, f"export.{fmt}", text)
    got = read_shapes(path, fmt)
    assert got.shapes == spec.shapes and got.rounded == ()
    assert got.graphs == planned(fmt, spec) and not got.compiled.dropped
    check = GraphCheck(str(path), fmt, compile_config(path, fmt), planned(fmt, spec))
    assert check.ok and not check.missing and not check.extra


@SETTINGS
@given(spec=specs())
@example(spec=ExportSpec.of_shapes([192, 704, 1536]))
@example(spec=ExportSpec.of_shapes([64]))
@example(spec=ExportSpec.of_shapes([128, 256, 512, 1024, 2048]))
@example(spec=ExportSpec.of_shapes([MAX_LEN]))
@example(spec=ladder_spec([128, 256, 512, 1024]))
@example(spec=ExportSpec((ShapeUse(256, (4,), 300, (300,)), ShapeUse(704, (4,), 1000, (1000,)))))
def test_export_then_import_gives_back_the_graphs_in_every_format(tmp_path: Path, spec: ExportSpec):
    for fmt in WRITERS:
        check_round_trip(tmp_path, fmt, spec)


@SETTINGS
@given(lo=st.integers(1, 16), step=st.integers(1, 24), hi=st.integers(1, 64))
@example(lo=2, step=8, hi=16)  # 128, 256, 512, 1024: pure doubling
def test_every_lin_ladder_is_accepted_by_gaudi_env_and_comes_back_exactly(tmp_path: Path, lo, step, hi):
    """The shape sets gaudi-env accepts are the lin ladders; each one round-trips (batch 1, contexts whose
    decode blocks form a ladder too)."""
    ladder = lin_ladder(64 * lo, 64 * step, 64 * max(lo, hi))
    assume(ladder)  # MIN above every STEP multiple up to MAX: vllm-gaudi makes no bucket either
    got = read_back(tmp_path, "gaudi-env", ladder_spec(ladder))
    assert got.shapes == tuple(ladder) and got.graphs == planned("gaudi-env", ladder_spec(ladder))


def test_arbitrary_sets_are_refused_by_gaudi_env_with_one_line_naming_gaudi_file():
    with pytest.raises(InputError) as exc:
        render("gaudi-env", ExportSpec.of_shapes([192, 704, 1536]))
    assert "gaudi-file" in exc.value.render() and "\n" not in exc.value.render()


def test_gaudi_file_export_lists_exactly_the_pairs_and_decode_blocks(tmp_path: Path):
    """Prompt lines carry each shape's own batch sizes; decode blocks are n * ceil(context / block size)."""
    spec = ExportSpec((ShapeUse(256, (1, 4), 300), ShapeUse(704, (2,), 1000)), 128, None)
    text = render("gaudi-file", spec)
    tuples = [ast.literal_eval(line) for line in text.splitlines() if line and not line.startswith("#")]
    assert ([1, 4], 256, 0) in tuples and (2, 704, 0) in tuples
    assert (1, 1, 3) in tuples and (4, 1, 12) in tuples and (2, 1, 16) in tuples
    assert "range(" not in text


def test_every_format_has_a_reader_and_a_writer():
    assert set(READERS) == set(WRITERS) >= {"list", "gaudi-env", "gaudi-file", "nxdi", "vllm-neuron",
                                             "vllm-tpu", "json"}


# ---------------------------------------------------------------- hostile input

HOSTILE = [
    # (format, content, line, field, words in the message)
    ("nxdi", '{"context_encoding_buckets": [128, 256,}', 1, None, "malformed JSON"),
    ("gaudi-env", "[bucketing]\nVLLM_PROMPT_QUERY_BUCKET_MIN = 128\n", 1, None, "NAME=value"),
    ("vllm-tpu", 'MAX_MODEL_LEN=512\nVLLM_TPU_BUCKET_PADDING_GAP="64\n', 2, "VLLM_TPU_BUCKET_PADDING_GAP", "quote"),
    ("nxdi", '{"neuron_config": {\n "context_encoding_buckets": [128],\n "context_encoding_buckets": [256]}}',
     3, "context_encoding_buckets", "duplicate key"),
    ("json", '{"shapes": [64], "shapes": [128]}', 1, "shapes", "duplicate key"),
    ("gaudi-env", "VLLM_BUCKETING_STRATEGY=lin\nVLLM_BUCKETING_STRATEGY=exp\n", 2, "VLLM_BUCKETING_STRATEGY", "twice"),
    ("list", "128\n256, abc\n", 2, "length", "integer"),
    ("list", "128\n1.5e3\n", 2, "length", "integer"),
    ("nxdi", '{"context_encoding_buckets": [\n  128,\n  256.5\n]}', 3, "context_encoding_buckets[1]", "integer"),
    ("list", "64\n-64\n", 2, "length", "positive"),
    ("list", "0\n", 1, "length", "positive"),
    ("json", '{"shapes": [64, 0]}', 1, "shapes[1]", "positive"),
    ("vllm-neuron", '{"neuron_config": {"num_batched_tokens_buckets": [-128]}}', 1,
     "neuron_config.num_batched_tokens_buckets[0]", "positive"),
    ("nxdi", '{"context_encoding_buckets": [128, NaN]}', 1, "context_encoding_buckets[1]", "NaN"),
    ("json", '{"shapes": [\n64,\nInfinity]}', 3, "shapes[1]", "Infinity"),
    ("list", "64\ninf\n", 2, "length", "integer"),
    ("json", '{"shapes": [true]}', 1, "shapes[0]", "true"),
    ("gaudi-file", "(True, 128, 0)\n", 1, "batch", "integer"),
    ("nxdi", '{"enable_bucketing": "yes", "max_context_length": 128}', 1, "enable_bucketing", "true or false"),
    ("list", f"64\n{MAX_LEN + 1}\n", 2, "length", "2**20"),
    ("list", "99999999999999999999999999\n", 1, "length", "2**20"),
    ("json", '{"shapes": [64, ' + "9" * 40 + "]}", 1, None, "too large"),
    ("vllm-tpu", f"MAX_MODEL_LEN={2 ** 21}\n", 1, "MAX_MODEL_LEN", "2**20"),
    ("gaudi-file", "(1, range(0, 1000000000000, 1), 0)\n", 1, "range", "refused before expanding"),
    ("gaudi-file", "# fine\n(1, range(0, 10**12, 1), 0)\n", 2, "range", "literal integers"),
    ("gaudi-file", "(range(1, 1000), range(64, 640000, 64), range(0, 1000))\n", 1, None, "refused before expanding"),
    ("gaudi-file", "(1, 128, 0)\n" * 3 + "(range(1, 50001), 256, [0, 1])\n", 4, None, "refused before expanding"),
    ("gaudi-env", ("VLLM_BUCKETING_STRATEGY=lin\nVLLM_PROMPT_QUERY_BUCKET_MIN=1\nVLLM_PROMPT_QUERY_BUCKET_STEP=1\n"
                   f"VLLM_PROMPT_QUERY_BUCKET_MAX={MAX_LEN}\n"), 3, "VLLM_PROMPT_QUERY_BUCKET_STEP",
     f"at most {MAX_BUCKETS}"),
    ("vllm-tpu", f"VLLM_TPU_BUCKET_PADDING_GAP=1\nMAX_NUM_BATCHED_TOKENS={MAX_LEN}\n", 1,
     "VLLM_TPU_BUCKET_PADDING_GAP", f"at most {MAX_BUCKETS}"),
    ("gaudi-file", "(1, '128', 0)\n", 1, None, "strings"),
    ("gaudi-file", "(1, 128)\n", 1, None, "3-tuple"),
    ("gaudi-file", "(1, [], 0)\n", 1, "query_len", "empty list"),
    ("gaudi-file", "(1, __import__('os'), 0)\n", 1, None, "strings"),
    ("gaudi-file", "(1, open, 0)\n", 1, None, "literal"),
    ("gaudi-file", "(" * 40_000 + ")" * 40_000 + "\n", 1, None, "literal"),
    ("gaudi-file", "(1, [64, [128]], 0)\n", 1, "query_len", "integer"),
    ("gaudi-env", "VLLM_BUCKETING_STRATEGY=lin\nVLLM_PROMPT_QUERY_BUCKET_MXA=5\n", 2, "VLLM_PROMPT_QUERY_BUCKET_MXA",
     "unknown"),
    ("gaudi-env", "VLLM_BUCKETING_STRATEGY=lin\nVLLM_PROMPT_QUERY_BUCKET_MIN=128\n", None,
     "VLLM_PROMPT_QUERY_BUCKET_MAX", "missing"),
    ("gaudi-env", "VLLM_BUCKETING_STRATEGY=pad\n", 1, "VLLM_BUCKETING_STRATEGY", "pad"),
    ("json", '{"shapes": [64], "extra": 1}', 1, "extra", "unknown key"),
    ("json", "[64, 128]", 1, None, "object"),
    ("json", "[" * 100_000, None, None, "nested too deeply"),
    ("list", "# only a comment\n", None, None, "no sequence lengths"),
    # a truncated bucket file (its comments only) was replayed on run-time compiles alone, exit 0
    ("gaudi-file", "# setting: MAX_NUM_SEQS=64\n# prompt graphs:\n", None, None, "no bucket line"),
]


@pytest.mark.parametrize("fmt, content, line, fld, words", HOSTILE, ids=[f"{h[0]}-{i}" for i, h in enumerate(HOSTILE)])
def test_hostile_input_is_one_input_error_naming_file_line_and_field(tmp_path: Path, fmt, content, line, fld, words):
    err = refused(put(tmp_path, "hostile.cfg", content), fmt)
    assert (err.line, err.field) == (line, fld), err.render()
    assert words in err.message, err.render()


@pytest.mark.parametrize("content, line, words", [
    (b"", None, "empty file"),
    (b"  \n\t\n", None, "empty file"),
    (b"128\n\xff\xfe256\n", 2, "not UTF-8"),
    (b"128\n256\x00\n", 2, "NUL byte"),
])
@pytest.mark.parametrize("fmt", sorted(READERS))
def test_empty_binary_and_undecodable_files_in_every_format(tmp_path: Path, fmt, content, line, words):
    err = refused(put(tmp_path, "bad.cfg", content), fmt)
    assert err.line == line and words in err.message


def test_missing_paths_folders_and_unreadable_files(tmp_path: Path):
    assert "cannot read" in refused(tmp_path / "absent.txt", "list").message
    assert "folder" in refused(tmp_path, "list").message
    locked = put(tmp_path, "locked.txt", "64\n")
    locked.chmod(0)
    try:
        if os.access(locked, os.R_OK):  # root reads anything
            pytest.skip("running as a user who can read a mode-000 file")
        assert "cannot read" in refused(locked, "list").message
    finally:
        locked.chmod(0o644)


def test_max_model_len_bounds_what_is_read(tmp_path: Path):
    path = put(tmp_path, "l.txt", "128\n4096\n")
    err = refused(path, "list", max_model_len=2048)
    assert (err.line, err.field) == (2, "length") and "max_model_len 2048" in err.message
    with pytest.raises(InputError):
        read_shapes(path, "list", max_model_len=0)
    with pytest.raises(InputError, match="unknown format"):
        read_shapes(path, "yaml")


# ---------------------------------------------------------------- python -m model.export end to end


def run(module: str, *argv: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    """A real subprocess importing THIS tree (PYTHONPATH), as a user would run it."""
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", module, *argv], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120, check=False)


@pytest.fixture(scope="module")
def plans_dir(tmp_path_factory) -> Path:
    """Plans of the default scenario written by the greedy packer, through the real CLI."""
    out = tmp_path_factory.mktemp("plans")
    done = run("model.solve", "--solver", "greedy", "--scenario", str(SCENARIO), "--out", str(out), "--quiet")
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def plan_shapes(folder: Path) -> tuple[int, ...]:
    return tuple(sorted({int(s) for f in folder.glob("plan_*.jsonl") for s in read_plan(f).seq_align}))


def expected_uses(folder: Path) -> dict[int, dict[int, int]]:
    """Per shape, per batch size: shape + the longest generation of the plans' batches of that size there,
    computed from scratch."""
    batches: dict[tuple[str, str], list[int]] = {}  # (plan, batch id) -> [shape, size, longest generation]
    for f in sorted(folder.glob("plan_*.jsonl")):
        bucket = load_requests(REPO / SCENARIO.parent / f"requests_{f.stem[len('plan_'):]}.jsonl")
        gen = dict(zip(bucket.request_ids.tolist(), bucket.gen_len.tolist(), strict=True))
        for line in f.read_text().splitlines():
            rec = json.loads(line)
            b = batches.setdefault((f.name, rec["batch_id"]), [rec["shape"]["seq_align"], 0, 0])
            b[1] += 1
            b[2] = max(b[2], gen[rec["request_id"]])
    out: dict[int, dict[int, int]] = {}
    for s, n, g in batches.values():
        per = out.setdefault(s, {})
        per[n] = max(per.get(n, 0), s + g)
    return out


def test_cli_exports_solver_plans_that_read_back_in_every_format(plans_dir: Path, tmp_path: Path, capsys):
    """One real subprocess export, the other formats through the same entry point in-process: each either
    writes exactly the plans' graphs (read back by --shapes-from and by --check) or refuses naming another format."""
    shapes = plan_shapes(plans_dir)
    out = tmp_path / "buckets.txt"
    done = run("model.export", "--plans", str(plans_dir), "--format", "gaudi-file", "--out", str(out),
               "--scenario", str(SCENARIO))
    assert done.returncode == 0, done.stderr
    assert read_shapes(out, "gaudi-file").shapes == shapes
    uses = expected_uses(plans_dir)
    written = set()
    for fmt in sorted(WRITERS):
        target = tmp_path / f"export.{fmt}"
        argv = ["--plans", str(plans_dir), "--format", fmt, "--out", str(target), "--scenario", str(REPO / SCENARIO)]
        try:
            assert export.main(argv) == 0
        except InputError as exc:  # the greedy plans run several batch sizes at shapes that are no lin ladder
            assert fmt in ("gaudi-env", "nxdi", "vllm-neuron") and "--format" in exc.message, exc.render()
            assert not target.exists()
            continue
        written.add(fmt)
        assert read_shapes(target, fmt).shapes == shapes
        capsys.readouterr()
        assert export.main(["--check", str(target), "--format", fmt, "--plans", str(plans_dir), "--scenario",
                            str(REPO / SCENARIO)]) == 0
        assert "OK: the stack compiles exactly the" in capsys.readouterr().out
    assert written >= {"gaudi-file", "json", "list", "vllm-tpu"}
    decode = [ast.literal_eval(x) for x in out.read_text().splitlines() if x and not x.startswith("#")]
    pairs = {(n, b) for n, q, blocks in decode if q == 1 for b in (blocks if isinstance(blocks, list) else [blocks])}
    assert pairs == {(n, n * math.ceil(c / 128)) for per in uses.values() for n, c in per.items()}
    prompts = {q: set(n if isinstance(n, list) else [n]) for n, q, _ in decode if q != 1}
    assert prompts == {s: set(per) for s, per in uses.items()}


def test_cli_bad_input_is_exit_2_one_line_and_leaves_the_old_file(plans_dir: Path, tmp_path: Path, capsys,
                                                                  monkeypatch):
    """Through run_main, as the console script runs it (in-process: a third interpreter start costs ~1.5 s)."""
    out = put(tmp_path, "keep.env", "GOOD=1\n")
    monkeypatch.setattr(sys, "argv", ["shapeplan-export", "--plans", str(plans_dir), "--format", "gaudi-env",
                                      "--out", str(out)])
    with pytest.raises(SystemExit) as done:
        export.entry()
    err = capsys.readouterr().err
    assert done.value.code == 2 and err.count("\n") == 1 and err.startswith("error: ") and "gaudi-file" in err
    assert out.read_text() == "GOOD=1\n" and sorted(p.name for p in tmp_path.iterdir()) == ["keep.env"]


def test_cli_without_requests_exports_only_what_plans_determine(plans_dir: Path, tmp_path: Path, capsys):
    target = tmp_path / "s.json"
    assert export.main(["--plans", str(plans_dir), "--format", "json", "--out", str(target)]) == 0
    data = json.loads(target.read_text())
    assert data["shapes"] == list(plan_shapes(plans_dir)) and data["buckets"] == {} and data["batch_sizes"]
    assert "no --scenario or --requests" in capsys.readouterr().out
    named_by_stem = [str(REPO / SCENARIO.parent / f"requests_{n}.jsonl") for n in ("chat", "short")]
    with pytest.raises(InputError, match="no requests for bucket"):  # requests_chat.jsonl is bucket requests_chat
        export.main(["--plans", str(plans_dir), "--format", "json", "--out", str(target), "--requests",
                     *named_by_stem])
    renamed = [put(tmp_path, f"{n}.jsonl", (REPO / SCENARIO.parent / f"requests_{n}.jsonl").read_text())
               for n in ("chat", "short")]
    assert export.main(["--plans", str(plans_dir), "--format", "json", "--out", str(target), "--requests",
                        *map(str, renamed)]) == 0
    assert json.loads(target.read_text())["buckets"]["context"] == sorted(
        {align(max(per.values())) for per in expected_uses(plans_dir).values()})


@pytest.mark.parametrize("argv, file, words", [
    (["--format", "json", "--max-model-len", "1024"], "--max-model-len", "shorter than"),
    (["--format", "json", "--block-size", "0"], "--block-size", "positive"),
    (["--format", "yaml"], "--format", "unknown format"),
])
def test_cli_option_errors_name_the_option(plans_dir: Path, tmp_path: Path, argv, file, words):
    with pytest.raises(InputError) as exc:
        export.main(["--plans", str(plans_dir), "--out", str(tmp_path / "x"), *argv])
    assert exc.value.file == file and words in exc.value.message
    assert not (tmp_path / "x").exists()


def test_cli_refuses_a_missing_plan_folder_and_a_batch_with_two_shapes(tmp_path: Path):
    with pytest.raises(InputError, match="not a folder"):
        export.main(["--plans", str(tmp_path / "none"), "--format", "json", "--out", str(tmp_path / "o")])
    rec = ('{{"request_id": "{}", "batch_id": "b", '
           '"shape": {{"seq_align": {}, "heads_align": 32, "hidden_align": 4096}}}}\n')
    put(tmp_path, "plan_x.jsonl", rec.format("a", 64) + rec.format("b", 128))
    with pytest.raises(InputError) as exc:
        export.main(["--plans", str(tmp_path), "--format", "json", "--out", str(tmp_path / "o")])
    assert (exc.value.line, exc.value.field) == (2, "shape.seq_align")
