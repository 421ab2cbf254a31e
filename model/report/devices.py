"""Devices needed: how many devices each window keeps busy in device mode.

A window's batches can start only once it closes, and the next window's batches arrive
one window length later; so the work a window brings (the sum of its batch times, in
device-ms: prefill, decode and overhead, not the one-off compiles) must be done within
one window length to keep up.  Per window and bucket:

    devices needed = ceil(device-ms / window length in ms),  utilisation = device-ms / (devices x window ms)

and over the whole problem the buckets' work is pooled (they share the compiled shapes,
so one fleet serves them all).  Peak and mean are over every window from the first
arrival to the last, empty windows (0 devices) included.  Computed from batchings, so
it needs no plan file, and the same for every planner.

Only the windows that hold requests are stored (``DeviceUse.windows``): an empty window
needs no device, and a window of 1e-9 s over a 100 s trace, or two arrivals 1e12 s
apart, made one slot per window from the first arrival to the last -- hundreds of GiB.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from model.domain.schema import Batching, Problem
from model.domain.windowing import n_windows, windows_of


def devices_for(device_ms: np.ndarray, window_ms: float) -> np.ndarray:
    """ceil(device-ms / window ms) per entry (0 for no work)."""
    return np.ceil(np.asarray(device_ms, dtype=np.float64) / window_ms).astype(np.int64)


def utilisation(device_ms: np.ndarray, devices: np.ndarray, window_ms: float) -> np.ndarray:
    """device-ms / (devices x window ms), NaN where no device is needed."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(devices > 0, device_ms / (devices * window_ms), np.nan)


@dataclass(frozen=True, eq=False)
class DeviceUse:
    """One planner's device use over the windows that hold requests: ``device_ms[b, i]`` per bucket and window
    ``windows[i]`` (ascending), the pooled total per window, and the devices needed and utilisation of both;
    ``n_windows`` counts every window from the first arrival to the last (the empty ones need 0 devices)."""

    planner: str
    window_s: float
    origin_s: float
    buckets: tuple[str, ...]
    windows: np.ndarray  # the windows holding requests, ascending
    device_ms: np.ndarray  # (buckets, len(windows))
    n_windows: int
    shapes: tuple[int, ...] = ()  # the shapes the planner's plan compiles (every bucket), for the report

    @property
    def window_ms(self) -> float:
        return self.window_s * 1000.0

    @property
    def devices(self) -> np.ndarray:
        """Devices needed per bucket and window (of ``windows``)."""
        return devices_for(self.device_ms, self.window_ms)

    @property
    def total_ms(self) -> np.ndarray:
        """Pooled device-ms per window of ``windows`` (every bucket)."""
        return self.device_ms.sum(axis=0)

    @property
    def total_devices(self) -> np.ndarray:
        """Devices needed per window of ``windows`` with the buckets' work pooled."""
        return devices_for(self.total_ms, self.window_ms)

    def peak(self, bucket: int | None = None) -> int:
        """Most devices any window needs (pooled when ``bucket`` is None)."""
        d = self.total_devices if bucket is None else self.devices[bucket]
        return int(d.max(initial=0))

    def peak_window(self, bucket: int | None = None) -> int:
        """The first window needing the peak."""
        d = self.total_devices if bucket is None else self.devices[bucket]
        return int(self.windows[int(np.argmax(d))]) if len(d) else 0

    def mean(self, bucket: int | None = None) -> float:
        """Devices needed on average over every window (the empty ones need none)."""
        d = self.total_devices if bucket is None else self.devices[bucket]
        return float(d.sum() / self.n_windows) if self.n_windows else 0.0

    def mean_utilisation(self, bucket: int | None = None) -> float:
        """Work over the devices provisioned, over all windows: sum device-ms / (sum devices x window ms)."""
        ms = self.total_ms if bucket is None else self.device_ms[bucket]
        d = self.total_devices if bucket is None else self.devices[bucket]
        return float(ms.sum() / (d.sum() * self.window_ms)) if d.sum() else math.nan

    def window_start_s(self, w: int) -> float:
        """When window w opens (seconds, same clock as the arrivals)."""
        return self.origin_s + w * self.window_s

    def steps(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(window edges, value from each edge on) of a per-window series over ``windows``: each window holding
        requests steps up at its start, and down to 0 at its end unless the next window holds requests too --
        what a step plot over every window shows, in points proportional to the windows that hold requests."""
        w = np.asarray(self.windows, dtype=np.float64)
        v = np.asarray(values, dtype=np.float64)
        gap = np.r_[np.diff(self.windows) > 1, True] if len(w) else np.zeros(0, bool)
        x = np.concatenate([w, w[gap] + 1])
        y = np.concatenate([v, np.zeros(int(gap.sum()))])
        order = np.argsort(x, kind="stable")
        return x[order], y[order]


def batch_device_ms(problem: Problem, b: int, batching: Batching) -> np.ndarray:
    """Each batch's device time (ms) in bucket b: prefill + decode + overhead (compiles excluded)."""
    codes = np.asarray(batching.batch_of, dtype=np.int64)
    nb = len(batching.shape_of)
    n = np.bincount(codes, minlength=nb)
    g_max = np.zeros(nb, dtype=np.int64)
    np.maximum.at(g_max, codes, problem.buckets[b].gen_len)
    return problem.cost.batch_total(n, np.asarray(batching.shape_of, dtype=np.int64), g_max)


def device_use(problem: Problem, batchings: Sequence[Batching], planner: str) -> DeviceUse:
    """Device-ms per bucket and window (only the windows holding requests) of a windowed device-mode plan."""
    if problem.windowing is None or not problem.cost.device_time:
        raise ValueError("devices needed are defined for a windowed problem in device mode")
    wins = [windows_of(problem, bucket) for bucket in problem.buckets]
    windows = np.unique(np.concatenate(wins))
    ms = np.zeros((len(problem.buckets), len(windows)))
    for b, (w_b, bt) in enumerate(zip(wins, batchings, strict=True)):
        batch_win = np.zeros(len(bt.shape_of), dtype=np.int64)
        batch_win[np.asarray(bt.batch_of, dtype=np.int64)] = np.searchsorted(windows, w_b)
        ms[b] = np.bincount(batch_win, weights=batch_device_ms(problem, b, bt), minlength=len(windows))
    w = problem.windowing
    shapes = tuple(sorted({int(s) for bt in batchings for s in np.unique(bt.shape_of)}))
    return DeviceUse(planner, w.seconds, w.origin_s, tuple(b.name for b in problem.buckets), windows, ms,
                     n_windows(problem), shapes)
