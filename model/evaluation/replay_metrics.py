"""Serving mode's metrics (``shared/serving_model.md``, "Metrics"), over every request of every replica.

TTFT = first token - arrival; E2E = finish - arrival; TPOT = (E2E - TTFT)/(gen_len - 1)
for gen_len > 1.  Percentiles by nearest rank, computed with exact fractions so
``ceil(q*n)`` never lands one off through float rounding.  Busy time is the sum of step
durations (device ms), warm-up ``compile_ms`` per graph compiled before serving, on
every replica; the pad ratios are ratios of exact integer token sums.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from model.cost.device import MS_PER_HOUR
from model.cost.serving import ServingCost
from model.evaluation.replay import RuntimeCompile
from model.evaluation.replay_run import ReplayResult

QUANTILES = (("p50", Fraction(1, 2)), ("p95", Fraction(95, 100)), ("p99", Fraction(99, 100)))


@dataclass(frozen=True)
class Quantiles:
    """Nearest-rank p50, p95 and p99 (ms); None when there is no value (TPOT with every gen_len 1)."""

    p50: float | None
    p95: float | None
    p99: float | None


@dataclass(frozen=True)
class Slo:
    """Service-level objectives: a request meets them when its TTFT and TPOT are within the given bounds."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    quantile: Fraction = Fraction(95, 100)


@dataclass(frozen=True)
class SloResult:
    """The share of requests meeting every given SLO, and whether the q-quantile of each metric meets its own."""

    slo: Slo
    goodput: float
    ttft_at_quantile: float | None
    tpot_at_quantile: float | None
    ttft_met: bool | None
    tpot_met: bool | None


@dataclass(frozen=True)
class ReplaySummary:
    """Everything the replay reports (totals over the replicas)."""

    stack: str
    requests: int
    replicas: int
    steps: int
    prompt_steps: int
    decode_steps: int
    busy_ms: float
    span_ms: float  # first arrival to last finish
    ttft: Quantiles
    tpot: Quantiles
    e2e: Quantiles
    prompt_pad_ratio: float
    decode_pad_ratio: float
    graphs: int  # compiled before serving, per replica
    warmup_ms: float  # all replicas
    runtime_compiles: tuple[tuple[int, RuntimeCompile], ...]  # (replica, compile)
    runtime_compile_ms: float
    cost_per_device_hour: float | None
    slo: SloResult | None

    @property
    def busy_device_hours(self) -> float:
        return self.busy_ms / MS_PER_HOUR

    @property
    def utilisation(self) -> float | None:
        """Busy time over the replicas' wall time from first arrival to last finish."""
        return self.busy_ms / (self.replicas * self.span_ms) if self.span_ms > 0 else None


def nearest_rank(values: np.ndarray, q: Fraction) -> float | None:
    """The element at 1-based rank ceil(q*n) of the sorted values (None for no values)."""
    n = int(values.shape[0])
    if n == 0:
        return None
    rank = max(1, -(-q.numerator * n // q.denominator))
    return float(np.partition(values, rank - 1)[rank - 1])


def quantiles(values: np.ndarray) -> Quantiles:
    """p50, p95, p99 of one metric."""
    return Quantiles(*(nearest_rank(values, q) for _, q in QUANTILES))


def request_metrics(result: ReplayResult) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(TTFT, TPOT, E2E) in ms: TTFT and E2E for every request, TPOT for those with gen_len > 1 (trace order)."""
    arrival = result.trace.arrival_ms
    ttft = result.first_ms - arrival
    e2e = result.finish_ms - arrival
    many = result.trace.gen > 1
    tpot = (e2e[many] - ttft[many]) / (result.trace.gen[many] - 1)
    return ttft, tpot, e2e


def slo_result(result: ReplayResult, slo: Slo) -> SloResult:
    """Goodput (share of requests within every given bound; TPOT holds trivially at gen_len 1) and the quantiles."""
    ttft, tpot, _ = request_metrics(result)
    good = np.ones(len(result.trace), dtype=bool)
    if slo.ttft_ms is not None:
        good &= ttft <= slo.ttft_ms
    if slo.tpot_ms is not None:
        many = result.trace.gen > 1
        good[many] &= tpot <= slo.tpot_ms
    at_ttft, at_tpot = nearest_rank(ttft, slo.quantile), nearest_rank(tpot, slo.quantile)
    return SloResult(slo, float(good.mean()) if good.size else 1.0, at_ttft, at_tpot,
                     None if slo.ttft_ms is None else at_ttft is not None and at_ttft <= slo.ttft_ms,
                     None if slo.tpot_ms is None else at_tpot is None or at_tpot <= slo.tpot_ms)


def _ratio(padded: int, real: int) -> float:
    """(padded - real) / real from exact integer sums (0 when nothing ran)."""
    return float(Fraction(padded - real, real)) if real else 0.0


def summarize(result: ReplayResult, cost: ServingCost, slo: Slo | None = None) -> ReplaySummary:
    """The replay's report: steps, busy time, latency percentiles, pad ratios, graphs, run-time compiles, SLOs."""
    runs = result.replicas
    ttft, tpot, e2e = request_metrics(result)
    compiles = tuple((r, c) for r, run in enumerate(runs) for c in run.compiled)
    span = float(result.finish_ms.max()) if len(result.trace) else 0.0
    return ReplaySummary(
        stack=result.settings.stack, requests=len(result.trace), replicas=len(runs),
        steps=sum(r.steps for r in runs), prompt_steps=sum(r.prompt_steps for r in runs),
        decode_steps=sum(r.decode_steps for r in runs), busy_ms=math.fsum(r.busy_ms for r in runs), span_ms=span,
        ttft=quantiles(ttft), tpot=quantiles(tpot), e2e=quantiles(e2e),
        prompt_pad_ratio=_ratio(sum(r.prompt_padded for r in runs), sum(r.prompt_tokens for r in runs)),
        decode_pad_ratio=_ratio(sum(r.decode_padded for r in runs), sum(r.decode_tokens for r in runs)),
        graphs=result.graphs.count, warmup_ms=cost.warmup_ms(result.graphs.count) * len(runs),
        runtime_compiles=compiles, runtime_compile_ms=cost.runtime_compile_ms * len(compiles),
        cost_per_device_hour=cost.profile.cost_per_device_hour,
        slo=None if slo is None or (slo.ttft_ms is None and slo.tpot_ms is None) else slo_result(result, slo))
