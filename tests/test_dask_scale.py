"""The Dask engine's scalable paths: the hash-range id check and the judge's aligned (positional) path.

The aligned path must give the general path's BucketResult bit for bit on the datasets ``model.solve
--engine dask`` writes, hand the rest (records moved between files, reordered, or missing) to the
general path, and the id check must find real duplicates with the message it always gave, and
never call two different ids with one hash a duplicate.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from helpers import REPO, cli, mode_cost

distributed = pytest.importorskip("distributed")

import model.distributed.judge as judge  # noqa: E402
import model.distributed.read as read  # noqa: E402
from model.base.errors import InputError  # noqa: E402
from model.cost.metrics import plan_metrics  # noqa: E402
from model.distributed.read import check_unique_ids, partitions, request_frame  # noqa: E402
from model.domain.schema import Limits  # noqa: E402
from model.load.profile import load_profile  # noqa: E402
from model.load.synth import CHAT, bucket_arrays  # noqa: E402

PROFILE = REPO / "data" / "profiles" / "opt13b-a100-tp1.toml"
CUTS = [150, 151, 380]  # four partitions, one of a single row


@pytest.fixture(scope="module")
def client(scheduler):
    with distributed.Client(scheduler, set_as_default=False) as c:
        yield c


@pytest.fixture(scope="module")
def chat() -> pd.DataFrame:
    ids, prompt, gen = bucket_arrays(np.random.default_rng(17), CHAT, 500)
    return pd.DataFrame({"request_id": ids.astype(str), "prompt_len": prompt, "gen_len": gen})


def write_parts(frame: pd.DataFrame, folder: Path, cuts: list[int]) -> Path:
    folder.mkdir(parents=True)
    bounds = [0, *cuts, len(frame)]
    for p in range(len(bounds) - 1):
        frame.iloc[bounds[p]:bounds[p + 1]].to_parquet(folder / f"part-{p}.parquet", index=False)
    return folder


@pytest.fixture(scope="module")
def solved(tmp_path_factory, scheduler, chat) -> tuple[Path, Path]:
    """Request partitions and the plan dataset ``model.solve --engine dask`` writes for them."""
    root = tmp_path_factory.mktemp("scale")
    reqs = write_parts(chat, root / "reqs", CUTS)
    res = cli("model.solve", "--engine", "dask", "--scheduler", scheduler, str(reqs), "--out", str(root / "out"),
              "--solver", "greedy", "--limit-shapes", "4", "--quiet", cwd=root)
    assert res.returncode == 0, res.stderr + res.stdout
    return reqs, root / "out" / "plan_reqs"


def judged(client, reqs: Path, plan: Path, mode: str = "reference", general: bool = False, monkeypatch=None,
           limits: Limits = Limits()):
    """judge_bucket on a lazy request frame; ``general`` forces the merge path.  Returns (result, aligned?)."""
    used = []
    real = judge.aligned_layout

    def spy(*args):
        layout = None if general else real(*args)
        used.append(layout is not None)
        return layout

    monkeypatch.setattr(judge, "aligned_layout", spy)
    cost = mode_cost(mode, load_profile(PROFILE))
    src = partitions(reqs)
    res = judge.judge_bucket(client, "reqs", src, request_frame(client, src, None, persist=False),
                             partitions(plan, "parquet", what="plan"), limits, 4, None, cost)
    monkeypatch.undo()
    return res, used == [True]


@pytest.mark.parametrize("mode", ["reference", pytest.param("strict", marks=pytest.mark.slow),
                                  pytest.param("device", marks=pytest.mark.slow)])
@pytest.mark.slow  # 2-7 s each on 2 cores: the default run's 90 s budget; cheaper siblings cover it by default
def test_aligned_path_equals_the_general_path(client, solved, mode, monkeypatch):
    reqs, plan = solved
    fast, aligned = judged(client, reqs, plan, mode, monkeypatch=monkeypatch, limits=Limits(max_cost=1.0))
    slow, _ = judged(client, reqs, plan, mode, general=True, monkeypatch=monkeypatch, limits=Limits(max_cost=1.0))
    assert aligned
    assert fast == slow  # metrics (floats bit for bit), limit checks, violations
    assert fast.metrics.n_requests == 500 and not fast.checks[0].ok


def dataset_records(plan: Path) -> pd.DataFrame:
    return pd.concat([pq.read_table(f).to_pandas() for f in sorted(plan.glob("part-*.parquet"))], ignore_index=True)


def moved(plan: Path) -> None:
    """The last record of part-00001 moved to the front of part-00002."""
    a, b = (pq.read_table(plan / f"part-0000{k}.parquet").to_pandas() for k in (1, 2))
    pd.concat([a.iloc[-1:], b]).to_parquet(plan / "part-00002.parquet", index=False)
    a.iloc[:-1].to_parquet(plan / "part-00001.parquet", index=False)


def swapped(plan: Path) -> None:
    """Two records of part-00004 in the other order."""
    t = pq.read_table(plan / "part-00004.parquet").to_pandas()
    t.iloc[[0, 1]] = t.iloc[[1, 0]].to_numpy()
    t.to_parquet(plan / "part-00004.parquet", index=False)


def lead_dropped(plan: Path) -> None:
    """A record of part-00000 gone: its request is missing."""
    t = pq.read_table(plan / "part-00000.parquet").to_pandas()
    t.iloc[1:].to_parquet(plan / "part-00000.parquet", index=False)


@pytest.mark.parametrize("change", [pytest.param(moved, marks=pytest.mark.slow), swapped,
                                    pytest.param(lead_dropped, marks=pytest.mark.slow)],
                         ids=["moved", "swapped", "lead_dropped"])
@pytest.mark.slow  # 2-7 s each on 2 cores: the default run's 90 s budget; cheaper siblings cover it by default
def test_unaligned_datasets_fall_back(client, solved, chat, tmp_path, change, monkeypatch):
    reqs, plan = solved
    mine = shutil.copytree(plan, tmp_path / "plan_reqs")
    change(mine)
    res, aligned = judged(client, reqs, mine, monkeypatch=monkeypatch)
    assert not aligned
    if change is lead_dropped:
        assert not res.ok and res.metrics is None
        (v,) = res.violations
        assert v.rule == "exactly-once" and "is missing from the plan (1 missing)" in v.message
        return
    recs = dataset_records(mine)  # the in-memory evaluator on the records in plan-file order
    rows = pd.Index(chat["request_id"]).get_indexer(recs["request_id"])
    want = plan_metrics(chat["prompt_len"].to_numpy()[rows], chat["gen_len"].to_numpy()[rows],
                        recs["batch_id"].to_numpy(object), recs["seq_align"].to_numpy(np.int64))
    assert res.ok and res.metrics.n_requests == 500 and res.metrics.pad_tokens == want.pad_tokens
    for name in ("cost", "p95_latency_ms", "sequential_ms", "prefill_cost", "decode_cost"):
        got, ref = getattr(res.metrics, name), getattr(want, name)
        assert abs(got - ref) <= 1e-9 * abs(ref), name


def test_duplicate_ids_across_partitions(client, chat, tmp_path):
    frame = chat.iloc[:60].copy()
    frame.iloc[45, 0] = frame.iloc[3, 0]  # part-2 line 6 repeats part-0 line 4
    frame.iloc[50, 0] = frame.iloc[25, 0]  # and part-2 line 11 repeats part-1 line 6
    d = write_parts(frame, tmp_path / "dup", [20, 40])
    src = partitions(d)
    with pytest.raises(InputError) as err:
        check_unique_ids(client, request_frame(client, src, None, persist=False), src)
    first = sorted([frame.iloc[3, 0], frame.iloc[25, 0]])[0]
    where = {frame.iloc[3, 0]: (d / "part-2.parquet", 6, d / "part-0.parquet:4"),
             frame.iloc[25, 0]: (d / "part-2.parquet", 11, d / "part-1.parquet:6")}[first]
    assert str(err.value) == str(InputError(str(where[0]), where[1], "request_id",
                                            f"duplicate id {first!r} (also at {where[2]}); ids must be unique "
                                            "across the partitions (2 ids repeated)"))


def test_a_hash_collision_is_no_duplicate(client, chat, tmp_path, monkeypatch):
    frame = chat.iloc[:60]
    a, b = frame.iloc[5, 0], frame.iloc[50, 0]
    real = read.id_hash

    def colliding(ids):
        h = real(ids)
        h[np.asarray(ids, dtype=object) == b] = real(np.array([a], dtype=object))[0]
        return h

    monkeypatch.setattr(read, "id_hash", colliding)
    assert colliding(np.array([a, b], dtype=object)).tolist()[0] == colliding(np.array([b], dtype=object))[0]
    d = write_parts(frame, tmp_path / "r", [20, 40])
    src = partitions(d)
    for persist in (False, True):
        check_unique_ids(client, request_frame(client, src, None, persist=persist), src)  # no error
    dup = frame.copy()
    dup.iloc[45, 0] = dup.iloc[3, 0]  # a real duplicate beside the collision: counted alone
    d2 = write_parts(dup, tmp_path / "r2", [20, 40])
    src2 = partitions(d2)
    with pytest.raises(InputError, match=r"part-2.parquet:6: .*\(1 ids repeated\)"):
        check_unique_ids(client, request_frame(client, src2, None, persist=False), src2)
