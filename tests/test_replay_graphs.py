"""Graph sets for the replay read from serving configs (``model/serving/graphs.py``): what each format gives, and
every bad file as one InputError naming file, line and field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from model.base.errors import InputError
from model.domain.server import GraphSet
from model.serving.graphs import read_graphs


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_json_graph_lists_for_both_stacks(tmp_path):
    gaudi = write(tmp_path, "g.json", '{"stack": "gaudi",\n "prompt": [[4, 256], [1, 256], [1, 256]],\n'
                                      ' "decode": []}\n')
    assert read_graphs(gaudi, "json", "gaudi") == GraphSet("gaudi", prompt=((1, 256), (4, 256)), source=str(gaudi))
    nxdi = write(tmp_path, "n.json", json.dumps({"context": [512, 256], "token_generation": [1024]}))
    assert read_graphs(nxdi, "json", "nxdi") == GraphSet("nxdi", context=(256, 512), token_generation=(1024,),
                                                         source=str(nxdi))


@pytest.mark.parametrize("text,stack,line,field,message", [
    ('{"prompt": [[1, 256]],\n "decode": [[2, 8], [2]]}', "gaudi", 2, "decode[1]", "expected a pair [B, X]"),
    ('{"prompt": [[1, 256]],\n "decode": [[0, 8]]}', "gaudi", 2, "decode[0][0]", "must be positive"),
    ('{"prompt": [[1, 256]]}', "gaudi", None, "decode", "missing"),
    ('{"prompt": [], "decode": []}', "gaudi", 1, "prompt", "no graphs listed"),
    ('{"prompt": [[1, 256]], "decode": [],\n "shapes": [256]}', "gaudi", 2, "shapes", "unknown key"),
    ('{"context": [256], "token_generation": [512]}', "gaudi", 1, "context", "the other stack's graphs"),
    ('{"context": [256],\n "token_generation": [512, "x"]}', "nxdi", 2, "token_generation[1]", "expected an integer"),
    ('{"stack": "gaudi", "context": [256], "token_generation": [512]}', "nxdi", 1, "stack", "not the server's stack"),
    ('{"prompt": [[1, 256]], "prompt": [[2, 256]], "decode": []}', "gaudi", 1, "prompt", "duplicate key"),
])
def test_bad_json_graph_lists(tmp_path, text, stack, line, field, message):
    path = write(tmp_path, "g.json", text)
    with pytest.raises(InputError) as info:
        read_graphs(path, "json", stack)
    assert (info.value.file, info.value.line, info.value.field) == (str(path), line, field), info.value.render()
    assert message in info.value.message, info.value.render()


def test_a_gaudi_bucket_file_splits_prompt_decode_and_prefix_cache_graphs(tmp_path):
    path = write(tmp_path, "buckets.txt", "# prompt\n([1, 2], [128, 256], 0)\n(4, 128, [0, 8])\n"
                                          "# decode\n([1, 2], 1, 8)\n([1, 2], 1, range(16, 49, 16))\n")
    graphs = read_graphs(path, "gaudi-file", "gaudi")
    assert graphs.prompt == ((1, 128), (1, 256), (2, 128), (2, 256), (4, 128))
    assert graphs.decode == tuple((b, nb) for b in (1, 2) for nb in (8, 16, 32, 48))
    assert graphs.unused == 1 and graphs.count == 5 + 8 + 1  # (4, 128, 8) is compiled at warm-up, never run


def test_gaudi_env_lin_crosses_the_ladders_and_follows_a_bucket_file(tmp_path):
    env = write(tmp_path, "g.env", "VLLM_BUCKETING_STRATEGY=lin\n"
                "VLLM_PROMPT_BS_BUCKET_MIN=1\nVLLM_PROMPT_BS_BUCKET_STEP=2\nVLLM_PROMPT_BS_BUCKET_MAX=2\n"
                "VLLM_PROMPT_QUERY_BUCKET_MIN=128\nVLLM_PROMPT_QUERY_BUCKET_STEP=128\nVLLM_PROMPT_QUERY_BUCKET_MAX=256\n"
                "VLLM_DECODE_BS_BUCKET_MIN=1\nVLLM_DECODE_BS_BUCKET_STEP=4\nVLLM_DECODE_BS_BUCKET_MAX=4\n"
                "VLLM_DECODE_BLOCK_BUCKET_MIN=8\nVLLM_DECODE_BLOCK_BUCKET_STEP=8\nVLLM_DECODE_BLOCK_BUCKET_MAX=16\n")
    graphs = read_graphs(env, "gaudi-env", "gaudi")
    assert graphs.prompt == ((1, 128), (1, 256), (2, 128), (2, 256))
    assert graphs.decode == tuple((b, nb) for b in (1, 2, 4) for nb in (8, 16))
    write(tmp_path, "b.txt", "(1, 512, 0)\n(1, 1, 4)\n")
    follow = write(tmp_path, "f.env", "VLLM_BUCKETING_FROM_FILE=b.txt\n")
    assert read_graphs(follow, "gaudi-env", "gaudi").prompt == ((1, 512),)


@pytest.mark.parametrize("text,line,field,message", [
    ("VLLM_BUCKETING_STRATEGY=exp\n", 1, "VLLM_BUCKETING_STRATEGY", "the exp strategy derives"),
    ("VLLM_BUCKETING_STRATEGY=lin\nVLLM_PROMPT_QUERY_BUCKET_MIN=128\nVLLM_PROMPT_QUERY_BUCKET_STEP=128\n"
     "VLLM_PROMPT_QUERY_BUCKET_MAX=256\n", None, "VLLM_PROMPT_BS_BUCKET_MIN", "missing"),
    ("VLLM_BUCKETING_STRATEGY=lin\nVLLM_PROMPT_BS_BUCKET_MN=1\n", 2, "VLLM_PROMPT_BS_BUCKET_MN", "a typo"),
])
def test_bad_gaudi_env(tmp_path, text, line, field, message):
    path = write(tmp_path, "g.env", text)
    with pytest.raises(InputError) as info:
        read_graphs(path, "gaudi-env", "gaudi")
    assert (info.value.line, info.value.field) == (line, field) and message in info.value.message


def test_nxdi_buckets_listed_or_by_nxdis_defaults(tmp_path):
    listed = write(tmp_path, "a.json", json.dumps({"neuron_config": {
        "enable_bucketing": True, "context_encoding_buckets": [512, 256], "token_generation_buckets": [1024, 512],
        "max_context_length": 512, "seq_len": 1024}}))
    assert read_graphs(listed, "nxdi", "nxdi").token_generation == (512, 1024)
    default = write(tmp_path, "b.json", json.dumps({"enable_bucketing": True, "max_context_length": 512,
                                                    "seq_len": 1024}))
    graphs = read_graphs(default, "nxdi", "nxdi")
    assert (graphs.context, graphs.token_generation) == ((128, 256, 512), (128, 256, 512, 1024))
    with pytest.raises(InputError, match="no seq_len") as info:
        read_graphs(write(tmp_path, "c.json", '{"context_encoding_buckets": [256]}'), "nxdi", "nxdi")
    assert info.value.field == "token_generation_buckets"


@pytest.mark.parametrize("fmt,stack,message", [
    ("list", "gaudi", "lists lengths (or token budgets), not the graphs"),
    ("vllm-tpu", "nxdi", "lists lengths"),
    ("gaudi-file", "nxdi", "holds gaudi graphs, and the stack is nxdi"),
    ("nxdi", "gaudi", "holds nxdi graphs"),
    ("yaml", "gaudi", "unknown format"),
])
def test_formats_without_graphs_or_for_the_other_stack_are_refused(tmp_path, fmt, stack, message):
    with pytest.raises(InputError) as info:
        read_graphs(write(tmp_path, "x", "256\n"), fmt, stack)
    assert info.value.file == "--shapes-format" and message in info.value.message
