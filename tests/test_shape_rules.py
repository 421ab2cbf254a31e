"""The shape rules (``model.evaluation.validate.shape_rules``), one probe per rule that holds and one that
breaks, and the same rules through the plan-record judge and the cell judge.

Every judge (plan records, the Dask batch table, runs by cells) finds its own first offenders and hands them
to this one function, so a rule and its message are written once."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import bucket, problem

from model.domain.schema import CellRuns, Plan
from model.evaluation.cell_judge import shape_violations
from model.evaluation.validate import evaluate_plans, shape_rules
from model.histogram.cells import build_histogram

SHAPES = np.array([128, 256])


@pytest.mark.parametrize("kwargs, rule", [
    ({"max_seq_len": 256}, None), ({"max_seq_len": 192}, "max-seq-len"),
    ({"allowed": (128, 256, 512)}, None), ({"allowed": (128,)}, "allowed-shapes"),
    ({"max_shapes": 2}, None), ({"max_shapes": 1}, "shape-cap"),
    ({"short": "batch 0: seq_align 64 < aligned prompt 128"}, "shape-covers-prompt"),
    ({"mixed": "batch 'b-0' mixes seq_align 64 and 128"}, "one-shape-per-batch"),
])
def test_each_rule_holds_or_breaks_alone(kwargs, rule):
    args = {"max_shapes": 8, "max_seq_len": None, "allowed": None, **kwargs}
    found = shape_rules("b", SHAPES, args.pop("max_shapes"), args.pop("max_seq_len"), args.pop("allowed"), **args)
    assert [v.rule for v in found] == ([] if rule is None else [rule])


def test_a_place_names_the_first_record_and_its_own_shape():
    found = shape_rules("b", np.array([128, 256, 512]), 8, 128, None, locate=lambda bad: ("p.jsonl:7", 512))
    assert found[0].message == "p.jsonl:7: seq_align 512 exceeds the largest allowed shape 128"


def plan_of(ids, batches, seqs) -> Plan:
    return Plan(np.array(ids, dtype=object), np.array(batches, dtype=object), np.array(seqs, dtype=np.int64),
                "plan.jsonl", np.arange(1, len(ids) + 1))


@pytest.mark.parametrize("seqs, batches, kw, rules", [
    ([128, 128, 128], ["x", "x", "y"], {}, []),
    ([64, 128, 128], ["x", "y", "y"], {}, ["shape-covers-prompt"]),
    ([128, 256, 256], ["x", "x", "y"], {}, ["one-shape-per-batch"]),
    ([128, 256, 256], ["x", "y", "y"], {"max_seq_len": 192}, ["max-seq-len"]),
    ([128, 256, 256], ["x", "y", "y"], {"allowed_shapes": (128, 512)}, ["allowed-shapes"]),
    ([128, 256, 256], ["x", "y", "y"], {"k": 1}, ["shape-cap"]),
])
def test_plan_records_and_runs_break_the_same_rules(seqs, batches, kw, rules):
    b = bucket([100, 70, 90], [5, 5, 5])
    prob = problem(b, **{"k": 8, **kw})
    results, _ = evaluate_plans(prob, (plan_of(list(b.request_ids), batches, seqs),))
    assert [v.rule for v in results[0].violations] == rules
    if "one-shape-per-batch" in rules:
        return  # runs carry one shape per batch by construction
    hist = build_histogram(b)
    codes = {name: k for k, name in enumerate(dict.fromkeys(batches))}
    shape_of = np.zeros(len(codes), np.int64)
    for name, s in zip(batches, seqs, strict=True):
        shape_of[codes[name]] = s
    runs = CellRuns(hist.cell_of.astype(np.int64), np.array([codes[n] for n in batches]), np.ones(3, np.int64),
                    shape_of)
    assert [v.rule for v in shape_violations(b.name, hist, runs, prob)] == rules
