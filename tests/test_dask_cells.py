"""The Dask engine planning from the histogram alone (``--plan-from histogram``): no request on the client.

The plan dataset must be a valid plan of the partitions that the in-memory evaluator and the Dask judge
both score exactly as the manifest says, with every spike where the cell judge put it, and as cheap as
the in-memory engine's plan of the same requests (within 0.5 %).
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from helpers import REPO, cli
from test_dask_engine import dataset_records, write_one, write_parts

distributed = pytest.importorskip("distributed")

from model.cost.analytic import CostParams  # noqa: E402
from model.cost.metrics import plan_metrics  # noqa: E402
from model.load.synth import CHAT, bucket_arrays  # noqa: E402

METRICS = ("cost", "pad_ratio", "p95_latency_ms", "sequential_ms", "pad_tokens", "n_batches")


@pytest.fixture(scope="module")
def chat():
    ids, prompt, gen = bucket_arrays(np.random.default_rng(5), CHAT, 900)
    return pd.DataFrame({"request_id": ids, "prompt_len": prompt, "gen_len": gen})


@pytest.mark.parametrize("mode", [[], pytest.param(["--cost-model", "strict"], marks=pytest.mark.slow)],
                         ids=["reference", "strict"])
def test_histogram_plan_is_valid_exact_and_as_cheap(tmp_path, scheduler, chat, mode):
    reqs = write_parts(chat, tmp_path / "reqs", [300, 301, 700], "parquet")
    whole = tmp_path / "whole.parquet"
    write_one(chat, whole, "parquet")
    common = ["--limit-shapes", "4", "--time-limit", "6", "--quiet", "--max-p95-latency-ms", "1e9", *mode]
    dsk = cli("model.solve", "--engine", "dask", "--scheduler", scheduler, "--plan-from", "histogram", str(reqs),
              "--out", str(tmp_path / "dsk"), *common, cwd=tmp_path)
    assert dsk.returncode == 0, dsk.stderr + dsk.stdout
    assert "planned from the histogram" in dsk.stdout
    manifest = json.loads((tmp_path / "dsk" / "plan_reqs" / "manifest.json").read_text())
    assert manifest["solver"]["planned_from"] == "histogram"
    recs = dataset_records(tmp_path / "dsk" / "plan_reqs")
    # every request exactly once, and the in-memory evaluator's metrics are the manifest's
    assert sorted(recs["request_id"]) == sorted(chat["request_id"])
    rows = pd.Index(chat["request_id"]).get_indexer(recs["request_id"])
    cmode = "strict" if mode else "reference"
    m = plan_metrics(chat["prompt_len"].to_numpy()[rows], chat["gen_len"].to_numpy()[rows],
                     recs["batch_id"].to_numpy(object), recs["seq_align"].to_numpy(np.int64), CostParams(), cmode)
    for k in METRICS:
        assert getattr(m, k) == pytest.approx(manifest["metrics"][k], rel=1e-9), k
    judged = cli("model.evaluate", "--engine", "dask", "--scheduler", scheduler, str(reqs),
                 str(tmp_path / "dsk" / "plan_reqs"), "--limit-shapes", "4", *mode, cwd=tmp_path)
    assert judged.returncode == 0 and "OK: every plan" in judged.stdout, judged.stderr + judged.stdout
    mem = cli("model.solve", str(whole), "--out", str(tmp_path / "mem"), *common, cwd=tmp_path)
    assert mem.returncode == 0, mem.stderr
    cost = float(next(line for line in mem.stdout.splitlines() if line.startswith("total: cost")).split()[2]
                 .rstrip(","))
    assert manifest["metrics"]["cost"] <= 1.005 * cost


def test_histogram_plan_refuses_what_it_cannot_do(tmp_path, scheduler, chat):
    reqs = write_parts(chat, tmp_path / "reqs", [450], "parquet")
    base = ["model.solve", "--engine", "dask", "--scheduler", scheduler, "--plan-from", "histogram", str(reqs),
            "--out", str(tmp_path / "o"), "--quiet", "--time-limit", "3"]
    packer = cli(*base, "--solver", "pow2", cwd=tmp_path)
    assert packer.returncode == 2 and "MIP only" in packer.stderr
    too_long = cli(*base, "--max-seq-len", "512", cwd=tmp_path)
    assert too_long.returncode == 2 and "reqs/part-" in too_long.stderr and "prompt_len" in too_long.stderr
    device = cli(*base, "--device-profile", str(REPO / "data" / "profiles" / "opt13b-a100-tp1.toml"), cwd=tmp_path)
    assert device.returncode == 2 and "device mode plans from requests" in device.stderr
    memory = cli("model.solve", "--plan-from", "histogram", str(reqs / "part-0.parquet"), cwd=tmp_path)
    assert memory.returncode == 2 and "--plan-from" in memory.stderr and "needs --engine dask" in memory.stderr
    assert not (tmp_path / "o").exists()


def test_auto_plans_from_the_histogram_above_the_threshold_but_never_in_device_mode(tmp_path, scheduler, chat,
                                                                                     monkeypatch):
    from model.distributed import engine

    monkeypatch.setattr(engine, "REQUESTS_ON_CLIENT", 500)  # the chat fixture has 900 requests
    reqs = write_parts(chat, tmp_path / "reqs", [450], "parquet")
    base = ["model.solve", "--engine", "dask", "--scheduler", scheduler, str(reqs), "--quiet", "--time-limit", "3"]
    auto = cli(*base, "--out", str(tmp_path / "a"), cwd=tmp_path)
    assert auto.returncode == 0 and "planned from the histogram" in auto.stdout, auto.stderr
    device = cli(*base, "--out", str(tmp_path / "d"), "--solver", "pow2", "--device-profile",
                 str(REPO / "data" / "profiles" / "opt13b-a100-tp1.toml"), cwd=tmp_path)
    assert device.returncode == 0 and "planned from requests" in device.stdout, device.stderr
