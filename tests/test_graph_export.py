"""Graphs, not shapes (issue 19): exports that are exactly the plan's graphs, ``model.export --check``, imports
by today's rules, the round trips and their two known breaks, the audit's graph count, and the new flags
tried as a hostile user would (one line, exit 2, nothing written)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from helpers import REPO, cli

from model.base.errors import InputError
from model.serving.formats import WRITERS, compile_config, planned, read_shapes, render
from model.serving.graphs import Graph
from model.serving.settings import parse_flag
from model.serving.spec import ExportSpec, ShapeUse

pytestmark = pytest.mark.filterwarnings("ignore:.*PuLP 4.0:DeprecationWarning")

PROFILE = REPO / "data" / "profiles" / "opt13b-a100-tp1.toml"  # compile_ms = 20000
SHAPE = {"heads_align": 32, "hidden_align": 4096}


def write_case(folder: Path, batches: list[tuple[int, int, int, int]], name: str = "r") -> tuple[Path, Path]:
    """A request file and its plan: each (shape, size, prompt, gen) is a batch of ``size`` requests at
    ``shape``, every member with that prompt and generation length."""
    folder.mkdir(parents=True, exist_ok=True)
    requests, plan = [], []
    for b, (shape, size, prompt, gen) in enumerate(batches):
        for i in range(size):
            rid = f"b{b}-{i}"
            requests.append({"request_id": rid, "prompt_len": prompt, "gen_len": gen})
            plan.append({"request_id": rid, "batch_id": f"b{b}", "shape": {"seq_align": shape, **SHAPE}})
    req = folder / f"{name}.jsonl"
    req.write_text("".join(json.dumps(r) + "\n" for r in requests))
    plans = folder / "plans"
    plans.mkdir(exist_ok=True)
    (plans / f"plan_{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in plan))
    return plans, req


def export(tmp_path: Path, *argv: str):
    return cli("model.export", *argv, cwd=tmp_path)


# ---------------------------------------------------------------- what each format writes

ONE_SIZE = ExportSpec((ShapeUse(256, (4,), 300, (300,)), ShapeUse(1024, (4,), 1100, (1100,))), compile_ms=20000.0)


@pytest.mark.parametrize("fmt, words", [
    ("gaudi-file", ["8 graphs (4 prompt, 4 decode)", "warm-up ~ 160 s (8 graphs x 20000 ms compile_ms)",
                    "# setting: MAX_NUM_BATCHED_TOKENS=4096", "# setting: VLLM_PROMPT_BS_BUCKET_MAX=4"]),
    ("nxdi", ["4 graphs (2 context, 2 token-gen)", '"ctx_batch_size": 4', '"max_num_seqs": 4']),
    ("vllm-tpu", ["2 graphs (2 tokens)", "MAX_NUM_BATCHED_TOKENS=1024", "MIN_TOKEN_BUCKET="]),
    ("json", ['"graphs"', '"prompt"']),
])
def test_each_header_says_how_many_graphs_and_the_warm_up(fmt, words):
    spec = ONE_SIZE if fmt != "gaudi-file" else ExportSpec(
        (ShapeUse(256, (1, 4), 300, (290, 300)), ShapeUse(1024, (1, 4), 1100, (1050, 1100))), compile_ms=20000.0)
    text = render(fmt, spec)
    for w in words:
        assert w in text, (w, text)


def test_a_plan_with_one_batch_size_exports_to_nxdi_exactly(tmp_path):
    path = tmp_path / "n.json"
    path.write_text(render("nxdi", ONE_SIZE))
    conf = json.loads(path.read_text())
    assert conf["override_neuron_config"]["token_generation_buckets"] == [320, 1152]
    assert conf["engine_args"] == {"max_num_seqs": 4, "max_model_len": 1152}
    assert compile_config(path, "nxdi").graphs == planned("nxdi", ONE_SIZE) == (
        Graph("context", (4, 256)), Graph("context", (4, 1024)), Graph("token-gen", (4, 320)),
        Graph("token-gen", (4, 1152)))


@pytest.mark.parametrize("fmt, spec, words", [
    ("gaudi-env", ExportSpec((ShapeUse(128, (1,), 256, (256,)), ShapeUse(256, (1, 2), 512, (512, 512)))),
     "lin crosses every batch size with every length, so it would also compile (2, 128)"),
    ("gaudi-file", ExportSpec.of_shapes([128]), "--scenario or --requests"),
    ("nxdi", ExportSpec((ShapeUse(128, (1, 2), 200, (200, 150)),)), "--format gaudi-file"),
    ("vllm-neuron", ExportSpec.of_shapes([192]), "multiples of 128"),
    ("vllm-neuron", ExportSpec((ShapeUse(128, (1,), 200, (200,)),)), "--format nxdi"),
])
def test_a_format_that_cannot_express_the_plan_refuses_with_the_reason_and_the_format_that_can(tmp_path, fmt, spec,
                                                                                                words):
    with pytest.raises(InputError) as exc:
        render(fmt, spec)
    assert words in exc.value.message and "\n" not in exc.value.render()


def test_gaudi_env_writes_lin_only_when_its_product_is_exactly_the_plan(tmp_path):
    """Batch 1 at 128, 256, 512 with contexts 2x: the lin product of 1 x {128, 256, 512} and decode 1 x {2, 4, 8}
    blocks is exactly the six graphs; nothing else is compiled."""
    spec = ExportSpec(tuple(ShapeUse(s, (1,), 2 * s, (2 * s,)) for s in (128, 256, 512)))
    path = tmp_path / "g.env"
    path.write_text(render("gaudi-env", spec))
    assert "VLLM_PROMPT_CTX_BUCKET_MAX=0" in path.read_text() and "VLLM_EXPONENTIAL_BUCKETING" not in "".join(
        line for line in path.read_text().splitlines() if not line.startswith("#"))
    assert compile_config(path, "gaudi-env").graphs == planned("gaudi-env", spec)
    assert len(planned("gaudi-env", spec)) == 6


# ---------------------------------------------------------------- --check


@pytest.fixture
def case(tmp_path):
    """Plans of two shapes and two batch sizes, with their requests, and their gaudi-file export."""
    plans, req = write_case(tmp_path, [(256, 4, 200, 100), (256, 1, 250, 50), (1024, 2, 1000, 20)])
    out = tmp_path / "buckets.txt"
    done = export(tmp_path, "--plans", str(plans), "--format", "gaudi-file", "--out", str(out), "--requests",
                  str(req), "--device-profile", str(PROFILE))
    assert done.returncode == 0, done.stderr
    assert "the stack compiles 6 graphs (3 prompt, 3 decode); warm-up ~ 120 s" in done.stdout
    return plans, req, out


def test_check_of_an_export_lists_its_graphs_and_finds_it_exact(case, tmp_path):
    plans, req, out = case
    done = export(tmp_path, "--check", str(out), "--format", "gaudi-file", "--plans", str(plans), "--requests",
                  str(req))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "the stack compiles 6 graphs (3 prompt, 3 decode)" in done.stdout
    for g in ("prompt (1, 256, 0)", "prompt (4, 256, 0)", "prompt (2, 1024, 0)", "decode (4, 1, 12)",
              "decode (1, 1, 3)", "decode (2, 1, 18)"):
        assert f"  {g}\n" in done.stdout
    assert "OK: the stack compiles exactly the 6 graphs the plans run" in done.stdout
    alone = export(tmp_path, "--check", str(out), "--format", "gaudi-file")
    assert alone.returncode == 0 and "OK" not in alone.stdout and "6 graphs" in alone.stdout


def test_check_names_missing_extra_and_dropped_graphs(case, tmp_path):
    plans, req, out = case
    text = out.read_text().replace("([1, 4], 256, 0)", "(1, 256, 0)\n(8, 64, 0)")
    bad = tmp_path / "bad.txt"
    bad.write_text(text.replace("MAX_NUM_BATCHED_TOKENS=2048", "MAX_NUM_BATCHED_TOKENS=1000"))
    done = export(tmp_path, "--check", str(bad), "--format", "gaudi-file", "--plans", str(plans), "--requests",
                  str(req))
    assert done.returncode == 1
    assert "missing (2; the plans run them, the stack does not compile them): prompt (2, 1024, 0), " \
           "prompt (4, 256, 0)" in done.stdout
    assert "prompt (2, 1024, 0): batch x query_len 2048 over --max-num-batched-tokens 1000" in done.stdout
    assert "prompt (8, 64, 0): batch 8 over VLLM_PROMPT_BS_BUCKET_MAX 4" in done.stdout
    assert "DIFFERENT" in done.stdout
    extra = tmp_path / "extra.txt"
    extra.write_text(out.read_text() + "(1, 512, 0)\n")
    done = export(tmp_path, "--check", str(extra), "--format", "gaudi-file", "--plans", str(plans), "--requests",
                  str(req))
    assert done.returncode == 1 and "extra (1; the stack compiles them, no plan runs them): prompt (1, 512, 0)" \
        in done.stdout


def test_check_without_requests_compares_the_prompt_graphs_only(case, tmp_path):
    plans, _, out = case
    done = export(tmp_path, "--check", str(out), "--format", "gaudi-file", "--plans", str(plans))
    assert done.returncode == 0 and "decode graphs not compared" in done.stdout


def test_check_counts_a_lin_product_by_hand(tmp_path):
    """lin: batch 1, 2 x query 128, 256, 512 x context 0 = 6 prompt graphs, (2, 512) dropped by a budget of 1000;
    decode batch 1, 2 x blocks 4, 8 = 4, capped at batch x ceil(1024 / 128)."""
    env = tmp_path / "lin.env"
    env.write_text("VLLM_BUCKETING_STRATEGY=lin\nVLLM_PROMPT_BS_BUCKET_MIN=1\nVLLM_PROMPT_BS_BUCKET_STEP=2\n"
                   "VLLM_PROMPT_BS_BUCKET_MAX=2\nVLLM_PROMPT_QUERY_BUCKET_MIN=128\nVLLM_PROMPT_QUERY_BUCKET_STEP=512\n"
                   "VLLM_PROMPT_QUERY_BUCKET_MAX=512\nVLLM_PROMPT_CTX_BUCKET_MIN=0\nVLLM_PROMPT_CTX_BUCKET_STEP=1\n"
                   "VLLM_PROMPT_CTX_BUCKET_MAX=0\nVLLM_DECODE_BS_BUCKET_MIN=1\nVLLM_DECODE_BS_BUCKET_STEP=2\n"
                   "VLLM_DECODE_BS_BUCKET_MAX=2\nVLLM_DECODE_BLOCK_BUCKET_MIN=4\nVLLM_DECODE_BLOCK_BUCKET_STEP=8\n"
                   "VLLM_DECODE_BLOCK_BUCKET_MAX=8\nMAX_NUM_BATCHED_TOKENS=1000\nMAX_MODEL_LEN=1024\n")
    done = export(tmp_path, "--check", str(env), "--format", "gaudi-env")
    assert done.returncode == 1  # a graph the settings drop is a difference even without plans
    assert "the stack compiles 9 graphs (5 prompt, 4 decode)" in done.stdout
    assert "prompt (2, 512, 0): batch x query_len 1024 over --max-num-batched-tokens 1000" in done.stdout


# ---------------------------------------------------------------- import by today's rules


def test_gaudi_exp_import_needs_the_token_budget_and_names_it(tmp_path):
    env = tmp_path / "exp.env"
    env.write_text("VLLM_BUCKETING_STRATEGY=exp\nMAX_MODEL_LEN=4096\n")
    done = cli("model.audit", str(REPO / "data" / "default" / "requests_short.jsonl"), "--shapes-from", str(env),
               "--shapes-format", "gaudi-env", "--solver", "greedy", "--quiet", cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "needs --max-num-batched-tokens" in done.stderr and "--server-settings" in done.stderr
    done = cli("model.audit", str(REPO / "data" / "default" / "requests_short.jsonl"), "--shapes-from", str(env),
               "--shapes-format", "gaudi-env", "--server-settings", "max_num_batched_tokens=4096,max_num_seqs=8",
               "--solver", "greedy", "--quiet", "--device-profile", str(PROFILE), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    got = read_shapes(env, "gaudi-env", settings=parse_flag("max_num_batched_tokens=4096,max_num_seqs=8"))
    today = len(got.graphs)
    assert f"against today's {len(got.shapes)} ({today} graphs)." in done.stdout or f"({today} graphs)." in done.stdout
    assert f"{today * 20:.4g} s" in done.stdout and "warm-up" in done.stdout


def test_deprecated_switch_and_names_never_read_are_warnings_not_shapes(tmp_path):
    env = tmp_path / "old.env"
    env.write_text("VLLM_EXPONENTIAL_BUCKETING=true\nVLLM_PROMPT_SEQ_BUCKET_LIMIT=99\nMAX_NUM_BATCHED_TOKENS=1024\n"
                   "MAX_MODEL_LEN=1024\n")
    got = read_shapes(env, "gaudi-env")
    assert got.shapes == (128, 256, 384, 512, 768, 896, 1024) and 99 not in got.shapes
    text = "\n".join(got.warnings())
    assert "VLLM_EXPONENTIAL_BUCKETING is deprecated" in text and "LIMIT is never read by vllm-gaudi" in text


def test_the_audit_shows_graphs_in_reference_mode_and_says_the_batch_is_free(tmp_path):
    listing = tmp_path / "today.txt"
    listing.write_text("128\n256\n512\n1024\n")
    done = cli("model.audit", str(REPO / "data" / "default" / "requests_short.jsonl"), "--shapes-from", str(listing),
               "--solver", "greedy", "--quiet", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "graphs" in done.stdout and "leaves the batch free" in done.stdout and " graphs) against today's" in \
        done.stdout


# ---------------------------------------------------------------- round trips and the two known breaks


MATRIX = [
    ExportSpec((ShapeUse(256, (1, 4), 300, (290, 300)), ShapeUse(704, (2,), 1000, (1000,)))),
    ExportSpec((ShapeUse(128, (3,), 200, (200,)), ShapeUse(512, (3,), 600, (600,))), 64),
    ExportSpec(tuple(ShapeUse(s, (1,), 2 * s, (2 * s,)) for s in (128, 256, 512, 1024))),
    ExportSpec.of_shapes([128, 256, 1024]),
]


@pytest.mark.parametrize("fmt", sorted(WRITERS))
@pytest.mark.parametrize("k", range(len(MATRIX)))
def test_round_trip_matrix(tmp_path, fmt, k):
    """Every export written reads back, via --shapes-from and via --check, to the plans' graphs exactly."""
    spec = MATRIX[k]
    try:
        text = render(fmt, spec)
    except InputError as exc:
        assert "--format" in exc.message or "--scenario" in exc.message
        return
    path = tmp_path / f"x.{fmt}"
    path.write_text(text)
    assert read_shapes(path, fmt).shapes == spec.shapes
    assert compile_config(path, fmt).graphs == planned(fmt, spec)


def test_gaudi_file_at_block_size_1_of_a_large_batch_reads_back(tmp_path):
    """64 requests at 32768 tokens in blocks of one: 64 x 32769 = 2,097,216 decode blocks, over 2**20; the
    reader took 2**20 as the block limit, so this export (exit 0) could not be read back."""
    plans, req = write_case(tmp_path, [(32768, 64, 32000, 1)])
    out = tmp_path / "b.txt"
    done = export(tmp_path, "--plans", str(plans), "--format", "gaudi-file", "--out", str(out), "--requests",
                  str(req), "--block-size", "1")
    assert done.returncode == 0, done.stderr
    assert "(64, 1, 2097216)" in out.read_text()
    assert read_shapes(out, "gaudi-file").shapes == (32768,)
    check = export(tmp_path, "--check", str(out), "--format", "gaudi-file", "--plans", str(plans), "--requests",
                   str(req))
    assert check.returncode == 0, check.stdout


def test_vllm_tpu_of_a_long_shape_reads_back(tmp_path):
    """The old ladder's last rung covering 907584 was 1095232, over 2**20: exit 0, then unreadable."""
    shapes = [4480, 59456, 817536, 907584]
    plans, _ = write_case(tmp_path, [(s, 1, 100, 1) for s in shapes])
    out = tmp_path / "t.env"
    done = export(tmp_path, "--plans", str(plans), "--format", "vllm-tpu", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert read_shapes(out, "vllm-tpu").shapes == tuple(shapes)
    check = export(tmp_path, "--check", str(out), "--format", "vllm-tpu", "--plans", str(plans))
    assert check.returncode == 0 and "OK" in check.stdout
    assert max(g.value for g in compile_config(out, "vllm-tpu").lengths) == 907584


# ---------------------------------------------------------------- hostile flags


def hostile_targets(tmp_path: Path) -> dict[str, Path]:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    garbage = tmp_path / "garbage.bin"
    garbage.write_bytes(b"\x00\xff" * 10)
    folder = tmp_path / "folder"
    folder.mkdir()
    return {"fifo": fifo, "garbage": garbage, "folder": folder, "missing": tmp_path / "nope", "empty": Path("")}


SETTINGS_VALUES = ["", "abc", "max_num_seqs", "max_num_seqs=", "max_num_seqs=abc", "max_num_seqs=nan",
                   "max_num_seqs=inf", "max_num_seqs=-1", "max_num_seqs=0", "max_num_seqs=1e3", "max_num_seqs=1.5",
                   "max_num_seqs=" + "9" * 30, "max_num_seqs=2097152", "max_num_seqs=1,max_num_seqs=2",
                   "unknown=1", "../etc/passwd=1", "max_num_seqs=1;rm -rf /", ",", "max_num_seqs=1,,"]


def one_line_exit_2(done, tmp_path: Path, before: set[str]) -> None:
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.startswith("error: ") and done.stderr.count("\n") == 1, done.stderr
    assert {p.name for p in tmp_path.iterdir()} == before


@pytest.mark.parametrize("value", SETTINGS_VALUES)
def test_hostile_server_settings_exit_2_one_line(case, tmp_path, value):
    _, _, out = case
    before = {p.name for p in tmp_path.iterdir()}
    one_line_exit_2(export(tmp_path, "--check", str(out), "--format", "gaudi-file", "--server-settings", value),
                    tmp_path, before)
    listing = tmp_path / "l.txt"
    listing.write_text("128\n")
    before = {p.name for p in tmp_path.iterdir()}
    done = cli("model.solve", str(REPO / "data" / "default" / "requests_short.jsonl"), "--shapes-from", str(listing),
               "--server-settings", value, "--solver", "greedy", "--out", str(tmp_path / "o"), "--quiet", cwd=tmp_path)
    one_line_exit_2(done, tmp_path, before)


@pytest.mark.parametrize("kind", ["fifo", "garbage", "folder", "missing", "empty"])
def test_hostile_check_and_profile_paths_exit_2_one_line(case, tmp_path, kind):
    plans, req, out = case
    target = hostile_targets(tmp_path)[kind]
    before = {p.name for p in tmp_path.iterdir()}
    one_line_exit_2(export(tmp_path, "--check", str(target), "--format", "gaudi-file"), tmp_path, before)
    fresh = tmp_path / "fresh.txt"
    done = export(tmp_path, "--plans", str(plans), "--format", "gaudi-file", "--out", str(fresh), "--requests",
                  str(req), "--device-profile", str(target))
    one_line_exit_2(done, tmp_path, before)


@pytest.mark.parametrize("argv", [
    ["--format", "gaudi-file"],  # neither --plans nor --check
    ["--format", "gaudi-file", "--plans", "PLANS"],  # no --out
    ["--format", "gaudi-file", "--plans", "PLANS", "--out", "x", "--server-settings", "max_num_seqs=4"],
    ["--format", "gaudi-file", "--check", "OUT", "--out", "x"],
    ["--format", "yaml", "--check", "OUT"],
    ["--format", "gaudi-file", "--check", "OUT", "--requests", "REQ"],  # requests without plans
    ["--format", "gaudi-file", "--check", "OUT", "--block-size", "256"],  # disagrees with the file's setting
    ["--format", "gaudi-file", "--check", "OUT", "--max-model-len", "0"],
])
def test_hostile_flag_combinations_exit_2_one_line(case, tmp_path, argv):
    plans, req, out = case
    swap = {"PLANS": str(plans), "OUT": str(out), "REQ": str(req), "x": str(tmp_path / "x")}
    before = {p.name for p in tmp_path.iterdir()}
    one_line_exit_2(export(tmp_path, *[swap.get(a, a) for a in argv]), tmp_path, before)
