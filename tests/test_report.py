"""The report: recommendation on the first screen, a paragraph per bucket on binding limits, self-contained HTML."""

from __future__ import annotations

import base64
import re

import pytest
from sweep_helpers import PNG_SIGNATURE, grid_rows, row, tiny_problem, write_scenario

from model.histogram.cells import build_histogram
from model.report.document import input_summary
from model.sweep import main
from model.sweeping.grid import SweepSettings
from model.sweeping.recommend import recommend
from model.sweeping.runner import SweepResult
from model.sweeping.sweep_report import binding_paragraph, recommendation_paragraphs, write_report

COSTS = {"mip": [110.0, 100.0, 100.0], "greedy": [120.0, 125.0, 125.0], "pow2": [300.0, 200.0, 150.0]}


def settings(**kw) -> SweepSettings:
    base = dict(source="tiny.toml", mode="reference", ks=(1, 2, 3), sweep_limit="", factors=(1.0,),
                solvers=tuple(COSTS), backend="highs", time_limit=5.0)
    return SweepSettings(**{**base, **kw})


def test_binding_paragraph_names_tight_limits_and_slack():
    r = row(sequential_ms=995.0, max_sequential_ms=1000.0, cost=100.0, max_cost=200.0, pad_ratio=0.1,
            max_pad_ratio=0.1)
    text = binding_paragraph(r, 0.01).text
    assert ("binding (under 1% to spare): pad_ratio (0.1000 of 0.1000, 0.00% to spare), "
            "sequential_ms (995.0 of 1,000.0, 0.50% to spare)") in text
    assert "slack: cost 50.0% below its limit" in text
    assert "no limits are set" in binding_paragraph(row(), 0.01).text
    assert "no limit binds" in binding_paragraph(row(cost=100.0, max_cost=200.0), 0.01).text
    broken = binding_paragraph(row(cost=300.0, max_cost=200.0, limits_met=False), 0.01).text
    assert "BREAKS cost" in broken


def test_recommendation_text_says_k_cost_and_savings():
    paragraphs = recommendation_paragraphs(recommend(grid_rows(COSTS)))
    text = " ".join(p.lead + p.text for p in paragraphs)
    assert text.startswith("Recommendation: compile K = 2 shapes (64, 128) with the mip plan")
    assert "gap 1.00%" in text
    # the saving is against pow2, the rule stacks compile by default, at the same K (and at pow2's best K);
    # shapeplan's own packers come after, named as such
    assert "Savings: 50.0% cheaper than pow2" in text and "at the same K = 2 (cost 200.0)" in text
    assert "pow2 at its best K = 3 meeting every limit costs 150.0 (33.3% dearer)" in text
    assert f"greedy at its best K = 1 (cost 120.0), is {1 - 100 / 120:.1%} dearer" in text
    assert "K = 2 is the cheapest shape cap of the sweep; the larger caps swept (up to K = 3)" in text
    edge = recommendation_paragraphs(recommend(grid_rows({"mip": [3.0, 2.0], "greedy": [4.0, 4.0]})))
    assert "K = 2 is the largest cap swept and the cheapest" in edge[-1].text


def test_input_summary_percentiles():
    problem = tiny_problem(n=30)
    (a, _) = input_summary(problem, [build_histogram(b) for b in problem.buckets])
    bucket = problem.buckets[0]
    assert a.requests == 30 and a.prompt[0] == bucket.prompt_len.min() and a.prompt[-1] == bucket.prompt_len.max()
    assert a.gen[0] == bucket.gen_len.min() and a.gen[-1] == bucket.gen_len.max()
    assert a.prompt[1] in bucket.prompt_len  # observed values, not interpolated


def test_report_md_and_html_from_rows(tmp_path):
    problem = tiny_problem()
    rows = tuple(grid_rows(COSTS, buckets=tuple(b.name for b in problem.buckets)))
    hists = [build_histogram(b) for b in problem.buckets]
    md_path, html_path = write_report(tmp_path, problem, hists, SweepResult(rows, {}), settings())
    md = md_path.read_text()
    first_screen = md.split("## ")[0]
    assert "**Recommendation:** compile K = 2 shapes" in first_screen and "**Savings:**" in first_screen
    assert md.index("Recommendation") < md.index("## Input") < md.index("## Settings")
    for bucket in ("a", "b"):
        assert len(re.findall(rf"^\*\*{bucket}:\*\* ", md, re.M)) == 1
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md)
    assert images == ["cost_vs_k.png", "breakdown.png", "heatmap.png"]  # no limit sweep: no trade-off
    for name in images:
        assert (tmp_path / name).read_bytes()[:8] == PNG_SIGNATURE
    page = html_path.read_text()
    embedded = re.findall(r"src='data:image/png;base64,([^']+)'", page)
    assert len(embedded) == 3 and base64.b64decode(embedded[0])[:8] == PNG_SIGNATURE
    assert "cost_vs_k.png" not in page.replace("alt=", "")  # nothing links outside the file
    assert "<strong>Recommendation:</strong>" in page


def test_report_with_a_limit_sweep_has_the_tradeoff(tmp_path):
    problem = tiny_problem()
    rows = tuple(grid_rows(COSTS, factors=(0.9, 1.0), limit="max_sequential_ms"))
    md_path, _ = write_report(tmp_path, problem, [build_histogram(b) for b in problem.buckets],
                              SweepResult(rows, {}), settings(sweep_limit="max_sequential_ms", factors=(0.9, 1.0)))
    md = md_path.read_text()
    assert "tradeoff.png" in md and "## Limit sweep at K = 2" in md
    assert "to spare): sequential_ms" in md  # the helper puts every plan exactly on its limit


@pytest.mark.slow
def test_cli_report_end_to_end(tmp_path):
    scenario = write_scenario(tmp_path, {"max_sequential_ms": 3.4e6})
    out = tmp_path / "report"
    assert main(["--scenario", str(scenario), "--k", "1-2", "--solvers", "mip,baseline,greedy", "--time-limit", "5",
                 "--sweep-limit", "max_sequential_ms", "--factors", "1.0,1.5", "--report", str(out), "--quiet"]) == 0
    md = (out / "report.md").read_text()
    assert "**Recommendation:** compile K = " in md and (out / "sweep.csv").exists()
    assert all((out / f).exists() for f in ("cost_vs_k.png", "breakdown.png", "heatmap.png", "tradeoff.png"))
