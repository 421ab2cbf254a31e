"""Pictures, drawn with matplotlib's object API on the Agg canvas (no display, no pyplot state).

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

from model.base.axes import legend_below, plain_log_axis
from model.domain.schema import Batching, Problem
from model.histogram.cells import Histogram

if TYPE_CHECKING:
    from matplotlib.figure import Figure

DPI = 100
SHAPE_GID = "shape"
GEN_GID = "gen-boundary"
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


def gen_edges(gmin: int, gmax: int, n: int = 40) -> np.ndarray:
    """Log-spaced integer bin edges over gmin..gmax: generations are long-tailed, so linear bins hide the short ones."""
    return np.unique(np.round(np.geomspace(gmin, gmax + 1, n)).astype(np.int64)).astype(np.float64)


def prompt_edges(smax: int, n: int = 60, grain: int = 64) -> np.ndarray:
    """Log-spaced bin edges over the aligned prompt lengths 64..smax, each edge halfway between two multiples of
    ``grain`` (so every aligned length falls inside one bin): traffic sits at a few thousand tokens with a tail
    to 16k, and linear bins would squeeze the bulk into the left tenth of the picture."""
    steps = np.unique(np.round(np.geomspace(1, smax / grain + 1, n)).astype(np.int64))
    return (grain * steps - grain / 2).astype(np.float64)


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
                   shape_sets: Sequence[tuple] = ()) -> Figure:
    """The heatmap of ``plot_heatmap`` as a Figure; each of ``shape_sets`` -- (label, shapes) or (label, shapes,
    shapes its plan uses) -- is drawn as vertical lines in its own colour and style, labelled in the legend (gid
    ``shape-set-<i>``), so two shape sets -- today's and an optimised one -- can be read against the same traffic.

    The prompt axis is logarithmic (the bulk of the traffic sits far below the longest prompt) with plain tick
    numbers, and reaches the longest shape drawn; the legend sits under the panel, off the data."""
    n = len(hists)
    fig = new_figure(6.8 * n, 5.6)
    axes = fig.subplots(1, n, squeeze=False)[0]
    longest = max((int(max(set_[1])) for set_ in shape_sets if len(set_[1])), default=0)
    for b, (ax, hist) in enumerate(zip(axes, hists, strict=True)):
        xedges = prompt_edges(int(hist.S.max()))
        yedges = gen_edges(int(hist.G.min()), int(hist.G.max()))
        counts, _, _ = np.histogram2d(hist.S, hist.G, bins=(xedges, yedges), weights=hist.count)
        mesh = ax.pcolormesh(xedges, yedges, np.ma.masked_equal(counts.T, 0), cmap="viridis",
                             norm=log_norm(vmin=1, vmax=max(1.0, counts.max())))
        bar = fig.colorbar(mesh, ax=ax, label="requests per cell (log scale)")
        plain_log_axis(bar.ax.yaxis, 1.0, max(1.0, float(counts.max())), twos=False)
        shown_shapes = [int(s) for s in np.unique(batchings[b].shape_of)] if batchings is not None else []
        right = float(min(max(xedges[-1], 1.08 * max([longest, *shown_shapes, 0])), 4 * xedges[-1]))
        if batchings is not None:
            draw_plan(ax, problem, b, batchings[b])
        draw_shape_sets(ax, shape_sets, right)
        ax.set_xscale("log")
        ax.set_xlim(xedges[0], right)
        plain_log_axis(ax.xaxis, xedges[0], right, most=10)
        ax.set_yscale("log")
        ax.set_ylim(max(1.0, yedges[0]), yedges[-1])
        plain_log_axis(ax.yaxis, max(1.0, yedges[0]), yedges[-1])
        ax.set_xlabel("aligned prompt length (tokens, log scale)")
        ax.set_ylabel("gen_len (tokens, log scale)")
        ax.set_title(f"{hist.name}: {hist.n_requests} requests, {len(hist)} cells")
        legend_below(ax, columns=1, fontsize=8)
    return fig


def set_label(label: str, shapes: Sequence[int], used: Sequence[int] | None, beyond: Sequence[int]) -> str:
    """A shape set's legend entry: how many shapes it compiles, how many its plan uses, any not drawn."""
    text = f"{label}: {len(shapes)} shape{'s' if len(shapes) != 1 else ''}"
    if used is not None and set(used) != set(shapes):
        text += f", {len(set(used) & set(shapes))} used by its plan (unused: thin)"
    return text + (f"; beyond the chart: {', '.join(map(str, beyond))}" if beyond else "")


def draw_shape_sets(ax, shape_sets: Sequence[tuple], right: float) -> None:
    """Each labelled shape set as vertical lines (one style per set; a shape its plan does not use is drawn
    thin); shapes beyond the chart are pinned to the right edge and named in the label, so a set's long tail
    is not silently cut off."""
    for i, entry in enumerate(shape_sets):
        label, shapes = entry[0], sorted({int(s) for s in entry[1]})
        used = None if len(entry) < 3 or entry[2] is None else {int(s) for s in entry[2]}
        colour, style, width = SET_STYLES[i % len(SET_STYLES)]
        beyond = [s for s in shapes if s > right]
        text = set_label(label, shapes, used, beyond)
        for j, s in enumerate(s for s in shapes if s <= right):
            thin = used is not None and s not in used
            ax.axvline(float(s), color=colour, ls=style, lw=0.8 if thin else width, alpha=0.6 if thin else 1.0,
                       gid=f"shape-set-{i}", label=text if j == 0 else None)
        if len(beyond) == len(shapes):
            ax.axvline(right, color=colour, ls=style, lw=width, gid=f"shape-set-{i}", label=text)


def draw_plan(ax, problem: Problem, b: int, batching: Batching) -> None:
    """The chosen shapes as dashed lines and each batch's (S_max, G_max) corner as a cross."""
    bucket = problem.buckets[b]
    shapes = np.unique(batching.shape_of)
    for k, s in enumerate(shapes):
        ax.axvline(float(s), color="black", ls="--", lw=1.5, gid=SHAPE_GID,
                   label=f"compiled shapes ({len(shapes)})" if k == 0 else None)
    _, s_max, g_max = problem.cost.batch_extents(bucket.prompt_len, bucket.gen_len, batching.batch_of,
                                                  batching.shape_of)
    corners = np.unique(np.stack([s_max, g_max], axis=1), axis=0)
    ax.scatter(corners[:, 0], corners[:, 1], marker="+", s=40 if len(corners) < 200 else 12, color="red", gid=GEN_GID,
               label="batch box corner (S_max, G_max)")
