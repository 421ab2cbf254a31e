"""Predicted against measured step times, one picture per phase (matplotlib object API on Agg, no pyplot).

A straight diagonal is a good fit; a bend at one end or a fan of points shows where
the three-coefficient line stops describing the device (for decode, often the batch
size where ``decode_large`` should take over).  Pictures are rendered to bytes so the
caller can write them atomically with the profile.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING

from model.calibration.fit import Calibration, PhaseFit

if TYPE_CHECKING:
    from matplotlib.figure import Figure

DPI = 100
DIAGONAL_GID = "measured-equals-predicted"
POINTS_GID = "rows"  # one scatter per fitted line, gid "rows:<phase>"


def phase_figure(fits: list[PhaseFit], title: str) -> Figure:
    """Log-log predicted vs measured (left) and relative error vs batch size (right), one colour per line."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # on the first picture only (slow to import)
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4.5), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    left, right = fig.subplots(1, 2)
    lo = min(float(min(f.measured.min(), f.predicted.min())) for f in fits)
    hi = max(float(max(f.measured.max(), f.predicted.max())) for f in fits)
    left.plot([lo, hi], [lo, hi], color="0.5", lw=1, ls="--", gid=DIAGONAL_GID, label="predicted = measured")
    for f in fits:
        label = (f"{f.phase}: n {f.batch_sizes[0]}-{f.batch_sizes[1]}, {f.rows} rows, R² {f.r2:.4f}, "
                 f"mean {100 * f.mean_rel_error:.1f}% / max {100 * f.max_rel_error:.1f}%")
        left.scatter(f.measured, f.predicted, s=6, alpha=0.5, gid=f"{POINTS_GID}:{f.phase}", label=label)
        right.scatter(f.batch_size, 100 * (f.predicted - f.measured) / f.measured, s=6, alpha=0.5)
    left.set(xscale="log", yscale="log", xlabel="measured (ms)", ylabel="predicted (ms)")
    left.legend(fontsize=7, loc="upper left")
    right.axhline(0, color="0.5", lw=1)
    right.set(xscale="log", xlabel="batch size", ylabel="relative error (%)")
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
        out[f"{phase}.png"] = png_bytes(phase_figure(fits, f"{phase}: fitted step time vs measured{split}"))
    return out

