"""Plan files: written all-or-nothing, read back exactly, by the fast and the strict reader alike."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from helpers import bucket, problem
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from model import pipeline
from model.base.errors import InputError
from model.domain.schema import Plan
from model.load import plans as plan_io
from model.load.plans import plan_text, read_plan, write_plans


def make_plan(n: int, tag: str = "") -> Plan:
    """n records in batches of three, shapes 64..320."""
    return Plan(np.array([f"{tag}r{i}" for i in range(n)], dtype=object),
                np.array([f"b-{i // 3}" for i in range(n)], dtype=object),
                (np.arange(n) // 3 % 5 + 1) * 64)


def listing(folder: Path) -> dict[str, bytes]:
    """Every file in the folder, hidden temporaries included, with its bytes."""
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.fixture
def three_targets(tmp_path: Path) -> tuple[list[Path], dict[str, bytes]]:
    """Three plan targets, the first two holding old plans, the third new."""
    targets = [tmp_path / "plan_a.jsonl", tmp_path / "plan_b.jsonl", tmp_path / "plan_c.jsonl"]
    targets[0].write_text("old a\n")
    targets[1].write_text("old b\n")
    return targets, listing(tmp_path)


def test_a_failed_rename_rolls_back_the_plans_already_replaced(three_targets, tmp_path: Path, monkeypatch):
    targets, before = three_targets
    real_replace = os.replace

    def failing_replace(src, dst, *args, **kwargs):
        if Path(dst) == targets[1] and str(src).endswith(".tmp"):
            raise OSError(28, "No space left on device")
        return real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(plan_io.os, "replace", failing_replace)
    with pytest.raises(InputError) as exc:
        write_plans({t: make_plan(7, t.stem) for t in targets})
    assert str(exc.value) == f"{targets[1]}: cannot write: No space left on device"
    assert listing(tmp_path) == before  # plan_a restored, plan_c never created, no temporaries left


def test_a_target_that_is_a_folder_fails_before_anything_changes(three_targets, tmp_path: Path):
    targets, _ = three_targets
    targets[2].mkdir()
    before = listing(tmp_path)
    with pytest.raises(InputError, match=r"plan_c\.jsonl: cannot write: Is a directory$"):
        write_plans({t: make_plan(4) for t in targets})
    assert listing(tmp_path) == before


def test_an_interrupted_write_rolls_back_too(three_targets, tmp_path: Path, monkeypatch):
    """Not only OSError: Ctrl-C in the middle leaves the old plans and re-raises."""
    targets, before = three_targets
    real_replace = os.replace

    def interrupted(src, dst, *args, **kwargs):
        if Path(dst) == targets[2] and str(src).endswith(".tmp"):
            raise KeyboardInterrupt
        return real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(plan_io.os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_plans({t: make_plan(5) for t in targets})
    assert listing(tmp_path) == before


def test_success_replaces_all_and_leaves_no_temporaries(three_targets, tmp_path: Path):
    targets, _ = three_targets
    targets[0].chmod(0o640)
    plans = {t: make_plan(5, t.stem) for t in targets}
    write_plans(plans)
    assert sorted(listing(tmp_path)) == sorted(t.name for t in targets)
    for t, p in plans.items():
        assert t.read_text() == plan_text(p)
    assert targets[0].stat().st_mode & 0o777 == 0o640  # a replaced plan keeps its mode
    assert targets[2].stat().st_mode & 0o777 == 0o644  # a new one is an ordinary file, not mkstemp's 0600


def test_written_plans_read_back_exactly(tmp_path: Path):
    plan = make_plan(10)
    write_plans({tmp_path / "p.jsonl": plan})
    back = read_plan(tmp_path / "p.jsonl")
    assert list(back.request_ids) == list(plan.request_ids) and list(back.batch_ids) == list(plan.batch_ids)
    np.testing.assert_array_equal(back.seq_align, plan.seq_align)
    np.testing.assert_array_equal(back.lines, np.arange(1, 11))


def test_integer_ids_in_a_plan_are_strings(tmp_path: Path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"request_id": 3, "batch_id": 9, "shape": {"seq_align": 64, "heads_align": 32, "hidden_align": 4096}}\n'
                    '\n{"request_id": 4, "batch_id": 9, "shape": {"seq_align": 64, "heads_align": 32, "hidden_align": 4096}, "x": 1}\n')
    plan = read_plan(path)
    assert list(plan.request_ids) == ["3", "4"] and list(plan.batch_ids) == ["9", "9"] and list(plan.lines) == [1, 3]


ids = st.text(min_size=0, max_size=6)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records=st.lists(st.tuples(ids, ids, st.integers(1, 64)), min_size=1, max_size=20))
def test_text_is_json_dumps_and_both_readers_agree(tmp_path: Path, records):
    """Any ids (quotes, backslashes, control and non-ASCII characters) survive a write and a read."""
    plan = Plan(np.array([r for r, _, _ in records], dtype=object), np.array([b for _, b, _ in records], dtype=object),
                np.array([s * 64 for _, _, s in records], dtype=np.int64))
    text = plan_text(plan)
    assert text == "".join(json.dumps({"request_id": r, "batch_id": b, "shape": {
        "seq_align": s * 64, "heads_align": 32, "hidden_align": 4096}}) + "\n" for r, b, s in records)
    path = tmp_path / "p.jsonl"
    path.write_text(text, encoding="utf-8")
    fast = read_plan(path)
    slow = plan_io._read_plan_slow(path, path.read_bytes())
    for got in (fast, slow):
        assert list(got.request_ids) == list(plan.request_ids) and list(got.batch_ids) == list(plan.batch_ids)
        assert got.seq_align.tolist() == plan.seq_align.tolist()


def tree(root: Path) -> dict[str, bytes]:
    """Every file below root with its bytes."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("name", ["x/../../victim/plan_b1", "sub/b1", "../escape", "/tmp/shapeplan-evil", "a\x00b"])
def test_the_writer_refuses_any_target_outside_the_output_folder(tmp_path: Path, name: str):
    """Loaders refuse such bucket names; the writer checks containment again on its own (resolved paths)."""
    out = tmp_path / "out"
    (tmp_path / "victim").mkdir()
    (tmp_path / "victim" / "plan_b1.jsonl").write_text("victim\n")
    before = tree(tmp_path)
    prob = problem(bucket([10], [5], name="ok"), bucket([10], [5], name=name))
    with pytest.raises(InputError, match="refusing to write outside the output folder"):
        pipeline.write(out, prob, (make_plan(1), make_plan(1)))
    assert tree(tmp_path) == before and not out.exists()
    assert not Path("/tmp/shapeplan-evil.jsonl").exists() and not Path("/tmp/plan_shapeplan-evil.jsonl").exists()


def test_the_writer_allows_a_symlinked_output_folder(tmp_path: Path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    write_plans({tmp_path / "link" / "plan_a.jsonl": make_plan(2)}, inside=tmp_path / "link")
    assert read_plan(tmp_path / "real" / "plan_a.jsonl").request_ids.tolist() == ["r0", "r1"]


def test_rows_of_a_read_plan_by_hash_and_by_text_agree(tmp_path, monkeypatch):
    """A plan read back matches its bucket by hashes (the fast path) exactly as the full id matching does, a
    hash collision falls back to that matching, and repeats or strangers are still named."""
    from model.evaluation import validate

    rng = np.random.default_rng(2)
    b = bucket(rng.integers(1, 500, 300).tolist(), rng.integers(1, 50, 300).tolist())
    order = rng.permutation(300)
    plan = Plan(b.request_ids[order], np.array([f"s{i % 7}" for i in range(300)], dtype=object),
                np.full(300, 512, dtype=np.int64))
    path = tmp_path / "plan.jsonl"
    write_plans({path: plan})
    back = read_plan(path)
    assert back.batch_ids[0] is back.batch_ids[7]  # equal batch ids share one string
    rows = validate._rows_by_hash(b, back)
    assert rows is not None and (rows == order).all()
    assert (validate.plan_rows(b, back)[0] == order).all()
    monkeypatch.setattr(validate, "id_hash", lambda ids: np.zeros(len(ids), np.uint64))  # everything collides
    assert validate._rows_by_hash(b, back) is None
    assert (validate.plan_rows(b, back)[0] == order).all()
    twice = Plan(np.r_[back.request_ids[:-1], back.request_ids[:1]], back.batch_ids, back.seq_align)
    rows, problems = validate.plan_rows(b, twice)
    assert rows is None and {"appears twice", "is missing"} <= {w for p in problems for w in
                                                               ("appears twice", "is missing") if w in p.message}
