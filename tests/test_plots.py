"""Pictures: read each figure back (lines per planner, the bound band, bars, shape marks) and check the PNG."""

from __future__ import annotations

import matplotlib.image
import numpy as np
import pytest
from matplotlib.collections import PolyCollection, QuadMesh
from sweep_helpers import PNG_SIGNATURE, grid_rows, tiny_problem

from model.histogram.cells import build_histogram
from model.packers import PACKERS
from model.report.plots import GEN_GID, SHAPE_GID, heatmap_figure, plot_heatmap
from model.sweeping.grid import SweepPoint
from model.sweeping.sweep_plots import (
    BAND_GID,
    BROKEN_GID,
    LIMIT_GID,
    RECOMMENDED_GID,
    plot_breakdown,
    plot_cost_vs_k,
    plot_tradeoff,
)
from model.sweeping.table import planner_totals

COSTS = {"mip": [110.0, 100.0, 100.0], "baseline": [900.0, 800.0, 700.0], "pow2": [130.0, 120.0, 115.0],
         "greedy": [112.0, 104.0, 103.0]}


def check_png(path, fig) -> None:
    """A real PNG of the figure's pixel size (RGBA)."""
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    image = matplotlib.image.imread(path)
    width, height = fig.get_size_inches() * fig.dpi
    assert image.shape == (round(height), round(width), 4)


def planner_lines(ax) -> list:
    """The data lines of an axes (not the marks a plot adds with a gid)."""
    return [line for line in ax.get_lines() if line.get_gid() is None]


def test_cost_vs_k_one_line_per_planner_and_a_bound_band(tmp_path):
    path = tmp_path / "cost.png"
    fig = plot_cost_vs_k(planner_totals(grid_rows(COSTS, broken=("pow2",))), path)
    check_png(path, fig)
    ax = fig.axes[0]
    lines = planner_lines(ax)
    assert [line.get_label() for line in lines] == ["mip", "baseline (above the zoom: over 1.6x the MIP at K = 3)",
                                                     "pow2", "greedy"]
    assert list(lines[0].get_xdata()) == [1, 2, 3] and list(lines[0].get_ydata()) == [110.0, 100.0, 100.0]
    band = [c for c in ax.collections if c.get_gid() == BAND_GID]
    assert len(band) == 1 and isinstance(band[0], PolyCollection)
    ys = band[0].get_paths()[0].vertices[:, 1]
    assert ys.min() == pytest.approx(99.0) and ys.max() == pytest.approx(110.0)  # bound = 0.99 x cost
    broken = [c for c in ax.collections if c.get_gid() == BROKEN_GID]
    assert len(broken) == 1 and len(broken[0].get_offsets()) == 3  # pow2 breaks a limit at every K
    assert ax.get_yscale() == "log"


def test_cost_vs_k_without_the_mip_has_no_band(tmp_path):
    fig = plot_cost_vs_k(planner_totals(grid_rows({"greedy": [2.0, 1.0], "pow2": [3.0, 2.0]})), tmp_path / "c.png")
    assert len(planner_lines(fig.axes[0])) == 2
    assert not [c for c in fig.axes[0].collections if c.get_gid() == BAND_GID]


def test_breakdown_stacks_four_components_per_planner(tmp_path):
    path = tmp_path / "breakdown.png"
    totals = planner_totals(grid_rows(COSTS))
    fig = plot_breakdown(totals, SweepPoint(1.0, 2), path)
    check_png(path, fig)
    ax = fig.axes[0]
    assert len(ax.patches) == 4 * len(COSTS)
    tops = {}
    for patch in ax.patches:
        x = round(patch.get_x() + patch.get_width() / 2)
        tops[x] = max(tops.get(x, 0.0), patch.get_y() + patch.get_height())
    assert [tops[i] for i in range(len(COSTS))] == pytest.approx([c[1] for c in COSTS.values()])
    assert [t.get_text() for t in ax.get_xticklabels()] == list(COSTS)
    assert ax.get_ylim()[1] < 800.0  # baseline is cut at 3x the cheapest and labelled
    assert any(t.get_text() == "800 (cut)" for t in ax.texts)
    assert ax.yaxis.get_offset_text().get_text() == ""  # plain numbers on the axis, no "1e7" offset


def test_heatmap_marks_every_shape_and_batch_corner(tmp_path):
    problem = tiny_problem(k=3)
    hists = [build_histogram(b) for b in problem.buckets]
    batchings = PACKERS["pow2"](problem)
    path = tmp_path / "heat.png"
    fig = plot_heatmap(problem, hists, batchings, path)
    check_png(path, fig)
    panels = [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]
    assert len(panels) == 2
    for ax, bucket, bt in zip(panels, problem.buckets, batchings, strict=True):
        assert len([c for c in ax.collections if isinstance(c, QuadMesh)]) == 1
        shapes = sorted(line.get_xdata()[0] for line in ax.get_lines() if line.get_gid() == SHAPE_GID)
        assert shapes == sorted(np.unique(bt.shape_of).tolist())
        _, s_max, g_max = problem.cost.batch_extents(bucket.prompt_len, bucket.gen_len, bt.batch_of, bt.shape_of)
        corners = [c for c in ax.collections if c.get_gid() == GEN_GID]
        assert len(corners) == 1
        assert sorted(map(tuple, corners[0].get_offsets().tolist())) == sorted(set(zip(s_max.tolist(),
                                                                                       g_max.tolist(), strict=True)))
        mesh = next(c for c in ax.collections if isinstance(c, QuadMesh))
        assert mesh.get_array().sum() == len(bucket)  # every request counted once


def test_heatmap_without_a_plan_draws_only_the_histogram(tmp_path):
    problem = tiny_problem()
    fig = plot_heatmap(problem, [build_histogram(b) for b in problem.buckets], None, tmp_path / "h.png")
    assert not any(line.get_gid() == SHAPE_GID for ax in fig.axes for line in ax.get_lines())


def test_tradeoff_one_line_per_planner_per_bucket(tmp_path):
    rows = grid_rows({"mip": [100.0, 90.0], "greedy": [110.0, 95.0]}, factors=(0.8, 1.0, 1.2),
                     limit="max_sequential_ms")
    path = tmp_path / "tradeoff.png"
    fig = plot_tradeoff(rows, 2, path)
    check_png(path, fig)
    assert len(fig.axes) == 2
    for ax in fig.axes:
        lines = planner_lines(ax)
        assert [line.get_label() for line in lines] == ["mip", "greedy"]
        assert list(lines[0].get_xdata()) == pytest.approx([800.0, 1000.0, 1200.0])
        assert len([line for line in ax.get_lines() if line.get_gid() == LIMIT_GID]) == 3
        assert sorted(t.get_text() for t in ax.texts) == ["x0.8", "x1", "x1.2"]


def test_cost_vs_k_in_device_hours_marks_the_recommended_k_and_zooms_on_the_planners_that_matter(tmp_path):
    """Device mode: the axis is in device-hours; the recommended K is marked on both panels; the zoomed panel's
    frame is set by the MIP and the planners near it, so the MIP's K = 2 against K = 3 difference is visible
    while baseline (7x dearer) is above it and said so."""
    ms = {"mip": [3.6e6 * 11, 3.6e6 * 10.2, 3.6e6 * 10.0], "baseline": [3.6e8, 3.2e8, 2.9e8],
          "pow2": [3.6e6 * 13, 3.6e6 * 12, 3.6e6 * 11.5]}
    fig = plot_cost_vs_k(planner_totals(grid_rows(ms)), tmp_path / "c.png", device=True, recommended=2)
    ax, rel = fig.axes[:2]
    assert "device-hours" in ax.get_ylabel()
    assert list(planner_lines(ax)[0].get_ydata()) == pytest.approx([11.0, 10.2, 10.0])
    for a in (ax, rel):
        marks = [line for line in a.get_lines() if line.get_gid() == RECOMMENDED_GID]
        assert len(marks) == 1 and list(marks[0].get_xdata()) == [2, 2]
    mip_rel = planner_lines(rel)[0].get_ydata()
    assert mip_rel[2] == pytest.approx(0.0) and mip_rel[1] == pytest.approx(2.0)  # % above the cheapest
    low, high = rel.get_ylim()
    assert high < 100 and high - low < 40  # 2 % is a visible step, not a sliver of a 3000 % axis
    markers = {line.get_marker() for line in planner_lines(ax)}
    assert len(markers) == 3  # every planner its own marker


def test_the_heatmap_has_a_log_prompt_axis_its_legend_off_the_data_and_counts_what_a_plan_uses(tmp_path):
    problem = tiny_problem(k=3)
    hists = [build_histogram(b) for b in problem.buckets]
    fig = heatmap_figure(problem, hists, None, (("today", (128, 256, 512, 1024), (128, 256, 512)),
                                                ("optimised", (192, 640))))
    fig.savefig(tmp_path / "h.png")
    renderer = fig.canvas.get_renderer()
    for ax in (a for a in fig.axes if a.get_label() != "<colorbar>"):
        assert ax.get_xscale() == "log" and ax.get_xlim()[1] >= 1024
        legend = ax.get_legend()
        labels = [t.get_text() for t in legend.get_texts()]
        assert labels == ["today: 4 shapes, 3 used by its plan (unused: thin)", "optimised: 2 shapes"]
        assert legend.get_window_extent(renderer).y1 <= ax.get_window_extent(renderer).y0  # under the panel
        ticks = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
        assert "1024" in ticks and not any("^" in t for t in ticks)  # plain numbers, not 10^3
