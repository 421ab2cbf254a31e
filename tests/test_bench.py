"""scripts/bench.py pieces its table rests on: the data it writes and the growth it flags."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from model.load.requests import load_requests

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def bench(monkeypatch):
    """scripts/bench.py imported fresh from scripts/ (not a package), undone after the test."""
    monkeypatch.syspath_prepend(str(REPO / "scripts"))
    monkeypatch.delitem(sys.modules, "bench", raising=False)
    return importlib.import_module("bench")


def test_synthetic_bucket_is_valid_across_chunks(bench, tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "CHUNK", 700)  # force several chunks: ids must stay unique and in order
    path = tmp_path / "r.jsonl"
    bench.write_synthetic(path, 2000, seed=3)
    bucket = load_requests(path)
    assert len(bucket) == 2000 and bucket.request_ids[0] == "c-000000" and bucket.request_ids[-1] == "c-001999"
    assert 30 <= bucket.prompt_len.min() and bucket.prompt_len.max() <= 2040
    again = tmp_path / "again.jsonl"
    bench.write_synthetic(again, 2000, seed=3)
    assert again.read_bytes() == path.read_bytes()


def test_growth_exponents_flag_only_superlinear_stages(bench):
    stages = []
    for n, scale in ((10**5, 1.0), (10**6, 10.0)):
        stages += [bench.Stage(n, "load", scale, 0, 0), bench.Stage(n, "evaluate", scale ** 1.5, 0, 0),
                   bench.Stage(n, "aggregate", 0.01 * scale, 0, 0)]
    exps = bench.growth_exponents(stages)
    assert exps["load"] == pytest.approx(1.0) and exps["evaluate"] == pytest.approx(1.5)
    assert "aggregate" not in exps  # 0.01 s at the smaller scale is overhead, not growth


def test_the_graph_table_s_stack_defaults_read_by_the_stacks_rules(monkeypatch):
    """The defaults the graph section prices (Gaudi exp, NxD Inference and TPU powers of two) at one set of server
    settings: each config reads back through its stack's importer, with the batch ladder the section uses."""
    from pathlib import Path as P

    from model.serving.formats import compile_config
    from model.serving.settings import parse_flag

    monkeypatch.syspath_prepend(str(REPO / "scripts"))
    bench_graphs = importlib.import_module("bench_graphs")
    settings = {"max_num_seqs": 12, "max_num_batched_tokens": 8192, "max_model_len": 4096, "block_size": 128}
    configs = bench_graphs.default_configs(settings, 2048)
    assert set(configs) == {"gaudi exp", "nxdi pow2", "tpu pow2"}
    assert configs["nxdi pow2"][2] == (12,) and configs["tpu pow2"][2] == (1, 2, 4, 8, 12)
    flags = parse_flag(",".join(f"{k}={v}" for k, v in settings.items()))
    for name, (fmt, text, _) in configs.items():
        graphs = compile_config(P(f"<{name}>"), fmt, flags, text=text).graphs
        assert graphs, name
