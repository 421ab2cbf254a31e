"""Graph sets for the replay (``model/serving/replay_graphs.py``): the replay's json taken as given, the stack
configs read by their stacks' rules under the replay's server settings, and every bad file as one InputError."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from model.base.errors import InputError
from model.domain.server import GraphSet, ServerSettings
from model.serving.replay_graphs import read_graph_set, stack_settings
from model.serving.settings import parse_flag

GAUDI = ServerSettings(stack="gaudi", max_num_seqs=8, max_num_batched_tokens=1024, block_size=16, max_prefill_seqs=4)
NXDI = ServerSettings(stack="nxdi", max_num_seqs=4, max_num_batched_tokens=1024)


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_json_graph_lists_for_both_stacks_are_taken_as_given(tmp_path):
    gaudi = write(tmp_path, "g.json", '{"stack": "gaudi",\n "prompt": [[4, 512], [1, 256], [1, 256]],\n'
                                      ' "decode": []}\n')
    got = read_graph_set(gaudi, "json", GAUDI)
    assert got.graphs == GraphSet("gaudi", prompt=((1, 256), (4, 512)), source=str(gaudi)) and got.notes == ()
    nxdi = write(tmp_path, "n.json", json.dumps({"context": [512, 256], "token_generation": [1024]}))
    assert read_graph_set(nxdi, "json", NXDI).graphs == GraphSet("nxdi", context=(256, 512), token_generation=(1024,),
                                                                source=str(nxdi))


@pytest.mark.parametrize("text,stack,line,field,message", [
    ('{"prompt": [[1, 256]],\n "decode": [[2, 8], [2]]}', "gaudi", 2, "decode[1]", "expected a pair [B, X]"),
    ('{"prompt": [[1, 256]],\n "decode": [[0, 8]]}', "gaudi", 2, "decode[0][0]", "must be positive"),
    ('{"prompt": [[1, 256]]}', "gaudi", None, "decode", "missing"),
    ('{"prompt": [], "decode": []}', "gaudi", 1, "prompt", "no graphs listed"),
    ('{"prompt": [[1, 256]], "decode": [],\n "colour": 3}', "gaudi", 2, "colour", "unknown key"),
    ('{"shapes": [256], "batch_sizes": [1]}', "gaudi", 1, "shapes", "the planner's json"),
    ('{"context": [256], "token_generation": [512]}', "gaudi", 1, "context", "the other stack's graphs"),
    ('{"context": [256],\n "token_generation": [512, "x"]}', "nxdi", 2, "token_generation[1]", "expected an integer"),
    ('{"stack": "gaudi", "context": [256], "token_generation": [512]}', "nxdi", 1, "stack", "not the server's stack"),
    ('{"prompt": [[1, 256]], "prompt": [[2, 256]], "decode": []}', "gaudi", 1, "prompt", "duplicate key"),
])
def test_bad_json_graph_lists(tmp_path, text, stack, line, field, message):
    path = write(tmp_path, "g.json", text)
    with pytest.raises(InputError) as info:
        read_graph_set(path, "json", GAUDI if stack == "gaudi" else NXDI)
    assert (info.value.file, info.value.line, info.value.field) == (str(path), line, field), info.value.render()
    assert message in info.value.message, info.value.render()


def test_a_gaudi_bucket_file_under_the_servers_filters(tmp_path):
    """Prompt graphs over the budget or over max_prefill_seqs (VLLM_PROMPT_BS_BUCKET_MAX) are dropped, as
    vllm-gaudi drops them, and said; a prompt graph with context blocks is compiled but never run."""
    path = write(tmp_path, "buckets.txt", "([1, 2, 8], [128, 256], 0)\n(4, 128, [0, 8])\n(1, 2048, 0)\n"
                                          "([1, 2], 1, [8, 32])\n")
    got = read_graph_set(path, "gaudi-file", GAUDI, extra=parse_flag("max_model_len=4096"))
    assert got.graphs.prompt == ((1, 128), (1, 256), (2, 128), (2, 256), (4, 128))
    assert got.graphs.decode == ((1, 8), (1, 32), (2, 8), (2, 32))
    assert got.graphs.unused == 1 and got.graphs.count == 5 + 4 + 1
    dropped = "\n".join(got.notes)
    assert "prompt (1, 2048, 0): batch x query_len 2048 over --max-num-batched-tokens 1024" in dropped
    assert "prompt (8, 128, 0): batch 8 over VLLM_PROMPT_BS_BUCKET_MAX 4" in dropped


def test_a_bucket_file_stating_another_server_is_refused_at_its_line(tmp_path):
    path = write(tmp_path, "buckets.txt", "# setting: MAX_NUM_SEQS=16\n(1, 128, 0)\n(1, 1, 8)\n")
    with pytest.raises(InputError) as info:
        read_graph_set(path, "gaudi-file", GAUDI, source="profile.toml [server]")
    assert info.value.line == 1 and "disagrees" in info.value.message


def test_gaudi_env_lin_and_exp_are_read_by_vllm_gaudis_rules(tmp_path):
    lin = write(tmp_path, "g.env", "VLLM_BUCKETING_STRATEGY=lin\n"
                "VLLM_PROMPT_BS_BUCKET_MIN=1\nVLLM_PROMPT_BS_BUCKET_STEP=2\nVLLM_PROMPT_BS_BUCKET_MAX=2\n"
                "VLLM_PROMPT_QUERY_BUCKET_MIN=128\nVLLM_PROMPT_QUERY_BUCKET_STEP=128\nVLLM_PROMPT_QUERY_BUCKET_MAX=256\n"
                "VLLM_PROMPT_CTX_BUCKET_MIN=0\nVLLM_PROMPT_CTX_BUCKET_STEP=1\nVLLM_PROMPT_CTX_BUCKET_MAX=0\n"
                "VLLM_DECODE_BS_BUCKET_MIN=1\nVLLM_DECODE_BS_BUCKET_STEP=4\nVLLM_DECODE_BS_BUCKET_MAX=4\n"
                "VLLM_DECODE_BLOCK_BUCKET_MIN=8\nVLLM_DECODE_BLOCK_BUCKET_STEP=8\nVLLM_DECODE_BLOCK_BUCKET_MAX=16\n")
    free = ServerSettings(stack="gaudi", max_num_seqs=8, max_num_batched_tokens=1024, block_size=16)
    graphs = read_graph_set(lin, "gaudi-env", free, extra=parse_flag("max_model_len=4096")).graphs
    assert graphs.prompt == ((1, 128), (1, 256), (2, 128), (2, 256))
    with pytest.raises(InputError, match="disagrees") as info:  # the file's own VLLM_PROMPT_BS_BUCKET_MAX is 2
        read_graph_set(lin, "gaudi-env", GAUDI, extra=parse_flag("max_model_len=4096"))
    assert info.value.line == 4
    assert graphs.decode == tuple((b, nb) for b in (1, 2, 4) for nb in (8, 16))
    exp = write(tmp_path, "e.env", "VLLM_BUCKETING_STRATEGY=exp\n")
    graphs = read_graph_set(exp, "gaudi-env", free, extra=parse_flag("max_model_len=1024")).graphs
    assert graphs.prompt and graphs.decode and all(b * s <= 1024 for b, s in graphs.prompt)


def test_nxdi_buckets_become_the_replays_buckets(tmp_path):
    conf = {"neuron_config": {"enable_bucketing": True, "batch_size": 4, "ctx_batch_size": 1,
                              "context_encoding_buckets": [512, 256], "token_generation_buckets": [1024, 512],
                              "max_context_length": 512, "seq_len": 1024}}
    graphs = read_graph_set(write(tmp_path, "a.json", json.dumps(conf)), "nxdi", NXDI).graphs
    assert (graphs.context, graphs.token_generation, graphs.count) == ((256, 512), (512, 1024), 4)
    conf["neuron_config"]["ctx_batch_size"] = 2
    with pytest.raises(InputError, match="ctx_batch_size is 1") as info:
        read_graph_set(write(tmp_path, "b.json", json.dumps(conf)), "nxdi", NXDI)
    assert info.value.field == "ctx_batch_size"


def test_the_replays_settings_reach_the_stack_readers():
    names = dict(stack_settings(GAUDI, "p.toml [server]").pairs(("max_num_seqs", "max_num_batched_tokens",
                                                                 "block_size", "prompt_bs_bucket_max")))
    assert names == {"max_num_seqs": 8, "max_num_batched_tokens": 1024, "block_size": 16, "prompt_bs_bucket_max": 4}
    assert "block_size" not in dict(stack_settings(NXDI, "x").pairs(("block_size",)))


@pytest.mark.parametrize("fmt,server,message", [
    ("list", GAUDI, "compiles lengths (or token budgets), not the graphs"),
    ("vllm-tpu", NXDI, "compiles lengths"),
    ("gaudi-file", NXDI, "holds gaudi graphs, and the stack is nxdi"),
    ("nxdi", GAUDI, "holds nxdi graphs"),
    ("yaml", GAUDI, "unknown format"),
])
def test_formats_without_graphs_or_for_the_other_stack_are_refused(tmp_path, fmt, server, message):
    with pytest.raises(InputError) as info:
        read_graph_set(write(tmp_path, "x", "256\n"), fmt, server)
    assert info.value.file == "--shapes-format" and message in info.value.message
