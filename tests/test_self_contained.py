"""A bare clone is self-contained: its tests, examples and benchmark use the copies under data/, never ../shared.

(The full proof -- clone to an empty folder, fresh venv, the README's test command -- is run by hand and
recorded in the commit that added data/traces and data/workloads; this keeps the tree from drifting back.)
"""

from __future__ import annotations

import re

import pytest
from helpers import REPO, TRACES, WORKLOADS

# A path that leaves the repository towards a sibling "shared" folder, in any spelling the code used.
OUTSIDE = re.compile(r"\.\./shared|REPO\.parent|parents\[2\]|/work/shared")


def checked_files():
    yield REPO / "README.md"
    for folder in ("tests", "scripts", "model", "solvers"):
        yield from sorted((REPO / folder).rglob("*.py"))


@pytest.mark.parametrize("path", list(checked_files()), ids=lambda p: str(p.relative_to(REPO)))
def test_no_path_outside_the_repository(path):
    if path.name == "test_self_contained.py":
        return
    hits = [f"{n}: {line.strip()}" for n, line in enumerate(path.read_text().splitlines(), 1) if OUTSIDE.search(line)]
    assert not hits, hits


def test_the_copies_are_there_with_their_licence():
    assert sorted(p.name for p in TRACES.glob("*.csv")) == ["AzureLLMInferenceTrace_code.csv",
                                                            "AzureLLMInferenceTrace_conv.csv"]
    licence = (TRACES / "LICENSE").read_text()
    for needed in ("CC-BY-4.0", "Azure Public Dataset", "Patel et al.", "Splitwise", "ISCA 2024"):
        assert needed in licence
    assert sorted(p.parent.name for p in WORKLOADS.glob("*/scenario.toml")) == ["twin-1", "twin-2"]
