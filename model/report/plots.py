"""Pictures of a sweep, drawn with matplotlib's object API on the Agg canvas (no display, no pyplot state).

Each function builds one Figure, saves it as PNG and returns it, so a test can read
back what was drawn (lines per planner, the bound band, bars, shape markers) instead
of trusting that a file exists.  Artists that tests look for carry a ``gid``.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from model.expand.assemble import batch_extents
from model.histogram.cells import Histogram
from model.schema import Batching, Problem
from model.sweeping.engine import MIP, SweepRow
from model.sweeping.grid import SweepPoint, base_factor
from model.sweeping.table import PlannerTotal

if TYPE_CHECKING:
    from matplotlib.figure import Figure

DPI = 100
BAND_GID = "mip-bound-band"
BROKEN_GID = "limits-broken"
SHAPE_GID = "shape"
GEN_GID = "gen-boundary"
LIMIT_GID = "limit"
COMPONENTS = (("overhead_cost", "overhead"), ("compile_cost", "compile"), ("prefill_cost", "prefill"),
              ("decode_cost", "decode"))
BAR_CLIP = 3.0  # bars and lines above this many times the MIP's (or cheapest) cost are cut off


def log_norm(vmin: float, vmax: float):
    """matplotlib's LogNorm (imported when a picture is drawn, like the Figure)."""
    from matplotlib.colors import LogNorm

    return LogNorm(vmin=vmin, vmax=vmax)


def new_figure(width: float, height: float) -> Figure:
    """A Figure on its own Agg canvas: nothing global is touched, so plots are safe in tests and threads.

    matplotlib is imported here, on the first picture: it is half of a command line's start-up time and
    most runs draw nothing."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def save(fig: Figure, path: Path) -> Figure:
    """Write the PNG without the matplotlib version in its metadata, so the bytes depend on the data only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", metadata={"Software": None})
    return fig


def png_bytes(fig: Figure) -> bytes:
    """The PNG ``save`` would write, in memory (for writers that put several files down all-or-nothing)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    return buf.getvalue()


def planners_of(totals: Sequence[PlannerTotal]) -> list[str]:
    """Planner names in first-appearance order (the order the sweep ran them: MIP first)."""
    return list(dict.fromkeys(t.planner for t in totals))


def mark_broken(ax, xs: Sequence[float], ys: Sequence[float]) -> None:
    """Red crosses over points whose plan breaks a limit, so a cheap but unusable plan is never read as a win."""
    if len(xs):
        ax.scatter(xs, ys, marker="x", s=60, color="red", zorder=5, gid=BROKEN_GID, label="breaks a limit")


def plot_cost_vs_k(totals: Sequence[PlannerTotal], path: Path, factor: float | None = None) -> Figure:
    """Total cost against the shape cap, one line per planner, the MIP's bound-to-cost band shaded.

    The band is where the true optimum lies: a narrow band means the MIP's curve is
    the real cost of each K, not an artefact of a time limit.
    """
    factor = base_factor(t.point for t in totals) if factor is None else factor
    here = [t for t in totals if t.point.factor == factor]
    ks = sorted({t.point.k for t in here})
    fig = new_figure(8, 5)
    ax = fig.add_subplot()
    broken_x, broken_y = [], []
    top = chart_top(here)
    for planner in planners_of(here):
        by_k = {t.point.k: t for t in here if t.planner == planner}
        ys = [by_k[k].cost if k in by_k and by_k[k].cost is not None else np.nan for k in ks]
        finite = [y for y in ys if np.isfinite(y)]
        off = top is not None and bool(finite) and min(finite) > top
        ax.plot(ks, ys, marker="o", ms=4, label=planner + (" (off chart)" if off else ""),
                lw=2.2 if planner == MIP else 1.2, zorder=4 if planner == MIP else 2)
        bad = [k for k in ks if k in by_k and by_k[k].cost is not None and not by_k[k].limits_met]
        broken_x += bad
        broken_y += [by_k[k].cost for k in bad]
        if planner == MIP:
            lo = [by_k[k].bound if k in by_k and by_k[k].bound is not None else np.nan for k in ks]
            ax.fill_between(ks, lo, ys, alpha=0.25, color="C0", gid=BAND_GID, label="MIP lower bound to MIP cost")
    mark_broken(ax, broken_x, broken_y)
    low = min((t.bound if t.bound is not None else t.cost for t in here if t.cost is not None), default=None)
    if low is not None and low > 0:  # all-zero coefficients make every cost 0: keep a linear axis then
        ax.set_yscale("log")
        if top is not None:
            ax.set_ylim(low / 1.05, top)
    ax.set_xticks(ks)
    ax.set_xlabel("shape cap K (distinct compiled shapes, across all buckets)")
    ax.set_ylabel("total cost (all buckets)")
    where = f", {here[0].point.limit} x{factor:g}" if here and here[0].point.limit else ""
    ax.set_title(f"Cost vs shape cap{where}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, ncols=2)
    return save(fig, path)


def chart_top(here: Sequence[PlannerTotal]) -> float | None:
    """Upper y limit: ``BAR_CLIP`` times the dearest MIP cost, so rules 40x dearer do not flatten the close ones."""
    mip = [t.cost for t in here if t.planner == MIP and t.cost is not None]
    return BAR_CLIP * max(mip) if mip else None


def gen_edges(gmin: int, gmax: int, n: int = 40) -> np.ndarray:
    """Log-spaced integer bin edges over gmin..gmax: generations are long-tailed, so linear bins hide the short ones."""
    return np.unique(np.round(np.geomspace(gmin, gmax + 1, n)).astype(np.int64)).astype(np.float64)


def plot_heatmap(problem: Problem, hists: Sequence[Histogram], batchings: Sequence[Batching] | None,
                 path: Path, shape_sets: Sequence[tuple[str, Sequence[int]]] = ()) -> Figure:
    """Request counts over (aligned prompt, gen_len), log colour, one panel per bucket, the chosen plan on top.

    Dashed vertical lines are the compiled shapes (seq_align); crosses are each
    batch's box corner (its longest member prompt, its G_max) -- the gen boundary
    every member of the batch decodes up to.  Traffic far below and left of a corner
    is what pays padding.  ``shape_sets`` draws labelled sets of shapes besides (see
    ``heatmap_figure``).
    """
    return save(heatmap_figure(problem, hists, batchings, shape_sets), path)


SET_STYLES = (("tab:orange", "-", 2.4), ("magenta", "--", 1.6), ("black", ":", 1.6), ("tab:cyan", "-.", 1.6))


def heatmap_figure(problem: Problem, hists: Sequence[Histogram], batchings: Sequence[Batching] | None,
                   shape_sets: Sequence[tuple[str, Sequence[int]]] = ()) -> Figure:
    """The heatmap of ``plot_heatmap`` as a Figure; each of ``shape_sets`` (label, shapes) is drawn as vertical
    lines in its own colour and style, labelled in the legend (gid ``shape-set-<i>``), so two shape sets --
    today's and an optimised one -- can be read against the same traffic."""
    n = len(hists)
    fig = new_figure(6.5 * n, 5)
    axes = fig.subplots(1, n, squeeze=False)[0]
    for b, (ax, hist) in enumerate(zip(axes, hists, strict=True)):
        xedges = np.arange(32, int(hist.S.max()) + 96, 64, dtype=np.float64)
        yedges = gen_edges(int(hist.G.min()), int(hist.G.max()))
        counts, _, _ = np.histogram2d(hist.S, hist.G, bins=(xedges, yedges), weights=hist.count)
        mesh = ax.pcolormesh(xedges, yedges, np.ma.masked_equal(counts.T, 0), cmap="viridis",
                             norm=log_norm(vmin=1, vmax=max(1.0, counts.max())))
        fig.colorbar(mesh, ax=ax, label="requests (log scale)")
        if batchings is not None:
            draw_plan(ax, problem, b, batchings[b])
        draw_shape_sets(ax, shape_sets, float(xedges[-1]))
        if batchings is not None or shape_sets:
            ax.legend(fontsize=7, loc="upper right")
        ax.set_yscale("log")
        ax.set_ylim(max(1.0, yedges[0]), yedges[-1])
        ax.set_xlabel("aligned prompt length (tokens)")
        ax.set_ylabel("gen_len (tokens)")
        ax.set_title(f"{hist.name}: {hist.n_requests} requests, {len(hist)} cells")
    return fig


def draw_shape_sets(ax, shape_sets: Sequence[tuple[str, Sequence[int]]], right: float) -> None:
    """Each labelled shape set as vertical lines (one style per set); shapes beyond the traffic are pinned to the
    right edge and named in the label, so a set's long tail is not silently cut off."""
    for i, (label, shapes) in enumerate(shape_sets):
        colour, style, width = SET_STYLES[i % len(SET_STYLES)]
        shapes = sorted(int(s) for s in shapes)
        beyond = [s for s in shapes if s > right]
        text = f"{label} ({len(shapes)})" + (f"; beyond the chart: {', '.join(map(str, beyond))}" if beyond else "")
        for j, s in enumerate(s for s in shapes if s <= right):
            ax.axvline(float(s), color=colour, ls=style, lw=width, gid=f"shape-set-{i}", label=text if j == 0 else None)
        if len(beyond) == len(shapes):
            ax.axvline(right, color=colour, ls=style, lw=width, gid=f"shape-set-{i}", label=text)


def draw_plan(ax, problem: Problem, b: int, batching: Batching) -> None:
    """The chosen shapes as dashed lines and each batch's (S_max, G_max) corner as a cross."""
    bucket = problem.buckets[b]
    for k, s in enumerate(np.unique(batching.shape_of)):
        ax.axvline(float(s), color="black", ls="--", lw=1.5, gid=SHAPE_GID, label="compiled shape" if k == 0 else None)
    _, s_max, g_max = batch_extents(bucket, batching, problem.mode)
    corners = np.unique(np.stack([s_max, g_max], axis=1), axis=0)
    ax.scatter(corners[:, 0], corners[:, 1], marker="+", s=40 if len(corners) < 200 else 12, color="red", gid=GEN_GID,
               label="batch box corner (S_max, G_max)")


def plot_breakdown(totals: Sequence[PlannerTotal], point: SweepPoint, path: Path) -> Figure:
    """Stacked bars of overhead, compile, prefill and decode cost per planner at one point.

    Shows where each rule loses: baseline on decode (padding to the longest
    generation), solo on overhead (a batch per request).  Bars far taller than the
    cheapest are cut at ``BAR_CLIP`` times it and labelled, so the close ones stay readable.
    """
    here = [t for t in totals if t.point == point and t.cost is not None]
    fig = new_figure(max(6.0, 1.1 * len(here) + 2), 5)
    ax = fig.add_subplot()
    xs = np.arange(len(here))
    bottom = np.zeros(len(here))
    for attr, label in COMPONENTS:
        heights = np.array([getattr(t, attr) for t in here], dtype=np.float64)
        ax.bar(xs, heights, bottom=bottom, label=label, width=0.7)
        bottom += heights
    if here:
        top = BAR_CLIP * min(t.cost for t in here)
        if bottom.max() > top:
            ax.set_ylim(0, top * 1.05)
            for x, t in zip(xs, here, strict=True):
                if t.cost > top:
                    ax.text(x, top * 1.01, f"{t.cost:.3g}", ha="center", va="top", fontsize=8, rotation=90)
    ax.set_xticks(xs, [t.planner + ("" if t.limits_met else "\n(breaks limits)") for t in here], fontsize=8)
    ax.set_ylabel("total cost (all buckets)")
    ax.set_title(f"Cost breakdown at {point.label()}")
    ax.legend(fontsize=8)
    return save(fig, path)


def frame(ax, rows: Sequence[SweepRow]) -> None:
    """Zoom onto the plans that meet their limits (5% margin): rules that break them sit far away and would
    flatten the frontier the picture is about."""
    if not rows:
        return
    xs = [r.sequential_ms for r in rows]
    ys = [r.cost for r in rows]
    dx = (max(xs) - min(xs)) * 0.05 or max(xs) * 0.02
    dy = (max(ys) - min(ys)) * 0.05 or max(ys) * 0.02
    ax.set_xlim(min(xs) - dx, max(xs) + dx)
    ax.set_ylim(min(ys) - dy, max(ys) + dy)


def plot_tradeoff(rows: Sequence[SweepRow], k: int, path: Path) -> Figure:
    """Sequential time against cost along the limit sweep at one K, a panel per bucket, a line per planner.

    The MIP's line is the price of each millisecond of sequential-time budget; its
    points are labelled with the limit factor that produced them, and dotted
    vertical lines mark the sequential-time limits when that is the swept limit
    (a MIP point on its line means the limit binds).  The view frames the plans
    that meet their limits.
    """
    here = [r for r in rows if r.k == k and r.sweep_limit]
    buckets = list(dict.fromkeys(r.bucket for r in here))
    fig = new_figure(6 * max(1, len(buckets)), 5)
    axes = fig.subplots(1, max(1, len(buckets)), squeeze=False)[0]
    for ax, bucket in zip(axes, buckets, strict=True):
        mine = [r for r in here if r.bucket == bucket]
        broken_x, broken_y = [], []
        for planner in dict.fromkeys(r.planner for r in mine):
            pts = sorted((r for r in mine if r.planner == planner), key=lambda r: r.factor)
            xs = [r.sequential_ms if r.sequential_ms is not None else np.nan for r in pts]
            ys = [r.cost if r.cost is not None else np.nan for r in pts]
            ax.plot(xs, ys, marker="o", ms=4, label=planner, lw=2.2 if planner == MIP else 1.0)
            bad = [r for r in pts if r.cost is not None and not r.limits_met]
            broken_x += [r.sequential_ms for r in bad]
            broken_y += [r.cost for r in bad]
            if planner == MIP:
                for r in pts:
                    if r.cost is not None:
                        ax.annotate(f"x{r.factor:g}", (r.sequential_ms, r.cost), fontsize=7,
                                    textcoords="offset points", xytext=(4, 4))
        mark_broken(ax, broken_x, broken_y)
        for value in sorted({r.limit_value for r in mine if r.limit_value is not None and r.sweep_limit ==
                             "max_sequential_ms"}):
            ax.axvline(value, color="grey", ls=":", lw=1, gid=LIMIT_GID)
        frame(ax, [r for r in mine if r.limits_met and r.cost is not None])
        ax.set_xlabel("sequential time (ms)")
        ax.set_ylabel("cost")
        ax.set_title(f"{bucket}: {here[0].sweep_limit} swept, K={k}")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    return save(fig, path)
