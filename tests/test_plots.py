"""Pictures: read each figure back (lines per planner, the bound band, bars, shape marks) and check the PNG."""

from __future__ import annotations

import matplotlib.image
import numpy as np
import pytest
from matplotlib.collections import PolyCollection, QuadMesh
from sweep_helpers import PNG_SIGNATURE, grid_rows, tiny_problem

from model.histogram.cells import build_histogram
from model.packers import PACKERS
from model.report.plots import GEN_GID, SHAPE_GID, plot_heatmap
from model.sweeping.grid import SweepPoint
from model.sweeping.sweep_plots import BAND_GID, BROKEN_GID, LIMIT_GID, plot_breakdown, plot_cost_vs_k, plot_tradeoff
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
    assert [line.get_label() for line in lines] == ["mip", "baseline (off chart)", "pow2", "greedy"]
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
    assert any(t.get_text() == "800" for t in ax.texts)


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
