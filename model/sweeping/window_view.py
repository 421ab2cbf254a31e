"""What a longer batching window buys: the sweep over window lengths as a table, a picture and a report."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from model.report.document import Block, Heading, Image, Paragraph, Table, to_html, to_markdown
from model.report.plots import new_figure, png_bytes
from model.report.tables import fmt
from model.sweeping.grid import base_factor
from model.sweeping.recommend import recommend
from model.sweeping.runner import MIP, SweepRow
from model.sweeping.sweep_plots import NEAR
from model.sweeping.sweep_report import k_table
from model.sweeping.table import csv_bytes, planner_totals

if TYPE_CHECKING:
    from matplotlib.figure import Figure

WINDOW_GID = "window-"  # + planner: one line per planner in the window-length picture


def at_k(rows: Sequence[SweepRow], tolerance: float) -> int | None:
    """The K a window length is summarised at: its recommended K, else the largest K swept."""
    rec = recommend(rows, tolerance)
    return rec.point.k if rec.point is not None else max((r.k for r in rows), default=None)


def summary_rows(by_window: dict[float, Sequence[SweepRow]], tolerance: float) -> list[tuple]:
    """(window s, K, planner, cost, worst P95, limits met, peak devices, mean devices) per window and planner, at
    each window length's K and the base limits."""
    out = []
    for window, rows in by_window.items():
        k = at_k(rows, tolerance)
        factor = base_factor(r.point for r in rows)
        here = [r for r in rows if r.k == k and r.factor == factor]
        for planner in dict.fromkeys(r.planner for r in here):
            mine = [r for r in here if r.planner == planner]
            p95 = [r.p95_latency_ms for r in mine if r.p95_latency_ms is not None]
            out.append((window, k, planner, mine[0].total_cost, max(p95) if p95 else None,
                        all(r.limits_met for r in mine), mine[0].total_peak_devices, mine[0].total_mean_devices))
    return out


def window_table(by_window: dict[float, Sequence[SweepRow]], tolerance: float) -> Table:
    """One row per window length and planner."""
    rows = [(f"{w:g}", str(k), planner, fmt(cost), fmt(p95), "yes" if met else "NO",
             "-" if peak is None else str(peak), "-" if mean is None else f"{mean:.2f}")
            for w, k, planner, cost, p95, met, peak, mean in summary_rows(by_window, tolerance)]
    return Table(("window s", "K", "planner", "cost", "worst P95 ms (incl. wait)", "limits met", "peak devices",
                  "mean devices"), tuple(rows))


def window_figure(by_window: dict[float, Sequence[SweepRow]], tolerance: float, device: bool = False) -> Figure:
    """Cost (left) and mean / peak devices needed (right) against the window length, one line per planner.

    Both panels are framed by the planners that matter -- the MIP and every planner within ``NEAR`` times its
    cost at some window length -- so a rule far dearer than the rest does not flatten the MIP and the packers it
    is compared with; a planner above the frame is named in the legend.  Lines have their own marker and dash,
    the MIP thick and on top; the legends sit under the panels."""
    from model.base.axes import legend_below
    from model.sweeping.sweep_plots import cost_unit, style

    scale, unit = cost_unit(device)
    data = summary_rows(by_window, tolerance)
    fig = new_figure(11, 5.2)
    cost_ax, dev_ax = fig.subplots(1, 2)
    mip = {r[0]: r[3] for r in data if r[2] == MIP and r[3] is not None}
    keep = {r[2] for r in data if r[3] is not None and (not mip or (r[0] in mip and r[3] <= NEAR * mip[r[0]]))}
    keep |= {MIP}
    framed = [r for r in data if r[2] in keep]
    for i, planner in enumerate(dict.fromkeys(r[2] for r in data)):
        mine = [r for r in data if r[2] == planner]
        xs = [r[0] for r in mine]
        kw = style(i, planner)
        note = "" if planner in keep else f" (above the frame: over {NEAR:g}x the MIP)"
        cost_ax.plot(xs, [np.nan if r[3] is None else r[3] * scale for r in mine], label=planner + note,
                     gid=WINDOW_GID + planner, **kw)
        if planner in keep and all(r[7] is not None for r in mine):  # the others would only crowd the devices
            dev_ax.plot(xs, [r[7] for r in mine], label=f"{planner} mean", **kw)
            dev_ax.plot(xs, [r[6] for r in mine], label=f"{planner} peak", **{**kw, "ls": ":", "lw": 1.0,
                                                                                 "marker": "^"})
    costs = [r[3] * scale for r in framed if r[3] is not None]
    if costs:
        pad = (max(costs) - min(costs)) * 0.08 or max(costs) * 0.05 or 1.0
        cost_ax.set_ylim(max(0.0, min(costs) - pad), max(costs) + pad)
    peaks = [r[6] for r in framed if r[6] is not None]
    if peaks:
        dev_ax.set_ylim(0, max(peaks) * 1.15 + 0.5)
    for ax in (cost_ax, dev_ax):
        ax.set_xscale("log")
        windows = sorted(by_window)
        ax.set_xticks(windows, [f"{w:g}" for w in windows])
        ax.minorticks_off()
        ax.set_xlabel("window length (s, log scale)")
        ax.grid(alpha=0.3)
        legend_below(ax, columns=2, fontsize=8)
    cost_ax.set_ylabel(f"total cost ({unit})")
    cost_ax.set_title("Cost against the batching window")
    dev_ax.set_ylabel("devices needed (devices)")
    dev_ax.set_title("Devices needed (mean; peak dotted)")
    return fig


def window_blocks(by_window: dict[float, Sequence[SweepRow]], tolerance: float) -> list[Block]:
    """The terminal's and the report's window-length section."""
    return [Heading("What a longer batching window buys"),
            Paragraph("each window length at its recommended K (the smallest within the tolerance of its cheapest); "
                      "P95 includes each member's wait to its window's end; devices needed per window pooled over "
                      "buckets (device mode).", lead="Window lengths: "),
            window_table(by_window, tolerance)]


def per_window_k_tables(by_window: dict[float, Sequence[SweepRow]]) -> list[Block]:
    """Each window length's K table."""
    out: list[Block] = []
    for w, rows in by_window.items():
        totals = planner_totals(rows)
        out += [Heading(f"Windows of {w:g} s", 3), k_table(totals, base_factor(t.point for t in totals))]
    return out


WINDOW_REPORT_FILES = ("report.md", "report.html", "windows.png")


def window_report(folder: Path, by_window: dict[float, Sequence[SweepRow]], tolerance: float, title: str,
                  csv_path: Path, device: bool = False) -> dict[Path, bytes]:
    """Every file of a sweep over window lengths -- the CSV, report.md, report.html and windows.png -- as bytes,
    for the command to write together (all of them or none)."""
    png = folder / "windows.png"
    image = Image(png, "Cost and devices needed against the window length, one line per planner; both panels are "
                       f"framed by the planners within {NEAR:g}x the MIP's cost; the devices panel draws only those.",
                  png_bytes(window_figure(by_window, tolerance, device)))
    blocks = [Heading(title, 1), *window_blocks(by_window, tolerance), image, *per_window_k_tables(by_window)]
    return {csv_path: csv_bytes([r for rows in by_window.values() for r in rows]),
            folder / "report.md": to_markdown(blocks, folder).encode("utf-8"),
            folder / "report.html": to_html(blocks, title).encode("utf-8"), png: image.data}
