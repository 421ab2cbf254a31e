"""``--time-limit`` bounds the whole planning run on big inputs, on every backend (slow: ``pytest -m slow``).

Each case runs in a fresh process through ``scripts/bench_deadline.py`` (2 x 200k synthetic requests in
reference and strict mode at 5 s, a long-context trace with prompts up to 126k tokens at 20 s, the shared
twin-1 workload at 5 s): planning -- plan, expand, judge; loading is outside the limit -- may take the limit
plus 10%, and the plan must be valid and meet every limit.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
NOISE_S = 0.2  # scheduling noise of a loaded test machine, on top of the 10% allowance


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        yield importlib.import_module("bench_deadline")
    finally:
        sys.path.remove(str(REPO / "scripts"))


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["highs", "cpsat", "pulp"])
@pytest.mark.parametrize("case, limit", [("synth-ref", 5.0), ("synth-strict", 5.0), ("long", 20.0),
                                         ("twin-1", 5.0)])
def test_the_whole_run_keeps_its_time_limit(bench, case, limit, backend):
    r = bench.run_case(case, backend, limit)
    assert "error" not in r, r
    assert r["plan_s"] <= 1.1 * limit + NOISE_S, r
    assert r["ok"], r
