"""Behaviour kept through refactors: every packer's plan files on the shared inputs are byte-identical to those
the code wrote before (``tests/golden_outputs.json``, recorded by ``scripts/golden_outputs.py`` on the code
before the cost model became one object and the folders layers).  A change that is meant to change plans must
record the digests again, and say why in its commit."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

import golden_outputs  # noqa: E402

EXPECTED = json.loads((REPO / "tests" / "golden_outputs.json").read_text())


def test_every_case_is_recorded():
    assert set(golden_outputs.cases()) == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_plans_are_byte_identical_to_the_recorded_ones(name):
    assert golden_outputs.case_digest(golden_outputs.cases()[name]) == EXPECTED[name]
