"""Every command's closing summary and its ``--json`` document (docs/json.md), on tiny inputs.

The summary is tested as data (``Summary`` and the document's ``summary`` object), not as text: each
command's has what was chosen, a cost with its unit (device-hours and money with the shipped
profile's price), a reference that is a stack's rule or today's config, how sure, and a next command.
Each document is checked against the keys docs/json.md lists; ``--json -`` leaves stdout pure JSON;
a bad --json path exits 2 and writes nothing.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from helpers import REPO, cli
from replay_helpers import write_example

from model import pipeline
from model.calibration.measurements import measurements_csv
from model.calibration.synthetic import synthetic_measurements
from model.deploy.summaries import fewer_shapes_reason, solve_summary
from model.domain.schema import SolveReport, Status
from model.load.profile import load_profile
from model.pipeline import InputSpec, load_problem
from model.report.json_doc import SCHEMA_VERSION, TABLE_KEYS, TOP_KEYS
from model.report.summary import DEVICE_UNIT, REF_STACK_RULE, REF_TODAY, Certainty, certainty_of, summary_dict

pytestmark = pytest.mark.filterwarnings("ignore:.*PuLP 4.0:DeprecationWarning")

PROFILE = REPO / "data" / "profiles" / "opt13b-a100-tp1.toml"
DOC = REPO / "docs" / "json.md"
PROMPTS = (100, 130, 200, 260, 300, 500, 700, 900, 1000, 1200, 60, 80)
GENS = (10, 20, 5, 40, 8, 30, 12, 50, 7, 25, 9, 15)


def documented() -> dict[str, list[tuple[str, ...]]]:
    """docs/json.md's tables by section heading: each row's backticked cells."""
    sections: dict[str, list[tuple[str, ...]]] = {}
    current = ""
    for line in DOC.read_text().splitlines():
        if line.startswith("#"):
            current = line.lstrip("#").strip()
        elif line.startswith("| `"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            sections.setdefault(current, []).append(tuple(c.strip("`") for c in cells if re.fullmatch(r"`[^`]+`", c)))
    return sections


def keys(section: str) -> list[str]:
    return [row[0] for row in documented()[section]]


def command_tables() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for command, table in documented()["Tables by command"]:
        out.setdefault(command, set()).add(table)
    return out


def command_keys() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for command, key in documented()["Keys of one command"]:
        out.setdefault(command, set()).add(key)
    return out


def check_document(doc: dict) -> None:
    """The document has exactly the documented keys, at every level docs/json.md describes."""
    assert list(doc)[:len(TOP_KEYS)] == list(TOP_KEYS) == keys("Top level")
    assert doc["schema_version"] == SCHEMA_VERSION
    assert set(doc) - set(TOP_KEYS) <= command_keys().get(doc["command"], set())
    summary = doc["summary"]
    assert list(summary) == keys("summary") and summary["command"] == doc["command"]
    for name, section in (("cost", "summary.cost (and reference.cost)"), ("reference", "summary.reference"),
                          ("certainty", "summary.certainty")):
        if summary[name] is not None:
            assert list(summary[name]) == keys(section), name
    if summary["reference"] is not None and summary["reference"]["cost"] is not None:
        assert list(summary["reference"]["cost"]) == keys("summary.cost (and reference.cost)")
    assert set(doc["tables"]) <= command_tables()[doc["command"]] and doc["tables"]
    for table in doc["tables"].values():
        assert list(table) == list(TABLE_KEYS) == keys("tables")
        assert len(table["units"]) == len(table["columns"])
        assert all(len(row) == len(table["columns"]) for row in table["rows"])


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    """Twelve requests with arrival times, a shapes config, a measurements CSV and the replay example."""
    d = tmp_path_factory.mktemp("summary")
    (d / "reqs.jsonl").write_text("".join(
        json.dumps({"request_id": i, "prompt_len": p, "gen_len": g, "arrival_s": 0.5 * i}) + "\n"
        for i, (p, g) in enumerate(zip(PROMPTS, GENS, strict=True))))
    (d / "today.txt").write_text("512\n1024\n1280\n")
    (d / "m.csv").write_text(measurements_csv(synthetic_measurements(load_profile(PROFILE),
                                                                     np.random.default_rng(3), repeats=1)))
    write_example(d)
    return d


def run_json(inputs: Path, module: str, *argv: str) -> tuple[dict, str]:
    """The command with ``--json -``: its stdout must be one JSON document and nothing else."""
    done = cli(module, *argv, "--json", "-", cwd=inputs)
    assert done.returncode in (0, 1), done.stderr
    doc = json.loads(done.stdout)  # the whole stdout, so nothing else is there
    check_document(doc)
    assert "summary" in done.stderr  # the text went to stderr
    return doc, done.stderr


SOLVE = ("model.solve", "reqs.jsonl", "--device-profile", str(PROFILE), "--limit-shapes", "4", "--time-limit", "2",
         "--quiet", "--out", "plans")


def test_solve_document_and_summary(inputs):
    doc, _ = run_json(inputs, *SOLVE)
    s = doc["summary"]
    assert doc["command"] == "solve" and s["ok"] and s["shapes_allowed"] == 4 and s["shapes"]
    cost = s["cost"]
    assert cost["unit"] == DEVICE_UNIT and cost["device_hours"] == pytest.approx(cost["value"] / 3.6e6)
    assert cost["price_per_device_hour"] == 5.12 and cost["money"] == pytest.approx(cost["device_hours"] * 5.12)
    ref = s["reference"]
    assert ref["kind"] == REF_STACK_RULE and ref["cost"]["value"] > 0
    assert ref["saving"] == pytest.approx(ref["cost"]["value"] - cost["value"])
    assert s["certainty"]["kind"] == "bound" and 0 <= s["certainty"]["gap"] <= 1
    assert s["certainty"]["bound"] <= cost["value"] * (1 + 1e-9)
    assert s["next_command"].startswith("python -m model.export --plans plans")
    assert (len(s["shapes"]) < 4) == (s["fewer_shapes"] is not None)
    table = doc["tables"]["buckets"]
    assert table["units"][table["columns"].index("p95_latency_ms")] == "ms"
    assert table["units"][table["columns"].index("cost")] == DEVICE_UNIT
    assert (inputs / "plans" / "plan_reqs.jsonl").is_file()


def test_evaluate_and_export_documents(inputs):
    cli(*SOLVE, cwd=inputs)
    doc, _ = run_json(inputs, "model.evaluate", "reqs.jsonl", "plans/plan_reqs.jsonl", "--device-profile",
                      str(PROFILE), "--limit-shapes", "4")
    s = doc["summary"]
    assert s["certainty"]["kind"] == "evaluation" and s["reference"]["kind"] == REF_STACK_RULE
    assert s["cost"]["unit"] == DEVICE_UNIT and s["next_command"].startswith("python -m model.solve")
    doc, _ = run_json(inputs, "model.export", "--plans", "plans", "--format", "gaudi-file", "--out", "b.txt",
                      "--requests", "reqs.jsonl", "--device-profile", str(PROFILE))
    s = doc["summary"]
    assert s["cost"]["unit"] == DEVICE_UNIT and s["cost"]["value"] > 0  # the warm-up
    assert s["next_command"].startswith("python -m model.export --check b.txt")
    doc, _ = run_json(inputs, "model.export", "--check", "b.txt", "--format", "gaudi-file", "--plans", "plans",
                      "--requests", "reqs.jsonl")
    assert doc["summary"]["ok"] and doc["tables"]["graphs"]["rows"]


def test_holdout_document(inputs):
    doc, _ = run_json(inputs, "model.solve", "reqs.jsonl", "--device-profile", str(PROFILE), "--limit-shapes", "3",
                      "--holdout", "0.25", "--time-limit", "2", "--quiet")
    assert doc["command"] == "holdout" and doc["summary"]["reference"]["kind"] == REF_STACK_RULE
    assert doc["summary"]["certainty"]["kind"] == "holdout"


def test_audit_document_measures_against_todays_config(inputs):
    doc, _ = run_json(inputs, "model.audit", "reqs.jsonl", "--device-profile", str(PROFILE), "--shapes-from",
                      "today.txt", "--time-limit", "1", "--quiet")
    s = doc["summary"]
    assert s["reference"]["kind"] == REF_TODAY and s["shapes_allowed"] == 3
    assert s["reference"]["saving"] == pytest.approx(s["reference"]["cost"]["value"] - s["cost"]["value"])
    sides = doc["tables"]["sides"]
    assert len(sides["rows"]) == 2 and sides["units"][sides["columns"].index("warmup_s")] == "s"


def test_sweep_document_compares_with_pow2_at_the_same_k(inputs):
    doc, err = run_json(inputs, "model.sweep", "reqs.jsonl", "--device-profile", str(PROFILE), "--k", "2",
                        "--solvers", "mip,pow2,dpfill", "--time-limit", "1", "--quiet", "--out", "s.csv")
    s = doc["summary"]
    assert s["reference"]["kind"] == REF_STACK_RULE and s["shapes_allowed"] == 2
    assert s["next_command"].startswith("python -m model.solve reqs.jsonl") and "--limit-shapes 2" in s["next_command"]
    assert "MIP cost (device-ms)" in err  # the K table's units
    assert (inputs / "s.csv").is_file()


def test_replay_and_calibrate_documents(inputs):
    doc, _ = run_json(inputs, "model.replay", "requests.jsonl", "--device-profile", "profile.toml", "--graphs",
                      "gaudi.json", "--slo-ttft-ms", "100000", "--slo-tpot-ms", "100000")
    s = doc["summary"]
    assert s["certainty"]["kind"] == "simulation" and s["cost"]["device_hours"] > 0
    assert doc["busy_ms"] == s["cost"]["value"] and doc["tables"]["latency"]["units"][1] == "ms"
    doc, _ = run_json(inputs, "model.calibrate", "m.csv", "--out", "fitted.toml")
    assert doc["summary"]["certainty"]["kind"] == "fit" and "fitted.toml" in doc["summary"]["next_command"]
    assert {row[0] for row in doc["tables"]["fits"]["rows"]} >= {"prefill", "decode"}


@pytest.mark.parametrize("bad", ["folder", "reqs.jsonl", "missing/../reqs.jsonl", "", "plans/plan_reqs.jsonl"])
def test_a_bad_json_path_exits_2_and_writes_nothing(inputs, tmp_path, bad):
    (inputs / "folder").mkdir(exist_ok=True)
    before = {p: p.read_bytes() for p in inputs.rglob("*") if p.is_file()}
    out = inputs / "plans"  # a plan file is an output of --out: --json must not be it
    done = cli("model.solve", "reqs.jsonl", "--device-profile", str(PROFILE), "--limit-shapes", "2", "--quiet",
               "--time-limit", "1", "--out", str(out), "--json", bad, cwd=inputs)
    assert done.returncode == 2 and "--json" in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert {p: p.read_bytes() for p in inputs.rglob("*") if p.is_file()} == before


def test_json_file_is_written_with_the_plans(inputs, tmp_path):
    done = cli("model.solve", "reqs.jsonl", "--device-profile", str(PROFILE), "--limit-shapes", "2", "--quiet",
               "--time-limit", "1", "--out", str(tmp_path / "p"), "--json", str(tmp_path / "doc.json"), cwd=inputs)
    assert done.returncode == 0, done.stderr
    check_document(json.loads((tmp_path / "doc.json").read_text()))
    assert "summary" in done.stdout and (tmp_path / "p" / "plan_reqs.jsonl").is_file()


# -- the summary as data ----------------------------------------------------------------------------------

def problem_of(inputs: Path, k: int, device: bool = True):
    spec = InputSpec(files=(inputs / "reqs.jsonl",), max_shapes=k, device=load_profile(PROFILE) if device else None)
    return load_problem(spec)[0]


def test_solve_summary_parts_and_the_reason_for_fewer_shapes(inputs):
    problem = problem_of(inputs, 8)
    run = pipeline.run(problem, "mip", time_limit=2)
    pow2 = pipeline.compare_run(problem, "pow2")
    s = solve_summary(problem, run.evaluation.results, run.evaluation.ok, run.planned.report, "mip", ["reqs.jsonl"],
                      "out", None, ["reqs.jsonl"], pow2)
    assert s.reference is not None and s.reference.kind == REF_STACK_RULE and s.reference.meets_limits is not None
    assert s.cost.unit == DEVICE_UNIT and s.cost.money is not None
    assert s.shapes == tuple(sorted(s.shapes)) and len(s.shapes) <= 8
    assert (s.fewer_shapes is None) == (len(s.shapes) == 8)
    assert "--requests" in s.next_command.split() and summary_dict(s)["certainty"]["sentence"]
    # a cap no plan can fill: as many shapes as distinct aligned prompt lengths is the most that helps
    assert fewer_shapes_reason(problem, (), False) is not None
    assert fewer_shapes_reason(problem_of(inputs, 1), (512,), False) is None


def test_certainty_is_a_bound_only_when_the_report_has_one():
    bound = SolveReport(Status.TIME_LIMIT_FEASIBLE, 100.0, 80.0, 0.2, 1.0, "highs", "1")
    c = certainty_of(bound, "mip")
    assert c.kind == "bound" and c.gap == 0.2 and c.bound == 80.0 and c.bound_by and c.plan_by
    none = SolveReport(Status.HEURISTIC, None, None, None, 0.0, "packer:pow2", "1")
    h = certainty_of(none, "pow2")
    assert h.kind == "heuristic" and h.bound is None and h.gap is None
    optimal = certainty_of(SolveReport(Status.OPTIMAL, 5.0, 5.0, 0.0, 1.0, "highs", "1"), "mip")
    assert optimal.status == "optimal" and optimal.sentence() != c.sentence()
    assert Certainty("fit", detail="d").sentence() == "d"


def test_serving_audit_and_capacity_documents(inputs):
    (inputs / "planned.json").write_text(json.dumps({"prompt": [[1, 1024], [2, 512], [4, 256]],
                                                     "decode": [[2, 8], [4, 96]]}))
    doc, _ = run_json(inputs, "model.audit", "--cost-model", "serving", "--device-profile", "profile.toml",
                      "--shapes-from", "gaudi.json", "--shapes-format", "json", "--graphs", "planned.json",
                      "requests.jsonl")
    s = doc["summary"]
    assert s["reference"]["kind"] == REF_TODAY and s["certainty"]["kind"] == "simulation"
    assert s["reference"]["saving"] == pytest.approx(s["reference"]["cost"]["value"] - s["cost"]["value"])
    assert [row[0] for row in doc["tables"]["serving_sides"]["rows"]] == ["today's config", "planned graphs"]
    doc, _ = run_json(inputs, "model.replay", "requests.jsonl", "--device-profile", "profile.toml", "--graphs",
                      "gaudi.json", "--replicas", "auto", "--slo-ttft-ms", "100000", "--slo-tpot-ms", "100000")
    (row,) = doc["tables"]["capacity"]["rows"]
    assert row[1] == 1 and doc["summary"]["ok"] and doc["capacity"]  # one replica meets SLOs this loose
