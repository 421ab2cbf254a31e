"""Pictures of a sweep: cost against K with the bound band, the cost breakdown and the limit trade-off.

Drawn like every picture of the project (``model.report.plots``: matplotlib's object API on the
Agg canvas, one Figure per function, saved as PNG -- unless the path is None -- and returned so a test can
read back what was drawn); artists that tests look for carry a ``gid``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from model.report.plots import new_figure, save
from model.sweeping.grid import SweepPoint, base_factor
from model.sweeping.runner import MIP, SweepRow
from model.sweeping.table import PlannerTotal

if TYPE_CHECKING:
    from matplotlib.figure import Figure

BAND_GID = "mip-bound-band"
BROKEN_GID = "limits-broken"
LIMIT_GID = "limit"
COMPONENTS = (("overhead_cost", "overhead"), ("compile_cost", "compile"), ("prefill_cost", "prefill"),
              ("decode_cost", "decode"))
BAR_CLIP = 3.0  # bars and lines above this many times the MIP's (or cheapest) cost are cut off


def planners_of(totals: Sequence[PlannerTotal]) -> list[str]:
    """Planner names in first-appearance order (the order the sweep ran them: MIP first)."""
    return list(dict.fromkeys(t.planner for t in totals))


def mark_broken(ax, xs: Sequence[float], ys: Sequence[float]) -> None:
    """Red crosses over points whose plan breaks a limit, so a cheap but unusable plan is never read as a win."""
    if len(xs):
        ax.scatter(xs, ys, marker="x", s=60, color="red", zorder=5, gid=BROKEN_GID, label="breaks a limit")


def plot_cost_vs_k(totals: Sequence[PlannerTotal], path: Path | None, factor: float | None = None) -> Figure:
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
    return saved(fig, path)


def saved(fig: Figure, path: Path | None) -> Figure:
    """The figure, saved as PNG at ``path`` first when one is given (None: a writer that puts every file of a
    report down together takes its bytes instead)."""
    return fig if path is None else save(fig, path)


def chart_top(here: Sequence[PlannerTotal]) -> float | None:
    """Upper y limit: ``BAR_CLIP`` times the dearest MIP cost, so rules 40x dearer do not flatten the close ones."""
    mip = [t.cost for t in here if t.planner == MIP and t.cost is not None]
    return BAR_CLIP * max(mip) if mip else None


def plot_breakdown(totals: Sequence[PlannerTotal], point: SweepPoint, path: Path | None) -> Figure:
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
    return saved(fig, path)


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


def plot_tradeoff(rows: Sequence[SweepRow], k: int, path: Path | None) -> Figure:
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
    return saved(fig, path)
