"""Device mode of ``shared/cost_model.md``: batch times in device milliseconds from a measured profile.

Reference and strict mode charge every member its own decode, so batching never
pays off there.  On a real device one decode step reads the weights once for the
whole batch, so a profile of measured step times prices a batch of n members,
declared shape s and longest generation G_max as

    T = p0 + p1*n*s + p2*n*s^2  +  G_max*d0 + d1*n*lin(s, G_max) + d2*n*G_max  +  batch_overhead_ms

with ``decode_large`` replacing ``decode`` when n >= ``decode_large_from`` (large
batches switch kernels on real devices, so one line does not fit both ends).

Compiled batch sizes (graphs): on a compile-based stack the batch dimension is compiled
too.  With ``batch_buckets`` a batch of n members runs in graph (B, s), B the smallest
bucket >= n (``graph_batch``), and every batch-size term above takes B: the formulas here
are written over the batch dimension, and the cost model (``model.cost.model``) says which
one a batch of n members runs at.

Everything here is vectorised over numpy arrays of (n, s, G_max).  The integer
factors (n*s, n*s^2, lin, n*G_max) are formed exactly in int64 and only then
multiplied by the float coefficients, so the result is the contract's value to
float rounding; the optimiser uses the same numbers through ``linear_parts``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from model.cost.common import lin

MS_PER_HOUR = 3_600_000.0

Coefficients = tuple[float, float, float]


@dataclass(frozen=True, kw_only=True)
class DeviceProfile:
    """Measured step-time coefficients of one model on one device (the ``[device]`` table).

    ``prefill`` is (p0, p1, p2) of ``p0 + p1*(n*s) + p2*(n*s^2)``; ``decode`` is
    (d0, d1, d2) of one decode step ``d0 + d1*(n*c) + d2*n`` at context c.  The
    loader (``model.load.profile``) reports bad values with file and line; the checks
    here only stop a profile built in code from being silently inconsistent.
    """

    name: str = ""
    prefill: Coefficients
    decode: Coefficients
    decode_large: Coefficients | None = None
    decode_large_from: int | None = None
    batch_overhead_ms: float = 0.0
    compile_ms: float
    kv_capacity_tokens: int | None = None
    cost_per_device_hour: float | None = None
    # serving mode (shared/serving_model.md): compiling a graph the set lacks while serving; None = compile_ms
    runtime_compile_ms: float | None = None
    batch_buckets: tuple[int, ...] | None = None  # compiled batch sizes (None: the batch dimension is free)
    # ``batch_buckets = "auto"``: the stack compiles batch sizes and the planner chooses them (the problem's loader
    # turns this into candidate buckets, ``model.planning.bucket_choice``); never set together with batch_buckets
    auto_buckets: bool = False

    def __post_init__(self) -> None:
        if self.batch_buckets is not None:
            object.__setattr__(self, "batch_buckets", checked_buckets(self.batch_buckets))
        if self.auto_buckets and self.batch_buckets is not None:
            raise ValueError("batch_buckets is either a list or \"auto\", not both")
        for key in ("prefill", "decode", "decode_large"):
            value = getattr(self, key)
            if value is None:
                continue
            coeffs = tuple(float(v) for v in value)
            if len(coeffs) != 3 or not all(math.isfinite(v) and v >= 0 for v in coeffs):
                raise ValueError(f"{key} must be three finite non-negative numbers, got {value!r}")
            object.__setattr__(self, key, coeffs)
        if (self.decode_large is None) != (self.decode_large_from is None):
            raise ValueError("decode_large and decode_large_from go together")
        for key in ("decode_large_from", "kv_capacity_tokens"):
            value = getattr(self, key)
            if value is not None and (isinstance(value, bool) or int(value) != value or value < 1):
                raise ValueError(f"{key} must be a positive integer, got {value!r}")
        for key in ("batch_overhead_ms", "compile_ms", "cost_per_device_hour", "runtime_compile_ms"):
            value = getattr(self, key)
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{key} must be a finite non-negative number, got {value!r}")

    @property
    def runtime_compile(self) -> float:
        """What one graph compiled while serving costs (ms): ``runtime_compile_ms``, by default ``compile_ms``."""
        return self.compile_ms if self.runtime_compile_ms is None else self.runtime_compile_ms


@dataclass(frozen=True)
class BatchTime:
    """A batch time split into what the device spends it on (ms, arrays shaped like the inputs)."""

    prefill: np.ndarray
    decode: np.ndarray
    overhead: np.ndarray

    @property
    def total(self) -> np.ndarray:
        """prefill + decode + overhead, summed in the contract's order (equals ``batch_time``)."""
        return self.prefill + self.decode + self.overhead


AUTO_BUCKETS = "auto"  # ``--batch-buckets auto`` / ``batch_buckets = "auto"``: the planner chooses the buckets


def checked_buckets(values) -> tuple[int, ...]:
    """Batch buckets as a tuple of strictly increasing positive integers; ValueError naming what is wrong (the
    loaders report it with file, line and key, or the flag)."""
    values = list(values)
    if not values:
        raise ValueError("batch buckets must list at least one batch size")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"batch buckets must be positive integers, got {v!r}")
    out = tuple(int(v) for v in values)
    for a, b in zip(out[:-1], out[1:], strict=True):
        if b <= a:
            raise ValueError(f"batch buckets must be strictly increasing, got {a} then {b}")
    return out


def graph_batch(n, buckets: tuple[int, ...] | None) -> np.ndarray:
    """The batch dimension a batch of n members runs at: the smallest bucket >= n, or n itself without buckets.

    A batch above the largest bucket fits no graph and is invalid (the evaluator names it); it keeps B = n
    here, so its metrics are still defined.
    """
    n = np.asarray(n, dtype=np.int64)
    if buckets is None:
        return n
    sizes = np.asarray(buckets, dtype=np.int64)
    k = np.searchsorted(sizes, n, side="left")
    return np.where(k < len(sizes), sizes[np.minimum(k, len(sizes) - 1)], n)


def _ints(*arrays) -> tuple[np.ndarray, ...]:
    """Inputs as int64 arrays broadcast together, so every integer factor is exact."""
    return tuple(np.broadcast_arrays(*(np.asarray(a, dtype=np.int64) for a in arrays)))


def _with_regime(s, g, large) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(s, g) as int64 and the regime mask as bool, all three broadcast together."""
    s, g = (np.asarray(a, dtype=np.int64) for a in (s, g))
    return tuple(np.broadcast_arrays(s, g, np.asarray(large, dtype=bool)))


def is_large(n, prof: DeviceProfile) -> np.ndarray:
    """True where a batch of n members runs the ``decode_large`` coefficients."""
    n = np.asarray(n, dtype=np.int64)
    if prof.decode_large_from is None:
        return np.zeros(n.shape, dtype=bool)
    return n >= prof.decode_large_from


def decode_coefficients(large, prof: DeviceProfile) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(d0, d1, d2) per element of the regime mask ``large`` (True: decode_large).

    Taking the regime rather than n lets the optimiser price a column in the regime
    it has fixed for it; asking for the large regime of a profile without one is a bug.
    """
    large = np.asarray(large, dtype=bool)
    if prof.decode_large is None:
        if large.any():
            raise ValueError(f"profile {prof.name!r} has no decode_large coefficients")
        return tuple(np.full(large.shape, c) for c in prof.decode)
    return tuple(np.where(large, big, small) for small, big in zip(prof.decode, prof.decode_large, strict=True))


def prefill_ms(n, s, prof: DeviceProfile) -> np.ndarray:
    """Prefill of n members padded to the declared shape s: ``p0 + p1*(n*s) + p2*(n*s^2)``."""
    n, s = _ints(n, s)
    p0, p1, p2 = prof.prefill
    return p0 + p1 * (n * s) + p2 * (n * s * s)


def decode_ms(n, s, g, prof: DeviceProfile, large=None) -> np.ndarray:
    """All G_max decode steps of n members from context s: ``G*d0 + d1*n*lin(s, G) + d2*n*G``.

    Step k runs at context s + k, hence ``lin(s, G) = sum_{k<G} (s + k)``.  ``large``
    forces a regime; by default it follows n.
    """
    n, s, g = _ints(n, s, g)
    d0, d1, d2 = decode_coefficients(is_large(n, prof) if large is None else large, prof)
    return g * d0 + d1 * (n * lin(s, g)) + d2 * (n * g)


def batch_breakdown(n, s, g, prof: DeviceProfile) -> BatchTime:
    """Prefill, decode and fixed overhead of each batch (n members, shape s, longest gen g)."""
    n, s, g = _ints(n, s, g)
    return BatchTime(prefill_ms(n, s, prof), decode_ms(n, s, g, prof),
                     np.full(n.shape, prof.batch_overhead_ms))


def batch_time(n, s, g, prof: DeviceProfile) -> np.ndarray:
    """Device time T (ms) of each batch; every member's latency is T (a static batch returns together)."""
    n, s, g = _ints(n, s, g)
    p0, p1, p2 = prof.prefill
    d0, d1, d2 = decode_coefficients(is_large(n, prof), prof)
    return (p0 + p1 * (n * s) + p2 * (n * s * s) + g * d0 + d1 * (n * lin(s, g)) + d2 * (n * g)
            + prof.batch_overhead_ms)


def fixed_ms(s, g, large, prof: DeviceProfile) -> np.ndarray:
    """The part of T a batch pays once whatever its size: ``p0 + G*d0 + batch_overhead_ms``."""
    s, g, large = _with_regime(s, g, large)
    d0 = decode_coefficients(large, prof)[0]
    return prof.prefill[0] + g * d0 + prof.batch_overhead_ms


def per_member_ms(s, g, large, prof: DeviceProfile) -> np.ndarray:
    """The part of T each member adds: ``p1*s + p2*s^2 + d1*lin(s, G) + d2*G``."""
    s, g, large = _with_regime(s, g, large)
    _, d1, d2 = decode_coefficients(large, prof)
    _, p1, p2 = prof.prefill
    return p1 * s + p2 * (s * s) + d1 * lin(s, g) + d2 * g


def linear_parts(s, g, large, prof: DeviceProfile) -> tuple[np.ndarray, np.ndarray]:
    """(fixed, per_member) with ``T = fixed + n * per_member`` for every n in regime ``large``.

    Within one regime T is affine in n, which is what makes a batch's time a linear
    function of how many members a column takes.  The caller must keep n inside the
    regime (n >= decode_large_from exactly where ``large``); ``is_large`` says which.
    """
    return fixed_ms(s, g, large, prof), per_member_ms(s, g, large, prof)


def kv_tokens(n, s, g) -> np.ndarray:
    """KV-cache tokens a batch holds at its last step: every member keeps s + G_max positions."""
    n, s, g = _ints(n, s, g)
    return n * (s + g)


def kv_fits(n, s, g, prof: DeviceProfile) -> np.ndarray:
    """True where the batch fits the profile's KV capacity (always, without a capacity)."""
    tokens = kv_tokens(n, s, g)
    if prof.kv_capacity_tokens is None:
        return np.ones(tokens.shape, dtype=bool)
    return tokens <= prof.kv_capacity_tokens


def max_members(s, g, prof: DeviceProfile) -> np.ndarray | None:
    """Largest n whose batch (s, G_max) fits the KV capacity (0 if not even one does); None without a capacity."""
    if prof.kv_capacity_tokens is None:
        return None
    s, g = _ints(s, g)
    return prof.kv_capacity_tokens // np.maximum(s + g, 1)


def device_hours(ms) -> np.ndarray:
    """Device milliseconds as device hours (what a price per device hour multiplies)."""
    return np.asarray(ms, dtype=np.float64) / MS_PER_HOUR
