"""Predicted against measured step times, one picture per phase (matplotlib object API on Agg, no pyplot).

A straight diagonal is a good fit; a bend at one end or a fan of points shows where
the three-coefficient line stops describing the device (for decode, often the batch
size where ``decode_large`` should take over).  Pictures are rendered to bytes so the
caller can write them atomically with the profile.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING

from model.base.axes import plain_log_axis
from model.calibration.fit import Calibration, PhaseFit

if TYPE_CHECKING:
    from matplotlib.figure import Figure

DPI = 100
DIAGONAL_GID = "measured-equals-predicted"
POINTS_GID = "rows"  # one scatter per fitted line, gid "rows:<phase>"


def phase_figure(fits: list[PhaseFit], title: str, split: int | None = None) -> Figure:
    """Log-log predicted vs measured (left) and relative error vs batch size (right), one colour and marker per
    line, plain tick numbers (ms, batch sizes), the legend under the panels; ``split`` (decode_large's first
    batch size) is marked on the right."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # on the first picture only (slow to import)
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 5), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    left, right = fig.subplots(1, 2)
    lo = min(float(min(f.measured.min(), f.predicted.min())) for f in fits)
    hi = max(float(max(f.measured.max(), f.predicted.max())) for f in fits)
    left.plot([lo, hi], [lo, hi], color="0.5", lw=1, ls="--", gid=DIAGONAL_GID, label="predicted = measured")
    for i, f in enumerate(fits):
        label = (f"{f.phase}: n {f.batch_sizes[0]}-{f.batch_sizes[1]}, {f.rows} rows, R² {f.r2:.4f}, "
                 f"mean {100 * f.mean_rel_error:.1f}% / max {100 * f.max_rel_error:.1f}%")
        marker = ("o", "^", "s")[i % 3]
        left.scatter(f.measured, f.predicted, s=12, alpha=0.6, marker=marker, gid=f"{POINTS_GID}:{f.phase}",
                     label=label)
        right.scatter(f.batch_size, 100 * (f.predicted - f.measured) / f.measured, s=12, alpha=0.6, marker=marker)
    left.set(xscale="log", yscale="log", xlabel="measured step time (ms, log scale)",
             ylabel="predicted step time (ms, log scale)")
    plain_log_axis(left.xaxis, lo, hi, twos=False)
    plain_log_axis(left.yaxis, lo, hi, twos=False)
    right.axhline(0, color="0.5", lw=1)
    sizes = [int(n) for f in fits for n in (f.batch_sizes[0], f.batch_sizes[1])]
    if split is not None:
        right.axvline(split, color="0.3", ls=":", lw=1.2, label=f"decode_large from batch size {split}")
        left.plot([], [], color="0.3", ls=":", lw=1.2, label=f"decode_large from batch size {split}")
    right.set(xscale="log", xlabel="batch size (log scale)", ylabel="relative error, predicted vs measured (%)")
    plain_log_axis(right.xaxis, min(sizes) / 1.3, max(sizes) * 1.3)
    right.set_xlim(min(sizes) / 1.3, max(sizes) * 1.3)
    handles, labels = left.get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=1, fontsize=8, frameon=False)
    fig.suptitle(title)
    return fig


def png_bytes(fig: Figure) -> bytes:
    """The PNG without the matplotlib version in its metadata, so the bytes depend on the data only."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    return buf.getvalue()


PLOTTED = ("prefill", "decode")
REPORT_FILES = tuple(f"{phase}.png" for phase in PLOTTED)  # what --report holds (checked before the fit)


def report_pngs(cal: Calibration) -> dict[str, bytes]:
    """File name -> PNG bytes: ``prefill.png`` and ``decode.png`` (decode_large drawn with decode)."""
    out = {}
    for phase in PLOTTED:
        fits = [f for f in cal.fits if f.phase.split("_")[0] == phase]
        split = "" if cal.profile.decode_large_from is None or phase == "prefill" else \
            f" (decode_large from batch size {cal.profile.decode_large_from})"
        at = cal.profile.decode_large_from if phase == "decode" else None
        out[f"{phase}.png"] = png_bytes(phase_figure(fits, f"{phase}: fitted step time vs measured{split}", at))
    return out

