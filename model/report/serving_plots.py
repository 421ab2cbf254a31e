"""The replay's pictures: what the server did over time, and what the requests saw.

``timeline.png`` draws the first replica's running requests and the graph each step
ran (decode graph: KV blocks or bucket length; prompt graph: query length) against the
clock, so a burst that queues, a decode graph that keeps missing or a prompt padded far
beyond its length shows where it happened.  ``latency.png`` draws the TTFT and TPOT
distributions of every request (cumulative, log-scaled time) with p50/p95/p99 marked.
Rendered to bytes (matplotlib's object API on Agg, no pyplot) so the command line writes
them with its other outputs, all together or none.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING

import numpy as np

from model.base.axes import plain_log_axis
from model.evaluation.replay import StepRuns
from model.evaluation.replay_metrics import Quantiles, ReplaySummary, request_metrics
from model.evaluation.replay_run import ReplayResult

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

DPI = 100
REPORT_FILES = ("timeline.png", "latency.png")
MAX_POINTS = 20_000  # runs drawn per line: beyond this a line is a smear, and the PNG grows for nothing


def _figure(rows: int):
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # only when a report is asked for (slow import)
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 3.2 * rows), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.subplots(rows, 1, squeeze=False)[:, 0]


def _png(fig: Figure) -> bytes:
    """The PNG without the matplotlib version in its metadata, so the bytes depend on the data only."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    return buf.getvalue()


def _thin(runs: StepRuns) -> np.ndarray:
    """Indices of at most MAX_POINTS runs, evenly spread (every run when there are few)."""
    count = runs.start_ms.shape[0]
    return np.arange(count) if count <= MAX_POINTS else np.linspace(0, count - 1, MAX_POINTS).astype(np.int64)


def _busy_line(runs: StepRuns, keep: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(seconds, requests decoding) at each kept run's start, and 0 from the end of a run followed by idle time."""
    start = runs.start_ms[keep]
    end = start + runs.count[keep] * runs.duration_ms[keep]
    idle = np.append(start[1:] > end[:-1] * (1 + 1e-12), True)
    times = np.concatenate([start, end[idle]])
    values = np.concatenate([runs.decode_n[keep], np.zeros(int(idle.sum()), dtype=np.int64)])
    order = np.argsort(times, kind="stable")
    return times[order] / 1000.0, values[order]


def timeline_figure(runs: StepRuns, stack: str, replicas: int) -> Figure:
    """Running requests (top) and the graphs the steps ran (bottom) over time, in seconds."""
    fig, (top, bottom) = _figure(2)
    keep = _thin(runs)
    t = runs.start_ms[keep] / 1000.0
    top.step(*_busy_line(runs, keep), where="post", lw=0.8, gid="running")
    top.set(ylabel="requests decoding (requests)",
            title=f"replica 0 of {replicas}" if replicas > 1 else "the replica")
    decode = runs.decode_x[keep] > 0
    prompt = runs.prompt_x[keep] > 0
    unit = "KV blocks" if stack == "gaudi" else "tokens, bucket length"
    bottom.scatter(t[decode], runs.decode_x[keep][decode], s=4, marker="o", label=f"decode graph ({unit})",
                   gid="decode")
    bottom.scatter(t[prompt], runs.prompt_x[keep][prompt], s=6, marker="^", label="prompt graph (tokens, query "
                   "length)", gid="prompt")
    compiled = runs.compiles[keep] > 0
    if compiled.any():
        for x in t[compiled]:
            bottom.axvline(x, color="red", lw=0.6, alpha=0.6)
        bottom.plot([], [], color="red", lw=0.6, label="run-time compile")
    sizes = np.concatenate([runs.decode_x[keep][decode], runs.prompt_x[keep][prompt]])
    what = "KV blocks or tokens" if stack == "gaudi" else "tokens"
    bottom.set(xlabel="time since the first arrival (s)", ylabel=f"graph size ({what}, log scale)", yscale="log")
    if sizes.size:
        plain_log_axis(bottom.yaxis, float(sizes.min()) / 1.2, float(sizes.max()) * 1.2, most=11)
        bottom.set_ylim(float(sizes.min()) / 1.2, float(sizes.max()) * 1.2)
    bottom.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncols=3, frameon=False)
    return fig


QUANTILE_STYLES = (("p50", ":"), ("p95", "--"), ("p99", "-."))


def _cdf(ax: Axes, values: np.ndarray, q: Quantiles, name: str, slo: float | None = None) -> None:
    """The cumulative distribution of one metric, its quantiles marked, and the SLO when one was given."""
    if values.size == 0:
        ax.set(title=f"{name}: no values")
        return
    ordered = np.sort(values)
    share = np.arange(1, ordered.size + 1) / ordered.size
    keep = np.unique(np.linspace(0, ordered.size - 1, min(ordered.size, MAX_POINTS)).astype(np.int64))
    ax.step(np.maximum(ordered[keep], 1e-3), share[keep], where="post", gid=name, lw=1.6,
            label=f"{name} of {ordered.size} requests")
    for (label, ls), value in zip(QUANTILE_STYLES, (q.p50, q.p95, q.p99), strict=True):
        if value is not None:
            ax.axvline(max(value, 1e-3), color="0.35", ls=ls, lw=1, label=f"{label} {value:.4g} ms")
    if slo is not None:
        met = float((values <= slo).mean())
        ax.axvline(slo, color="red", lw=1.6, gid=f"slo-{name}", label=f"SLO {slo:g} ms: {met:.1%} of requests within")
    lo = max(float(ordered[0]), 1e-3)
    hi = max(float(ordered[-1]), lo * 1.01, slo or 0.0)
    ax.set(xscale="log", xlabel=f"{name} (ms, log scale)", ylabel="share of requests", ylim=(0, 1.01),
           xlim=(lo / 1.15, hi * 1.15))
    plain_log_axis(ax.xaxis, lo / 1.15, hi * 1.15, twos=False)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)


def latency_figure(result: ReplayResult, summary: ReplaySummary) -> Figure:
    """TTFT and TPOT distributions (cumulative) over every request of every replica."""
    ttft, tpot, _ = request_metrics(result)
    fig, (left, right) = _figure(2)
    slo = summary.slo.slo if summary.slo is not None else None
    _cdf(left, ttft, summary.ttft, "TTFT", slo.ttft_ms if slo is not None else None)
    _cdf(right, tpot, summary.tpot, "TPOT", slo.tpot_ms if slo is not None else None)
    return fig


def report_files(result: ReplayResult, summary: ReplaySummary) -> dict[str, bytes]:
    """File name -> PNG bytes (the replay must have recorded its steps)."""
    runs = result.replicas[0].runs
    if runs is None:
        raise ValueError("the replay ran without recording its steps")
    timeline, latency = REPORT_FILES
    return {timeline: _png(timeline_figure(runs, summary.stack, summary.replicas)),
            latency: _png(latency_figure(result, summary))}
