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

from model.base.axes import legend_below, plain_log_axis
from model.report.plots import new_figure, save
from model.sweeping.grid import SweepPoint, base_factor
from model.sweeping.runner import MIP, SweepRow
from model.sweeping.table import PlannerTotal

if TYPE_CHECKING:
    from matplotlib.figure import Figure

BAND_GID = "mip-bound-band"
BROKEN_GID = "limits-broken"
LIMIT_GID = "limit"
RECOMMENDED_GID = "recommended-k"
COMPONENTS = (("overhead_cost", "overhead"), ("compile_cost", "compile"), ("prefill_cost", "prefill"),
              ("decode_cost", "decode"))
BAR_CLIP = 3.0  # bars above this many times the cheapest cost are cut off


def planners_of(totals: Sequence[PlannerTotal]) -> list[str]:
    """Planner names in first-appearance order (the order the sweep ran them: MIP first)."""
    return list(dict.fromkeys(t.planner for t in totals))


def mark_broken(ax, xs: Sequence[float], ys: Sequence[float]) -> None:
    """Red crosses over points whose plan breaks a limit, so a cheap but unusable plan is never read as a win."""
    if len(xs):
        ax.scatter(xs, ys, marker="x", s=60, color="red", zorder=5, gid=BROKEN_GID, label="breaks a limit")


MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">")
STYLES = ("-", "--", "-.", ":")
NEAR = 1.6  # a planner "matters" to the y-range when it comes within this many times the MIP's cost at some K


def cost_unit(device: bool) -> tuple[float, str]:
    """(factor, label) for cost axes: device-ms shown as device-hours, the reference model's unitless cost as is."""
    return (1 / 3_600_000.0, "device-hours") if device else (1.0, "reference-model cost units")


def style(i: int, planner: str) -> dict:
    """One planner's line: the MIP thick and on top, every other its own marker and dash."""
    if planner == MIP:
        return {"marker": "o", "ms": 6, "lw": 2.6, "ls": "-", "zorder": 6, "color": "C0"}
    return {"marker": MARKERS[i % len(MARKERS)], "ms": 5, "lw": 1.3, "ls": STYLES[i % len(STYLES)],
            "zorder": 3, "color": f"C{1 + (i % 9)}"}


def mattering(here: Sequence[PlannerTotal], at_k: int) -> set[str]:
    """The planners that set the zoomed frame: the MIP, and every planner within ``NEAR`` times the MIP's cost at
    ``at_k`` (the recommended K): a rule 3x dearer there would flatten the ones a planner chooses between."""
    mip = next((t.cost for t in here if t.planner == MIP and t.point.k == at_k and t.cost), None)
    if mip is None:
        return {t.planner for t in here}
    return {MIP} | {t.planner for t in here if t.point.k == at_k and t.cost is not None and t.cost <= NEAR * mip}


def zoom_top(here: Sequence[PlannerTotal], keep: set[str], at_k: int, best: float) -> float:
    """The zoomed panel's top (% above the best): the dearest planner that matters from K = at_k / 2 on, at
    least 5 %, so the small differences between the large K are what the panel shows."""
    values = [100 * (t.cost / best - 1) for t in here
              if t.planner in keep and t.cost is not None and t.point.k >= max(1, at_k // 2)]
    return max([5.0, *values])


def plot_cost_vs_k(totals: Sequence[PlannerTotal], path: Path | None, factor: float | None = None,
                   device: bool = False, recommended: int | None = None) -> Figure:
    """Total cost against the shape cap (left, log scale: the whole range) and, zoomed, the same as a share above
    the cheapest plan of the sweep (right, linear: K = 8 against 16 shows as the difference it is), one line
    per planner (own marker and dash, the MIP thick and on top), the MIP's bound-to-cost band shaded, the
    recommended K marked.

    The band is where the true optimum lies: a narrow band means the MIP's curve is the real cost of each K, not
    an artefact of a time limit.  The zoom is framed by the planners that matter (``mattering``) from half the
    recommended K on; a planner above the zoom is named in the legend.
    """
    factor = base_factor(t.point for t in totals) if factor is None else factor
    here = [t for t in totals if t.point.factor == factor]
    ks = sorted({t.point.k for t in here})
    scale, unit = cost_unit(device)
    fig = new_figure(12, 5.4)
    ax, rel = fig.subplots(1, 2)
    at_k = recommended if recommended in ks else (ks[-1] if ks else 0)
    keep = mattering(here, at_k)
    best = min((t.cost for t in here if t.cost is not None and t.limits_met), default=None)
    top = zoom_top(here, keep, at_k, best) if best else None
    broken_x, broken_y, broken_r = [], [], []
    for i, planner in enumerate(planners_of(here)):
        by_k = {t.point.k: t for t in here if t.planner == planner}
        costs = [by_k[k].cost if k in by_k and by_k[k].cost is not None else np.nan for k in ks]
        ys = [c * scale for c in costs]
        kw = style(i, planner)
        note = "" if planner in keep else f" (above the zoom: over {NEAR:g}x the MIP at K = {at_k})"
        ax.plot(ks, ys, label=planner + note, **kw)
        if best:
            rel.plot(ks, [100 * (c / best - 1) for c in costs], **kw)
        bad = [k for k in ks if k in by_k and by_k[k].cost is not None and not by_k[k].limits_met]
        broken_x += bad
        broken_y += [by_k[k].cost * scale for k in bad]
        broken_r += [100 * (by_k[k].cost / best - 1) if best else np.nan for k in bad]
        if planner == MIP:
            lo = [by_k[k].bound if k in by_k and by_k[k].bound is not None else np.nan for k in ks]
            ax.fill_between(ks, [v * scale for v in lo], ys, alpha=0.25, color="C0", gid=BAND_GID,
                            label="MIP lower bound to MIP cost", zorder=1)
            if best:
                rel.fill_between(ks, [100 * (v / best - 1) for v in lo], [100 * (c / best - 1) for c in costs],
                                 alpha=0.25, color="C0", zorder=1)
    mark_broken(ax, broken_x, broken_y)
    if best:
        mark_broken(rel, broken_x, broken_r)
    low = min((t.bound if t.bound is not None else t.cost for t in here if t.cost is not None), default=None)
    high = max((t.cost for t in here if t.cost is not None), default=None)
    if low is not None and high is not None and low > 0:  # all-zero coefficients: keep a linear axis then
        ax.set_yscale("log")
        ax.set_ylim(low * scale / 1.08, high * scale * 1.08)
        plain_log_axis(ax.yaxis, low * scale / 1.08, high * scale * 1.08, twos=False)
    if top is not None and best:
        bottom = min([0.0, *(100 * (t.bound / best - 1) for t in here if t.bound is not None and t.planner == MIP
                             and t.point.k >= max(1, at_k // 2))])
        rel.set_ylim(bottom - 0.06 * (top - bottom), top * 1.1)
    for a in (ax, rel):
        a.set_xticks(ks)
        a.set_xlabel("shape cap K (distinct compiled shapes, across all buckets)")
        a.grid(True, alpha=0.3)
        if recommended is not None and recommended in ks:
            a.axvline(recommended, color="green", lw=1.5, ls=(0, (6, 3)), zorder=0, gid=RECOMMENDED_GID)
            a.annotate(f"recommended K = {recommended}", (recommended, 1), xycoords=("data", "axes fraction"),
                       xytext=(4, -12), textcoords="offset points", fontsize=8, color="green")
    ax.set_ylabel(f"total cost, all buckets ({unit}, log scale)")
    rel.set_ylabel("above the cheapest plan of the sweep (%)")
    rel.axhline(0, color="0.4", lw=0.8)
    where = f", {here[0].point.limit} x{factor:g}" if here and here[0].point.limit else ""
    ax.set_title(f"Cost vs shape cap{where}")
    rel.set_title("Zoomed: what each K costs over the cheapest plan")
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=min(3, len(handles)), fontsize=8, frameon=False)
    return saved(fig, path)


def saved(fig: Figure, path: Path | None) -> Figure:
    """The figure, saved as PNG at ``path`` first when one is given (None: a writer that puts every file of a
    report down together takes its bytes instead)."""
    return fig if path is None else save(fig, path)


def plot_breakdown(totals: Sequence[PlannerTotal], point: SweepPoint, path: Path | None,
                   device: bool = False) -> Figure:
    """Stacked bars of overhead, compile, prefill and decode cost per planner at one point, in device-hours in
    device mode (the reference model's cost units otherwise), with plain tick numbers (no offset or exponent).

    Shows where each rule loses: baseline on decode (padding to the longest generation), solo on overhead (a
    batch per request).  Bars far taller than the cheapest are cut at ``BAR_CLIP`` times it and labelled with
    their total, so the close ones stay readable; each bar carries its total above it.
    """
    from model.base.axes import plain_number

    scale, unit = cost_unit(device)
    here = [t for t in totals if t.point == point and t.cost is not None]
    fig = new_figure(max(6.5, 1.1 * len(here) + 2.5), 5.2)
    ax = fig.add_subplot()
    xs = np.arange(len(here))
    bottom = np.zeros(len(here))
    for attr, label in COMPONENTS:
        heights = np.array([(getattr(t, attr) or 0.0) * scale for t in here], dtype=np.float64)
        ax.bar(xs, heights, bottom=bottom, label=label, width=0.7)
        bottom += heights
    if here:
        top = BAR_CLIP * min(t.cost for t in here) * scale
        clipped = bottom.max() > top
        if clipped:
            ax.set_ylim(0, top * 1.08)
        for x, t in zip(xs, here, strict=True):
            total = t.cost * scale
            at = min(total, top)
            ax.text(x, at * 1.01 if total <= top else top * 1.005, plain_number(total) + (" (cut)" if total > top
                    else ""), ha="center", va="bottom" if total <= top else "top", fontsize=8,
                    rotation=0 if total <= top else 90)
    plain_axes(ax)
    ax.set_xticks(xs, [t.planner + ("" if t.limits_met else "\n(breaks limits)") for t in here], fontsize=8)
    ax.set_ylabel(f"total cost, all buckets ({unit})")
    ax.set_title(f"Cost breakdown at {point.label()}")
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(handles[::-1], labels[::-1], loc="outside right upper", fontsize=8, frameon=False)
    return saved(fig, path)


def plain_axes(ax) -> None:
    """Plain tick numbers on both linear axes (2.42e8 as 242M), never matplotlib's detached "1e8" offset."""
    from matplotlib.ticker import FuncFormatter

    from model.base.axes import plain_number

    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(FuncFormatter(lambda v, _pos: plain_number(v)))


def frame(ax, rows: Sequence[SweepRow], scale: float = 1.0) -> None:
    """Zoom onto the plans that meet their limits (5% margin): rules that break them sit far away and would
    flatten the frontier the picture is about."""
    if not rows:
        return
    xs = [r.sequential_ms for r in rows]
    ys = [r.cost * scale for r in rows]
    dx = (max(xs) - min(xs)) * 0.05 or max(xs) * 0.02
    dy = (max(ys) - min(ys)) * 0.05 or max(ys) * 0.02
    ax.set_xlim(min(xs) - dx, max(xs) + dx)
    ax.set_ylim(min(ys) - dy, max(ys) + dy)


def plot_tradeoff(rows: Sequence[SweepRow], k: int, path: Path | None, device: bool = False) -> Figure:
    """Sequential time against cost along the limit sweep at one K, a panel per bucket, a line per planner.

    The MIP's line is the price of each millisecond of sequential-time budget; its
    points are labelled with the limit factor that produced them, and dotted
    vertical lines mark the sequential-time limits when that is the swept limit
    (a MIP point on its line means the limit binds).  The view frames the plans
    that meet their limits.
    """
    scale, unit = cost_unit(device)
    here = [r for r in rows if r.k == k and r.sweep_limit]
    buckets = list(dict.fromkeys(r.bucket for r in here))
    fig = new_figure(6 * max(1, len(buckets)), 5)
    axes = fig.subplots(1, max(1, len(buckets)), squeeze=False)[0]
    for ax, bucket in zip(axes, buckets, strict=True):
        mine = [r for r in here if r.bucket == bucket]
        broken_x, broken_y = [], []
        for i, planner in enumerate(dict.fromkeys(r.planner for r in mine)):
            pts = sorted((r for r in mine if r.planner == planner), key=lambda r: r.factor)
            xs = [r.sequential_ms if r.sequential_ms is not None else np.nan for r in pts]
            ys = [r.cost * scale if r.cost is not None else np.nan for r in pts]
            ax.plot(xs, ys, label=planner, **style(i, planner))
            bad = [r for r in pts if r.cost is not None and not r.limits_met]
            broken_x += [r.sequential_ms for r in bad]
            broken_y += [r.cost * scale for r in bad]
            if planner == MIP:
                for r in pts:
                    if r.cost is not None:
                        ax.annotate(f"x{r.factor:g}", (r.sequential_ms, r.cost * scale), fontsize=7,
                                    textcoords="offset points", xytext=(4, 4))
        mark_broken(ax, broken_x, broken_y)
        for value in sorted({r.limit_value for r in mine if r.limit_value is not None and r.sweep_limit ==
                             "max_sequential_ms"}):
            ax.axvline(value, color="grey", ls=":", lw=1, gid=LIMIT_GID)
        frame(ax, [r for r in mine if r.limits_met and r.cost is not None], scale)
        ax.set_xlabel("sequential time (ms)")
        ax.set_ylabel(f"cost ({unit})")
        plain_axes(ax)
        ax.set_title(f"{bucket}: {here[0].sweep_limit} swept, K={k}")
        ax.grid(True, alpha=0.3)
        legend_below(ax, columns=3, fontsize=7)
    return saved(fig, path)
