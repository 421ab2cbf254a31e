"""Axis helpers every picture shares: log axes with plain numbers a reader can use, legends beside the data.

matplotlib labels a log axis ``2 x 10^1``, or only at powers of ten, so a decade of batch
sizes or lengths carries one readable tick; a planner reads 256, 1024, 4096.  These helpers
take an axis object (nothing is imported until a picture is drawn).
"""

from __future__ import annotations

import math

NICE = (1, 2, 5)
FINE = (1, 1.5, 2, 3, 4, 5, 6, 8)  # for a range of about a decade, where 1-2-5 leaves two ticks


def nice_ticks(lo: float, hi: float, most: int = 9, twos: bool = True) -> list[float]:
    """Tick positions over [lo, hi] on a log axis: powers of two (lengths, batch sizes; with ``twos``) when the
    range is short enough for at most ``most`` of them, else 1-2-5 steps, else powers of ten."""
    lo, hi = max(lo, 1e-12), max(hi, lo * (1 + 1e-9))
    powers = [2.0**k for k in range(math.floor(math.log2(lo)), math.ceil(math.log2(hi)) + 1)
              if max(lo, 1.0) <= 2.0**k <= hi]
    if twos and 3 <= len(powers) <= most:
        return powers
    decades = range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)
    for grid in (NICE, FINE):
        steps = [m * 10.0**d for d in decades for m in grid if lo <= m * 10.0**d <= hi]
        if 4 <= len(steps) <= most or (grid is FINE and 2 <= len(steps) <= most):
            return steps
    steps = [m * 10.0**d for d in decades for m in NICE if lo <= m * 10.0**d <= hi]
    if 2 <= len(steps) <= most:
        return steps
    tens = [10.0**d for d in decades if lo <= 10.0**d <= hi]
    return tens if len(tens) >= 2 else [10.0**d for d in decades]


def plain_number(value: float) -> str:
    """A tick label: 256, 16384, 0.5, 123.5k, 3.2M -- short (4 digits), exact for integers below 100,000."""
    if value == 0:
        return "0"
    if abs(value) < 1e5 and float(value).is_integer():
        return str(int(value))
    for threshold, divisor, suffix in ((1e9, 1e9, "G"), (1e6, 1e6, "M"), (1e5, 1e3, "k")):
        if abs(value) >= threshold:
            return f"{value / divisor:.4g}{suffix}"
    return f"{value:.4g}"


def plain_log_axis(axis, lo: float, hi: float, most: int = 9, twos: bool = True) -> None:
    """Put readable ticks on a log-scaled x or y ``axis`` (e.g. ``ax.xaxis``) spanning [lo, hi]; no minor ticks
    (decade minors between powers of two mislead, and laying them out was most of a heat map's drawing time)."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter, NullLocator

    axis.set_major_locator(FixedLocator(nice_ticks(lo, hi, most, twos)))
    axis.set_major_formatter(FuncFormatter(lambda v, _pos: plain_number(v)))
    axis.set_minor_locator(NullLocator())
    axis.set_minor_formatter(NullFormatter())


def legend_below(ax, columns: int = 2, fontsize: float = 8, **kwargs):
    """The legend under the axes, outside the data (a legend inside hides the traffic it describes)."""
    handles, labels = ax.get_legend_handles_labels()
    if not handles:
        return None
    return ax.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncols=columns,
                     fontsize=fontsize, frameon=False, **kwargs)
