"""Fit a device profile's step-time coefficients to measurements.

Models (``docs/cost_model.md``, "Device mode"), one row = one timed step:

- prefill of n members padded to s:  ``p0 + p1*(n*s) + p2*(n*s^2)``, features [1, n*s, n*s^2];
- one decode step of n members at context c:  ``d0 + d1*(n*c) + d2*n``, features [1, n*c, n].

**Relative error.**  Each phase is fitted by non-negative least squares on the
*relative* residual ``(ms - model) / ms``, each row further scaled by its optional
weight.  Step times span three orders of magnitude (a 20 ms decode step of one
member, seconds for a 16k-token prefill); plain least squares would fit the largest
rows and leave the small batches -- the ones a latency limit is about -- off by
tens of percent.  Timing noise is also roughly proportional to the time measured,
so the relative residual is the one with equal spread on every row (weighted least
squares with weights 1/ms^2 is then the maximum-likelihood fit of multiplicative
noise; dividing by the measured rather than the true time biases the fit by about
noise^2, 0.1 % at 3 % noise).  Coefficients are kept non-negative because a step
never gets faster with more work; with three coefficients the non-negative optimum
is found exactly by solving every support (7 small least-squares problems) and
keeping the best feasible one, so no iterative solver or extra dependency is needed.

**Decode split.**  Real devices switch kernels for large batches, so one line does
not fit both ends; ``decode_large`` takes over from ``decode_large_from`` members.
``split="auto"`` tries every measured batch size u as the first large one, keeping
only candidates that leave at least ``MIN_SIDE_ROWS`` rows and two batch sizes on
each side, picks the u with the smallest total weighted squared relative error, and
keeps it only if it beats one line by the Bayesian information criterion (three
more coefficients and the split point must pay for themselves), so measurements of a
device without a switch give no split.  ``split=N`` forces the split at N and
``split="none"`` fits one line.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

from model.base.errors import InputError
from model.calibration.measurements import Measurements
from model.cost.device import DeviceProfile

N_COEFFS = 3
MIN_SIDE_ROWS = 2 * N_COEFFS  # rows each side of a candidate decode split must keep
SPLIT_PARAMS = N_COEFFS + 1   # extra parameters a split adds: three coefficients and where it is
DEFAULT_COMPILE_MS = 20000.0  # the shared example's assumption; public reports put one shape's warm-up at 14-38 s
REL_FLOOR = 1e-12             # relative error below float noise counts as exact (keeps log(SSE) finite)

Split = Literal["auto", "none"] | int
FEATURE_HINT = {
    "prefill": "prefill rows need at least three different padded lengths",
    "decode": "decode rows need at least two batch sizes and two context lengths",
}


@dataclass(frozen=True, eq=False)
class PhaseFit:
    """One fitted line: its coefficients and how well it matches the rows it was fitted to."""

    phase: str                      # "prefill", "decode" or "decode_large"
    coefficients: tuple[float, float, float]
    rows: int                       # rows used (weight > 0)
    batch_sizes: tuple[int, int]    # smallest and largest batch size among them
    r2: float                       # on ms, unweighted: the share of the time variation explained
    mean_rel_error: float           # mean |model - ms| / ms over the rows used
    max_rel_error: float
    measured: np.ndarray            # ms of the rows used (for plots)
    predicted: np.ndarray
    batch_size: np.ndarray
    seq_len: np.ndarray


@dataclass(frozen=True, eq=False)
class Calibration:
    """A fitted profile with the per-phase fits behind it and how the decode split was chosen."""

    source: str
    profile: DeviceProfile
    fits: tuple[PhaseFit, ...]
    split_mode: str                           # "auto", "none" or "fixed"
    split_candidates: tuple[tuple[int, float], ...]  # (first large batch size, weighted SSE) tried by auto
    unsplit_sse: float | None                 # weighted SSE of one decode line (auto only)


def features(phase: str, n: np.ndarray, s: np.ndarray) -> np.ndarray:
    """The design matrix of a phase: [1, n*s, n*s^2] for prefill, [1, n*c, n] for decode.

    Products are formed in int64 (exact) before the conversion to float.
    """
    n = np.asarray(n, dtype=np.int64)
    s = np.asarray(s, dtype=np.int64)
    third = n * s * s if phase == "prefill" else n
    return np.column_stack([np.ones(len(n)), (n * s).astype(np.float64), third.astype(np.float64)])


def relative_nnls(x: np.ndarray, ms: np.ndarray, weight: np.ndarray) -> tuple[np.ndarray, float] | None:
    """Non-negative coefficients minimising ``sum w * ((ms - x @ b) / ms)^2``, and that minimum.

    None if the rows cannot separate the coefficients (rank below the column count).
    Columns are scaled to unit norm first: they differ by nine orders of magnitude
    (1 against n*s^2), which would otherwise swamp the rank test and the solves.
    """
    root = np.sqrt(weight)
    a = x * (root / ms)[:, None]
    b = root
    norms = np.linalg.norm(a, axis=0)
    if len(ms) < x.shape[1] or not (norms > 0).all():
        return None
    a = a / norms
    if np.linalg.matrix_rank(a) < x.shape[1]:
        return None
    best = np.zeros(x.shape[1])
    best_sse = float(b @ b)
    for size in range(1, x.shape[1] + 1):
        for support in itertools.combinations(range(x.shape[1]), size):
            cols = list(support)
            coef = np.linalg.lstsq(a[:, cols], b, rcond=None)[0]
            if (coef < 0).any():
                continue
            full = np.zeros(x.shape[1])
            full[cols] = coef
            r = b - a @ full
            sse = float(r @ r)
            if sse < best_sse:
                best, best_sse = full, sse
    return best / norms, best_sse


def fit_rows(m: Measurements, phase: str, label: str, scope: str = "") -> PhaseFit:
    """Fit one line to the rows of ``m`` (all of one phase); too few or degenerate rows are an InputError.

    ``label`` is the profile key the line becomes; ``scope`` says which rows it covers in messages.
    """
    used = m.weight > 0
    n, s, ms, w = m.batch_size[used], m.seq_len[used], m.ms[used], m.weight[used]
    if len(ms) < N_COEFFS:
        raise InputError(m.source, None, None,
                         f"{label}{scope}: {len(ms)} usable rows, at least {N_COEFFS} are needed to fit {N_COEFFS} "
                         "coefficients")
    x = features(phase, n, s)
    solved = relative_nnls(x, ms, w)
    if solved is None:
        raise InputError(m.source, None, None,
                         f"{label}{scope}: the rows cannot separate the {N_COEFFS} coefficients (singular design; "
                         f"{FEATURE_HINT[phase]})")
    coef = solved[0]
    predicted = x @ coef
    rel = np.abs(predicted - ms) / ms
    total = float(((ms - ms.mean()) ** 2).sum())
    r2 = 1.0 - float(((ms - predicted) ** 2).sum()) / total if total > 0 else math.nan
    return PhaseFit(label, (float(coef[0]), float(coef[1]), float(coef[2])), len(ms),
                    (int(n.min()), int(n.max())), r2, float(rel.mean()), float(rel.max()), ms, predicted, n, s)


def _sse(m: Measurements, phase: str) -> float | None:
    """Weighted squared relative error of the best line through m's rows (None: cannot be fitted)."""
    used = m.weight > 0
    solved = relative_nnls(features(phase, m.batch_size[used], m.seq_len[used]), m.ms[used], m.weight[used])
    return None if solved is None else solved[1]


def split_candidates(decode: Measurements) -> list[tuple[int, float]]:
    """(u, SSE) for every usable split "n >= u is large" among the measured batch sizes.

    A candidate must leave ``MIN_SIDE_ROWS`` usable rows and two distinct batch sizes
    on each side (with one batch size d0 and d2 cannot be told apart).
    """
    used = decode.weight > 0
    sizes = np.unique(decode.batch_size[used])
    out = []
    for u in sizes[1:]:
        large = decode.batch_size >= u
        sides = (decode.subset(~large), decode.subset(large))
        if any(int((side.weight > 0).sum()) < MIN_SIDE_ROWS or len(np.unique(side.batch_size[side.weight > 0])) < 2
               for side in sides):
            continue
        sse = [_sse(side, "decode") for side in sides]
        if None not in sse:
            out.append((int(u), float(sse[0] + sse[1])))
    return out


def bic(sse: float, rows: int, params: int) -> float:
    """Bayesian information criterion of a least-squares fit (lower is better)."""
    return rows * math.log(max(sse, rows * REL_FLOOR**2) / rows) + params * math.log(rows)


def choose_split(decode: Measurements) -> tuple[int | None, list[tuple[int, float]], float | None]:
    """Auto split: (first large batch size or None, the candidates tried, the one-line SSE)."""
    candidates = split_candidates(decode)
    one = _sse(decode, "decode")
    if not candidates or one is None:
        return None, candidates, one
    u, sse = min(candidates, key=lambda c: (c[1], c[0]))
    rows = int((decode.weight > 0).sum())
    if bic(sse, rows, N_COEFFS + SPLIT_PARAMS) < bic(one, rows, N_COEFFS):
        return u, candidates, one
    return None, candidates, one


def fit_profile(m: Measurements, split: Split = "auto", compile_ms: float = DEFAULT_COMPILE_MS,
                kv_capacity_tokens: int | None = None, name: str = "",
                batch_overhead_ms: float = 0.0) -> Calibration:
    """Fit prefill and decode (and, per ``split``, decode_large) and build the profile.

    The measurements say nothing about compile time or KV capacity; those come from
    the caller.  Per-batch overhead is folded into p0 by the fit (a prefill row is a
    whole batch), so it stays 0 unless given.
    """
    prefill, decode = m.of("prefill"), m.of("decode")
    for phase, rows in (("prefill", prefill), ("decode", decode)):
        if len(rows) == 0:
            raise InputError(m.source, None, None, f"no {phase} rows: both phases must be measured")
    candidates: list[tuple[int, float]] = []
    unsplit = None
    if split == "auto":
        at, candidates, unsplit = choose_split(decode)
        mode = "auto"
    elif split == "none":
        at, mode = None, "none"
    elif isinstance(split, int) and not isinstance(split, bool) and split >= 1:
        at, mode = split, "fixed"
    else:
        raise ValueError(f"split must be 'auto', 'none' or a positive integer, got {split!r}")
    fits = [fit_rows(prefill, "prefill", "prefill")]
    if at is None:
        fits.append(fit_rows(decode, "decode", "decode"))
    else:
        large = decode.batch_size >= at
        fits.append(fit_rows(decode.subset(~large), "decode", "decode", f" (batch_size < {at})"))
        fits.append(fit_rows(decode.subset(large), "decode", "decode_large", f" (batch_size >= {at})"))
    profile = DeviceProfile(
        name=name, prefill=fits[0].coefficients, decode=fits[1].coefficients,
        decode_large=fits[2].coefficients if at is not None else None, decode_large_from=at,
        batch_overhead_ms=batch_overhead_ms, compile_ms=compile_ms, kv_capacity_tokens=kv_capacity_tokens)
    return Calibration(m.source, profile, tuple(fits), mode, tuple(candidates), unsplit)

