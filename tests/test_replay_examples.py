"""The contract's two worked examples (``shared/serving_model.md``), every number to 1e-9 relative.

gaudi: each of the 12 steps (start, admitted prompts and their graph, decode batch and
its graph, duration), busy time, TTFT/TPOT/E2E percentiles, pad ratios, graph count and
warm-up, the run-time compile.  nxdi: the aggregates the contract states.  Checked on the
library (the replay and its summary) and end to end through ``python -m model.replay``.
"""

from __future__ import annotations

import json

import pytest
from helpers import cli
from replay_helpers import GAUDI, GAUDI_SERVER, NXDI, NXDI_SERVER, PROFILE, example_trace, write_example

from model.cost.serving import ServingCost
from model.evaluation.replay import RuntimeCompile
from model.evaluation.replay_metrics import summarize
from model.evaluation.replay_run import replay

REL = 1e-9

# step, start, (n admitted, longest prompt) -> prompt graph, (n running, nb) -> decode graph, duration
GAUDI_STEPS = [
    (1, 0.0, (2, 300), (2, 512), None, None, 25.48288),
    (2, 25.48288, (1, 700), (1, 1024), (2, 4), (2, 8), 52.74976),
    (3, 78.23264, (1, 50), (1, 256), (2, 9), (4, 12), 36.75136),
    (4, 114.984, (1, 900), (1, 1024), (1, 6), (2, 8), 52.74976),
    (5, 167.73376, None, None, (2, 14), (4, 96), 10034.288),
    (6, 10202.02176, (1, 200), (1, 256), None, None, 13.21536),
    (7, 10215.23712, None, None, (1, 2), (2, 8), 22.024),
    (8, 10237.26112, None, None, (1, 2), (2, 8), 22.024),
    (9, 10259.28512, None, None, (1, 2), (2, 8), 22.024),
    (10, 10281.30912, None, None, (1, 2), (2, 8), 22.024),
    (11, 20000.0, (1, 120), (1, 256), None, None, 13.21536),
    (12, 20013.21536, None, None, (1, 1), (2, 8), 22.024),
]


def expanded_steps(runs, stack: str = "gaudi") -> list[tuple]:
    """The recorded runs as one row a step: start (by repeated addition, as the clock runs), prompt, decode, duration.

    Within a run nb stays (gaudi: a run ends before a block boundary); nxdi's longest context grows by one a step.
    """
    out = []
    for k in range(runs.start_ms.shape[0]):
        t = float(runs.start_ms[k])
        for step in range(int(runs.count[k])):
            prompt = (int(runs.prompt_n[k]), int(runs.prompt_len[k])) if runs.prompt_n[k] else None
            pgraph = (int(runs.prompt_b[k]), int(runs.prompt_x[k])) if runs.prompt_n[k] else None
            need = int(runs.decode_need[k]) + (step if stack == "nxdi" else 0)
            decode = (int(runs.decode_n[k]), need) if runs.decode_n[k] else None
            dgraph = (int(runs.decode_b[k]), int(runs.decode_x[k])) if runs.decode_n[k] else None
            out.append((len(out) + 1, t, prompt, pgraph, decode, dgraph, float(runs.duration_ms[k])))
            t += float(runs.duration_ms[k])
    return out


@pytest.fixture(scope="module")
def gaudi_result():
    return replay(example_trace(), GAUDI_SERVER, GAUDI, ServingCost(PROFILE), record=True)


@pytest.fixture(scope="module")
def nxdi_result():
    return replay(example_trace(), NXDI_SERVER, NXDI, ServingCost(PROFILE), record=True)


def test_gaudi_every_step_of_the_table(gaudi_result):
    steps = expanded_steps(gaudi_result.replicas[0].runs)
    assert len(steps) == len(GAUDI_STEPS)
    for got, want in zip(steps, GAUDI_STEPS, strict=True):
        assert got[0] == want[0] and got[2:6] == want[2:6], (got, want)
        assert got[1] == pytest.approx(want[1], rel=REL, abs=1e-12), (got, want)
        assert got[6] == pytest.approx(want[6], rel=REL), (got, want)


def test_gaudi_step_3_leaves_e_waiting_for_blocks(gaudi_result):
    """e (900 + 2 tokens: 8 blocks) has arrived by step 3 but only 6 of 16 blocks are free after d: it waits."""
    trace = gaudi_result.trace
    e = list(trace.ids).index("e")
    assert gaudi_result.first_ms[e] == pytest.approx(114.984 + 52.74976, rel=REL)  # its prefill is step 4


def test_gaudi_totals(gaudi_result):
    s = summarize(gaudi_result, ServingCost(PROFILE))
    assert s.steps == 12
    assert s.busy_ms == pytest.approx(10338.57248, rel=REL)
    assert (s.ttft.p50, s.ttft.p95) == pytest.approx((64.984, 9715.23712), rel=REL)
    assert (s.tpot.p50, s.tpot.p95) == pytest.approx((44.75056, 10034.288), rel=REL)
    assert s.e2e.p95 == pytest.approx(10192.02176, rel=REL)
    assert s.prompt_pad_ratio == pytest.approx(0.620253164556962, rel=REL)
    assert s.decode_pad_ratio == pytest.approx(3.5221887117621713, rel=REL)
    assert (s.graphs, s.warmup_ms) == (6, 60000.0)
    assert [c for _, c in s.runtime_compiles] == [RuntimeCompile(5, pytest.approx(167.73376, rel=REL), "decode",
                                                                 (4, 96))]
    assert s.runtime_compile_ms == 10000.0


def test_nxdi_totals(nxdi_result):
    s = summarize(nxdi_result, ServingCost(PROFILE))
    assert s.steps == 13
    assert s.busy_ms == pytest.approx(378.6784, rel=REL)
    assert (s.ttft.p50, s.ttft.p95) == pytest.approx((55.0048, 145.91168), rel=REL)
    assert (s.tpot.p50, s.tpot.p95) == pytest.approx((26.096, 54.77376), rel=REL)
    assert s.prompt_pad_ratio == pytest.approx(0.5122362869198313, rel=REL)
    assert s.decode_pad_ratio == pytest.approx(4.735458853942267, rel=REL)
    assert (s.graphs, s.warmup_ms) == (5, 50000.0)
    assert s.runtime_compiles == () and s.runtime_compile_ms == 0.0


def test_nxdi_decode_runs_at_the_full_batch_and_one_prompt_a_step(nxdi_result):
    steps = expanded_steps(nxdi_result.replicas[0].runs, "nxdi")
    assert all(d is None or d[0] == 4 for *_, d, _ in steps)  # B = max_num_seqs always
    assert all(p is None or p[0] == 1 for _, _, p, *_ in steps)  # ctx_batch_size 1: one prompt a step


@pytest.mark.parametrize("stack", ["gaudi", "nxdi"])
def test_the_command_line_reproduces_the_example(tmp_path, stack):
    files = write_example(tmp_path)
    out = tmp_path / "out.json"
    done = cli("model.replay", "requests.jsonl", "--device-profile", "profile.toml", "--graphs", f"{stack}.json",
               "--stack", stack, "--json", str(out), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert files["requests.jsonl"].exists()
    doc = json.loads(out.read_text())
    want = {"gaudi": dict(steps=12, busy=10338.57248, ttft=(64.984, 9715.23712), tpot=(44.75056, 10034.288),
                          pads=(0.620253164556962, 3.5221887117621713), graphs=6, warmup=60000.0, compiles=1),
            "nxdi": dict(steps=13, busy=378.6784, ttft=(55.0048, 145.91168), tpot=(26.096, 54.77376),
                         pads=(0.5122362869198313, 4.735458853942267), graphs=5, warmup=50000.0, compiles=0)}[stack]
    assert doc["steps"] == want["steps"]
    assert doc["busy_ms"] == pytest.approx(want["busy"], rel=REL)
    assert (doc["ttft_ms"]["p50"], doc["ttft_ms"]["p95"]) == pytest.approx(want["ttft"], rel=REL)
    assert (doc["tpot_ms"]["p50"], doc["tpot_ms"]["p95"]) == pytest.approx(want["tpot"], rel=REL)
    assert (doc["prompt_pad_ratio"], doc["decode_pad_ratio"]) == pytest.approx(want["pads"], rel=REL)
    assert (doc["graphs"]["count"], doc["graphs"]["warmup_ms"]) == (want["graphs"], want["warmup"])
    assert doc["runtime_compiles"]["count"] == want["compiles"]
    if stack == "gaudi":
        assert doc["e2e_ms"]["p95"] == pytest.approx(10192.02176, rel=REL)
        assert doc["runtime_compiles"]["graphs"] == [{"replica": 0, "step": 5, "start_ms": pytest.approx(167.73376),
                                                      "kind": "decode", "graph": [4, 96]}]
    assert "busy" in done.stdout and "device-hours" in done.stdout
