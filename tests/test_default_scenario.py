"""The embedded default scenario: reproducible from its generator, feasible, and read like the twins."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from model import pipeline
from model.base.errors import InputError
from model.cli_common import build_problem
from model.load.scenario import load_scenario

REPO = Path(__file__).resolve().parent.parent
DEFAULT = REPO / "data" / "default"


@pytest.fixture
def gen_default(monkeypatch):
    """scripts/gen_default.py as a module (scripts/ is not a package; dataclasses need it in sys.modules)."""
    spec = importlib.util.spec_from_file_location("gen_default", REPO / "scripts" / "gen_default.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module


REFERENCE = DEFAULT / "reference.toml"  # the seed's contract: the same requests, reference-mode limits


def test_solve_reads_the_committed_default():
    assert pipeline.DEFAULT_SCENARIO == DEFAULT / "scenario.toml"
    scenario = load_scenario(pipeline.DEFAULT_SCENARIO)
    assert scenario.cost.name == "device" and scenario.cost.params.compile_ms == 20000.0
    assert [lim.max_p95_latency_ms is not None for lim in scenario.limits] == [True, True]
    scenario = load_scenario(REFERENCE)
    assert scenario.max_shapes == 8 and scenario.names == ("chat", "short")
    assert [len(b) for b in scenario.buckets] == [800, 800]
    for limits in scenario.limits:
        assert None not in (limits.max_cost, limits.max_pad_ratio, limits.max_p95_latency_ms, limits.max_sequential_ms)
    chat, short = scenario.buckets
    assert 30 <= chat.prompt_len.min() and chat.prompt_len.max() <= 2040 and chat.gen_len.max() <= 1023
    assert 36 <= short.prompt_len.min() and short.prompt_len.max() <= 677
    assert np.mean(short.gen_len == 16) > 0.3


def test_the_generator_reproduces_the_committed_files(tmp_path: Path, gen_default):
    gen_default.generate(tmp_path)
    for name in ("scenario.toml", "reference.toml", "device.toml", "requests_chat.jsonl", "requests_short.jsonl"):
        assert (tmp_path / name).read_bytes() == (DEFAULT / name).read_bytes(), name


def test_limits_are_binding_but_the_greedy_packer_meets_them(gen_default):
    gen = gen_default
    scenario = load_scenario(REFERENCE)
    for bucket, limits in zip(scenario.buckets, scenario.limits, strict=True):
        solo = gen.solo_metrics(bucket.prompt_len, bucket.gen_len)
        assert limits.max_sequential_ms <= 0.81 * solo.sequential_ms  # batching must save >= 19%
        assert solo.pad_ratio <= limits.max_pad_ratio <= 1.15 * solo.pad_ratio  # solo's pad is the floor
    assert gen.packer_meets_limits(REFERENCE, "greedy")


def test_the_device_default_is_feasible_and_its_limits_bind(gen_default):
    """Solo meets the P95 limits (the witness); the unconstrained dpfill plan does not (they bind)."""
    assert gen_default.packer_meets_limits(pipeline.DEFAULT_SCENARIO, "solo")
    assert not gen_default.packer_meets_limits(pipeline.DEFAULT_SCENARIO, "dpfill")


def cli_args(**kw) -> argparse.Namespace:
    """The namespace solve's parser builds, with a few values set."""
    base = dict(scenario=None, columns=None, format=None, cost_model=None, cost_params=None, limit_shapes=None,
                max_seq_len=None, max_cost=None, max_pad_ratio=None, max_p95_latency_ms=None, max_sequential_ms=None)
    return argparse.Namespace(**{**base, **kw})


def test_limit_flags_override_scenario_limits_one_by_one():
    problem, scenario = build_problem(cli_args(max_cost=5.0, limit_shapes=3, scenario=REFERENCE), [])
    assert problem.max_shapes == 3
    for got, declared in zip(problem.limits, scenario.limits, strict=True):
        assert got.max_cost == 5.0
        assert got.max_pad_ratio == declared.max_pad_ratio and got.max_sequential_ms == declared.max_sequential_ms


@pytest.mark.parametrize("key, value", [("max_cost", "-1"), ("max_sequential_ms", '"x"')])
def test_limit_errors_point_at_the_key_in_its_own_bucket(tmp_path: Path, key: str, value: str):
    """Both buckets set the key; the error is about the second one and names its line."""
    text = REFERENCE.read_text().splitlines()
    second = max(i for i, t in enumerate(text) if t.startswith(f"{key} ="))
    text[second] = f"{key} = {value}"
    for name in ("requests_chat.jsonl", "requests_short.jsonl"):
        (tmp_path / name).write_bytes((DEFAULT / name).read_bytes())
    (tmp_path / "s.toml").write_text("\n".join(text) + "\n")
    with pytest.raises(InputError) as exc:
        load_scenario(tmp_path / "s.toml")
    assert (exc.value.line, exc.value.field) == (second + 1, f"bucket.{key}")
