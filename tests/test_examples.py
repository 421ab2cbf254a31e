"""The shipped example inputs (data/examples) read as the README uses them: every serving config imports by its
stack's rules and covers the traces it is audited on."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from model.deploy.flags import shapes_from_file
from model.load.profile import load_profile_file

REPO = Path(__file__).resolve().parents[1]
AUDIT = REPO / "data" / "examples" / "audit"
CONFIGS = {"neuron.json": "nxdi", "gaudi-buckets.txt": "gaudi-file", "gaudi.env": "gaudi-env",
           "vllm-neuron.json": "vllm-neuron", "vllm-tpu.env": "vllm-tpu"}


def longest_prompt() -> int:
    return max(int(pd.read_csv(path, usecols=["ContextTokens"])["ContextTokens"].max())
               for path in (REPO / "data" / "traces").glob("AzureLLMInferenceTrace_*.csv"))


@pytest.mark.parametrize("name,fmt", sorted(CONFIGS.items()))
def test_every_audit_config_imports_cleanly_and_covers_the_traces(name: str, fmt: str):
    shapes, warnings = shapes_from_file(AUDIT / name, fmt)
    assert warnings is None, warnings
    assert list(shapes) == sorted(set(shapes)) and max(shapes) >= longest_prompt()


def test_every_stack_has_an_audit_config():
    from model.serving.formats import READERS

    stacks = {fmt.split("-")[0] if fmt.startswith("gaudi") else fmt for fmt in CONFIGS.values()}
    assert {"gaudi", "nxdi", "vllm-neuron", "vllm-tpu"} <= stacks and set(CONFIGS.values()) <= set(READERS)
    assert sorted(p.name for p in AUDIT.iterdir() if p.name != "README.md") == sorted(CONFIGS)


def test_the_serving_example_profile_loads_with_its_server_table():
    profile, server = load_profile_file(REPO / "data" / "examples" / "serving" / "profile.toml")
    assert profile.kv_capacity_tokens and server is not None


def test_every_file_the_readme_names_under_data_or_docs_is_shipped():
    """The README's commands and links refer to files a clone has (nothing outside the repository, no file to make first)."""
    import re

    text = (REPO / "README.md").read_text()
    named = set(re.findall(r"(?<![\w/.])((?:data/examples|docs)/[\w./*-]+\w)", text))
    assert {"docs/cost_model.md", "docs/serving_model.md", "data/examples/audit/neuron.json"} <= named
    for name in sorted(named):
        assert list(REPO.glob(name)), name
    assert "shared/cost_model.md" not in text and "shared/serving_model.md" not in text
