"""The windowed problem: each request's window and wait, and the problem cut into one sub-problem per window.

A window is ``floor((t - t_first) / SECONDS)`` with t_first the earliest arrival over
every bucket, so window k means the same seconds in every bucket.  A sub-problem of
one window keeps the problem's ``Windowing`` (same origin), so its requests keep their
window numbers and waits, and evaluating it applies the same rules as the whole.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from model.base.errors import InputError
from model.base.numbers import as_float
from model.cost.metrics import window_index, window_wait_ms
from model.domain.schema import Bucket, Limits, Problem, Windowing

MAX_WINDOW_S = 10 * 365 * 86400.0  # ten years: a longer window is a typo, not a batching window
# Windows from the first arrival to the last, empty ones included: devices needed are tabled and drawn per window
# (a row each) and the window index is an int64, so a count beyond this is a unit mistake -- a 1e-9 s window on
# a 100 s trace, or two arrivals 1e12 s apart -- not a batching problem (a million is a week of 1 s windows).
MAX_WINDOWS = 1_000_000


def parse_window(text: str | float | None, flag: str = "--window") -> float | None:
    """``--window SECONDS``: a finite positive number of seconds (None when not given)."""
    if text is None:
        return None
    value = as_float(text, text=True)
    if value is None:
        raise InputError(flag, None, None, f"expected a number of seconds, like 60, got {text!r}")
    if not math.isfinite(value) or value <= 0:
        raise InputError(flag, None, None, f"must be a finite positive number of seconds, got {text!r}")
    if value > MAX_WINDOW_S:
        raise InputError(flag, None, None, f"must be at most {MAX_WINDOW_S:g} seconds, got {text!r}")
    return value


def windowed(problem: Problem, seconds: float, flag: str = "--window") -> Problem:
    """The problem with arrival windows of ``seconds``; every bucket must have arrival times, and the windows from
    the first arrival to the last at most ``MAX_WINDOWS`` (``flag`` is named when they are not)."""
    seconds = parse_window(seconds, flag)
    for b in problem.buckets:
        if b.arrival_s is None:
            raise InputError(b.source, None, None,
                             "--window needs each request's arrival time: this file has none (Azure's TIMESTAMP "
                             "is read by itself; name another column with --time-column NAME)")
    origin = min(float(b.arrival_s.min()) for b in problem.buckets)
    last = max(float(b.arrival_s.max()) for b in problem.buckets)
    check_window_count(origin, last, seconds, flag)
    return replace(problem, windowing=Windowing(seconds, origin))


def window_count(first_s: float, last_s: float, seconds: float) -> float:
    """How many windows of ``seconds`` run from the first arrival to the last (a float: it may be far beyond
    any integer, or inf, which is what the check is for)."""
    ratio = (last_s - first_s) / seconds  # Python floats: a huge ratio is inf, never an error
    return float(math.floor(ratio)) + 1.0 if math.isfinite(ratio) else math.inf


def check_window_count(first_s: float, last_s: float, seconds: float, flag: str = "--window") -> None:
    """Refuse a window length that cuts the arrivals into more than ``MAX_WINDOWS`` windows: beyond that the
    window index would overflow int64 or the per-window tables would not fit (named with the numbers)."""
    count = window_count(first_s, last_s, seconds)
    if not count <= MAX_WINDOWS:
        span = last_s - first_s
        raise InputError(flag, None, None,
                         f"windows of {seconds:g} s from the first arrival to the last ({span:g} s later) make "
                         f"{count:.4g} windows; at most {MAX_WINDOWS} are allowed: give a longer window")


def windows_of(problem: Problem, bucket: Bucket) -> np.ndarray:
    """The window of every request of a bucket (file order); all zeros without windows."""
    w = problem.windowing
    if w is None:
        return np.zeros(len(bucket), dtype=np.int64)
    return window_index(bucket.arrival_s, w.seconds, w.origin_s)


def waits_of(problem: Problem, bucket: Bucket) -> np.ndarray | None:
    """Each request's wait (ms) to the end of its window (file order), or None without windows."""
    w = problem.windowing
    return None if w is None else window_wait_ms(bucket.arrival_s, w.seconds, w.origin_s)


def n_windows(problem: Problem) -> int:
    """Windows from the first arrival to the last (empty ones in between count)."""
    if problem.windowing is None:
        return 1
    return int(max(int(windows_of(problem, b).max()) for b in problem.buckets)) + 1


def subset(bucket: Bucket, rows: np.ndarray) -> Bucket:
    """The bucket's requests at ``rows`` (same name, source and line numbers)."""
    return Bucket(bucket.name, bucket.source, bucket.request_ids[rows], bucket.prompt_len[rows],
                  bucket.gen_len[rows], bucket.lines[rows],
                  None if bucket.arrival_s is None else bucket.arrival_s[rows])


@dataclass(frozen=True, eq=False)
class WindowPart:
    """One window's requests as a problem of their own.

    ``problem`` holds only the buckets with requests in this window (``bucket_of[i]`` is
    the index in the whole problem of its bucket i, ``rows[i]`` the rows of that bucket).
    """

    index: int
    problem: Problem
    bucket_of: tuple[int, ...]
    rows: tuple[np.ndarray, ...]

    @property
    def n_requests(self) -> int:
        return sum(len(r) for r in self.rows)


def share_limits(limits: Limits, share: float) -> Limits:
    """A bucket's limits for a part holding ``share`` of its requests: the absolute limits (cost, sequential
    time) scaled to the share; pad ratio and P95 are kept (meeting them in every window meets them overall)."""
    return replace(limits, **{f: getattr(limits, f) * share for f in ("max_cost", "max_sequential_ms")
                              if getattr(limits, f) is not None})


def split(problem: Problem) -> list[WindowPart]:
    """The problem cut into its non-empty windows, in window order."""
    if problem.windowing is None:
        raise ValueError("split needs a windowed problem")
    wins = [windows_of(problem, b) for b in problem.buckets]
    orders = [np.argsort(w, kind="stable") for w in wins]
    parts = []
    for k in np.unique(np.concatenate(wins)).tolist():
        bucket_of, rows, buckets, limits = [], [], [], []
        for i, (b, w, order) in enumerate(zip(problem.buckets, wins, orders, strict=True)):
            lo, hi = np.searchsorted(w[order], [k, k + 1])
            if hi > lo:
                r = np.sort(order[lo:hi])
                bucket_of.append(i)
                rows.append(r)
                buckets.append(subset(b, r))
                limits.append(share_limits(problem.limits[i], len(r) / len(b)))
        parts.append(WindowPart(int(k), replace(problem, buckets=tuple(buckets), limits=tuple(limits)),
                                tuple(bucket_of), tuple(rows)))
    return parts
