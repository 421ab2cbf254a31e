"""Devices needed, shown: tables for the terminal and the report, the devices-over-time picture, the CSV.

Library code (the command lines call it): it plans nothing and prints nothing.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from model import pipeline
from model.base.errors import InfeasibleError, NoPlanFound
from model.cost.device import device_hours
from model.domain.schema import Batching, Problem
from model.report.devices import DeviceUse, device_use
from model.report.document import Block, Heading, Image, Paragraph, Table, to_html, to_markdown
from model.report.plots import new_figure, png_bytes
from model.report.tables import fmt

if TYPE_CHECKING:
    from matplotlib.figure import Figure

LINE_GID = "devices-"  # + planner: one line per planner
PEAK_GID = "peak-"  # + planner: its peak marked


def opens(seconds: float) -> str:
    """A window's opening time: a UTC clock time for epoch seconds, else seconds."""
    if 1e8 <= seconds < 1e11:
        return pd.Timestamp(seconds, unit="s", tz="UTC").strftime("%Y-%m-%d %H:%M:%S")
    return f"{seconds:g} s"


def pct(value: float) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.1%}"


def summary_table(uses: Sequence[DeviceUse]) -> Table:
    """Per planner (pooled over buckets, then each bucket): work, peak and mean devices, utilisation."""
    rows = []
    for use in uses:
        for b in [None, *range(len(use.buckets))] if len(use.buckets) > 1 else [None]:
            ms = use.total_ms if b is None else use.device_ms[b]
            w = use.peak_window(b)
            rows.append((use.planner, "all (pooled)" if b is None else use.buckets[b],
                         f"{float(device_hours(ms.sum())):.4g}", str(use.peak(b)),
                         f"{w} ({opens(use.window_start_s(w))})", f"{use.mean(b):.2f}",
                         pct(use.mean_utilisation(b))))
    return Table(("planner", "bucket", "work device-hours", "peak devices", "peak window (opens)", "mean devices",
                  "utilisation"), tuple(rows))


def shapes_table(uses: Sequence[DeviceUse]) -> Table:
    """The shapes each planner's plan compiles: what the devices above would run (the config to deploy)."""
    return Table(("planner", "shapes", "shape list (tokens)"),
                 tuple((use.planner, str(len(use.shapes)), " ".join(map(str, use.shapes)) or "-") for use in uses))


def window_table(uses: Sequence[DeviceUse]) -> Table:
    """Every window holding requests with its pooled device-ms, devices needed and utilisation, planners side by
    side (the others need no device)."""
    head = ["window", "opens"]
    for use in uses:
        head += [f"{use.planner} device-ms", f"{use.planner} devices", f"{use.planner} util"]
    rows = []
    first = uses[0]  # every planner's plan of one problem: the same windows hold requests
    for i, w in enumerate(first.windows.tolist()):
        cells = [str(w), opens(first.window_start_s(w))]
        for use in uses:
            ms, d = use.total_ms[i], int(use.total_devices[i])
            cells += [fmt(float(ms)), str(d), pct(ms / (d * use.window_ms)) if d else "-"]
        rows.append(tuple(cells))
    return Table(tuple(head), tuple(rows))


def explain(uses: Sequence[DeviceUse]) -> Paragraph:
    """How devices needed are counted."""
    w = uses[0].window_s
    return Paragraph(f"Each {w:g} s window's batches start when it closes and must finish within the next {w:g} s "
                     "to keep up, so a window needs ceil(its device-ms / window ms) devices; utilisation is its "
                     "device-ms over the devices' time. Device-ms are prefill + decode + overhead of its batches "
                     "(compiles are one-off and left out); buckets share the compiled shapes and are pooled. Peak and "
                     "mean run over every window from the first arrival to the last, empty ones included.",
                     lead="Devices needed: ")


LINE_STYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "D")


def devices_figure(uses: Sequence[DeviceUse]) -> Figure:
    """Devices needed over time, one step line per planner, each planner's peak marked.

    Planners often need the same devices in a window, so their step lines coincide: the first planner (the
    chosen one) is drawn last, on top, thin and solid; the others beneath it wider and dashed or dotted, so
    where they agree every line still shows.  The legend sits under the picture, off the data."""
    fig = new_figure(9, 5)
    ax = fig.add_subplot()
    count = len(uses)
    for i, use in reversed(list(enumerate(uses))):
        edges, d = use.steps(use.total_devices)  # empty windows step down to 0, without a point each
        minutes = edges * use.window_s / 60.0
        (line,) = ax.step(minutes, d, where="post", ls=LINE_STYLES[i % len(LINE_STYLES)], color=f"C{i % 10}",
                          lw=1.4 + 1.4 * (count - 1 - i) if i else 1.4, zorder=3 + count - i,
                          label=f"{use.planner} (peak {use.peak()}, mean {use.mean():.2f}, {len(use.shapes)} shapes)",
                          gid=LINE_GID + use.planner)
        at, peak = use.peak_window() * use.window_s / 60.0, use.peak()
        ax.scatter([at], [peak], marker=MARKERS[i % len(MARKERS)], s=60, color=line.get_color(), zorder=10,
                   gid=PEAK_GID + use.planner)
        ax.annotate(f"{use.planner} peak {peak}", (at, peak), textcoords="offset points", xytext=(4, 4 + 9 * i),
                    fontsize=8, color=line.get_color())
    first = uses[0]
    ax.set_xlabel(f"minutes since the first arrival ({opens(first.origin_s)}); windows of {first.window_s:g} s")
    ax.set_ylabel("devices needed (devices)")
    top = max(use.peak() for use in uses)
    ax.set_ylim(0, top + max(1, 0.15 * top))
    ax.set_title("Devices needed per window")
    ax.grid(alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()  # drawn last to first: list them first to last
    ax.legend(handles[::-1], labels[::-1], loc="upper center", bbox_to_anchor=(0.5, -0.14), ncols=len(uses),
              fontsize=8, frameon=False)
    return fig


def devices_csv(uses: Sequence[DeviceUse]) -> bytes:
    """The tidy per-window table: one row per planner, window holding requests and bucket ("*" = pooled)."""
    buf = io.StringIO()
    out = csv.writer(buf, lineterminator="\n")
    out.writerow(["planner", "window", "opens_s", "bucket", "device_ms", "devices", "utilisation"])
    for use in uses:
        for i, w in enumerate(use.windows.tolist()):  # the windows holding requests: the others need none
            for b, name in [*enumerate(use.buckets), (None, "*")]:
                ms = float(use.total_ms[i] if b is None else use.device_ms[b, i])
                d = int(use.total_devices[i] if b is None else use.devices[b, i])
                util = ms / (d * use.window_ms) if d else None
                out.writerow([use.planner, w, repr(use.window_start_s(w)), name, repr(ms), d,
                              "" if util is None else repr(util)])
    return buf.getvalue().encode("utf-8")


def device_blocks(uses: Sequence[DeviceUse]) -> list[Block]:
    """The terminal's devices section: the summary and how it is counted."""
    return [Heading(f"Devices needed (windows of {uses[0].window_s:g} s)"), summary_table(uses), explain(uses)]


DEVICE_REPORT_FILES = ("report.md", "report.html", "devices.png", "devices.csv")


def devices_report(folder: Path, uses: Sequence[DeviceUse], title: str, lead: Sequence[Block] = ()
                   ) -> dict[Path, bytes]:
    """report.md, report.html, devices.png and devices.csv for ``folder`` as bytes, in that order: the command
    writes them together with the plans they describe (all of them or none)."""
    png = folder / "devices.png"
    image = Image(png, "Devices needed per window, one line per planner (the chosen one solid, on top); a marker "
                       "shows each planner's peak.", png_bytes(devices_figure(uses)))
    blocks = [Heading(title, 1), *lead, *device_blocks(uses), Heading("Chosen shapes"), shapes_table(uses), image,
              Heading("Every window"), window_table(uses)]
    return {folder / "report.md": to_markdown(blocks, folder).encode("utf-8"),
            folder / "report.html": to_html(blocks, title).encode("utf-8"),
            png: image.data, folder / "devices.csv": devices_csv(uses)}


COMPARED = ("dpfill", "pow2")  # the planners whose devices sit beside the chosen planner's


def device_comparison(problem: Problem, planner: str, batchings: Sequence[Batching]
                      ) -> tuple[list[DeviceUse], list[str]]:
    """The chosen planner's device use beside dpfill's and pow2's on the same windows (a planner that cannot
    plan is left out and said)."""
    uses = [device_use(problem, batchings, planner)]
    missing = []
    for name in COMPARED:
        if name == planner:
            continue
        try:
            run = pipeline.run(problem, name)
        except (InfeasibleError, NoPlanFound) as exc:  # a packer's rule with no plan: left out and said
            missing.append(f"{name}: {exc}")
            continue
        uses.append(device_use(problem, run.planned.batchings, name))
    return uses, missing
