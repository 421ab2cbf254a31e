"""Capacity: the fewest replicas whose replay meets the SLOs, at each rate scale (the capacity answer).

A replica count is judged by replaying the whole trace on that many replicas
(``model.evaluation.replay_run``: round-robin deal, the one serving cost model) and
asking whether the SLO quantile of every given metric (TTFT, TPOT) is within its bound.
Meeting the SLOs is usually monotone in the count (more replicas, shorter queues) but
not always: run-time compiles happen per replica, so more replicas can mean more of
them, and the round-robin deal changes which requests share a replica.  So the search
claims only what it checked:

1. exponential: 1, 2, 4, ... (capped at ``cap``) until a count meets the SLOs;
2. binary search between the last failing count and that one (every count it keeps as
   "fails" was replayed and failed);
3. the count just below the answer is replayed (it always is after step 2; the check
   is explicit), and with ``scan_below`` every count below the answer up to that many
   is replayed too, taking the smallest that meets the SLOs.

The answer is ``proved`` the fewest only when every smaller count was replayed and
failed; otherwise it is the fewest the search found, with count - 1 failing.  When no
count up to ``cap`` meets the SLOs the answer is None, with the last count tried: the
search never runs on past the cap.  The cap is at most the number of requests: from
there on every request has a replica to itself (the round-robin deal gives request k
replica k), so more replicas change no latency: when that count misses the SLOs too,
raising the cap cannot help (``no_more_to_try``; a smaller count the search skipped might
still meet them, since meeting them need not be monotone).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from model.cost.serving import ServingCost
from model.domain.server import GraphSet, ServerSettings
from model.evaluation.replay_metrics import ReplaySummary, Slo, summarize
from model.evaluation.replay_run import ReplayResult, Trace, replay


@dataclass(frozen=True)
class Probe:
    """One replica count replayed: did it meet the SLOs, and the numbers the capacity table shows."""

    replicas: int
    ok: bool
    ttft_ms: float | None = None  # at the SLO quantile
    tpot_ms: float | None = None
    busy_share: float | None = None  # busy time over replicas x (first arrival to last finish)
    goodput: float | None = None
    busy_ms: float | None = None
    runtime_compiles: int = 0


@dataclass(frozen=True)
class Search:
    """The search's outcome at one rate scale: the count chosen (None: none up to ``cap``) and every probe."""

    rate_scale: float
    cap: int
    replicas: int | None
    probes: tuple[Probe, ...]  # every count replayed, ascending
    alone_from: int | None = None  # from this count on every request has a replica to itself (the trace's length)

    @property
    def no_more_to_try(self) -> bool:
        """No count found, and the search reached the count from which more replicas change nothing."""
        return self.replicas is None and self.alone_from is not None and self.cap >= self.alone_from

    def probe(self, replicas: int) -> Probe | None:
        return next((p for p in self.probes if p.replicas == replicas), None)

    @property
    def chosen(self) -> Probe | None:
        """The probe at the chosen count, or (none met the SLOs) the largest count tried."""
        return self.probe(self.replicas) if self.replicas is not None else self.probes[-1]

    @property
    def proved(self) -> bool:
        """Every count below the chosen one was replayed and failed: it is the fewest, not only the fewest found."""
        if self.replicas is None:
            return False
        tried = {p.replicas: p.ok for p in self.probes}
        return all(tried.get(r) is False for r in range(1, self.replicas))


def fewest_replicas(judge: Callable[[int], Probe], cap: int, scan_below: int = 0,
                    rate_scale: float = 1.0, alone_from: int | None = None) -> Search:
    """Exponential then binary search for the fewest count ``judge`` passes, from 1 to ``cap`` (module docstring).

    ``judge`` is called at most once per count.  ``scan_below``: also replay every count
    below the answer when the answer is at most this (cheap proof for small counts).
    ``alone_from``: counts from this one on all judge alike (every request alone), so the
    search stops there.
    """
    if cap < 1:
        raise ValueError(f"the replica cap must be at least 1, got {cap}")
    given_cap = cap
    cap = cap if alone_from is None else max(1, min(cap, alone_from))
    probes: dict[int, Probe] = {}

    def ok(r: int) -> bool:
        if r not in probes:
            probes[r] = judge(r)
        return probes[r].ok

    lo, r = 0, 1  # lo: the largest count known to fail (0: none yet)
    while not ok(r):
        lo = r
        if r >= cap:
            return Search(rate_scale, given_cap, None, tuple(probes[k] for k in sorted(probes)), alone_from)
        r = min(2 * r, cap)
    hi = r
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid
    if hi > 1:
        ok(hi - 1)  # the count just below is replayed (already, by the bisection's invariant)
    if hi <= scan_below:
        passing = [k for k in range(1, hi) if ok(k)]
        hi = passing[0] if passing else hi
    return Search(rate_scale, given_cap, hi, tuple(probes[k] for k in sorted(probes)), alone_from)


def meets(summary: ReplaySummary) -> bool:
    """Every given SLO is met at its quantile (a summary without SLOs meets none: the search needs one)."""
    r = summary.slo
    return r is not None and r.ttft_met is not False and r.tpot_met is not False


def probe_of(summary: ReplaySummary) -> Probe:
    """The capacity table's numbers from a replay's summary (with SLOs)."""
    r = summary.slo
    return Probe(summary.replicas, meets(summary), r.ttft_at_quantile if r else None,
                 r.tpot_at_quantile if r else None, summary.utilisation, r.goodput if r else None, summary.busy_ms,
                 len(summary.runtime_compiles))


def scaled(trace: Trace, rate_scale: float) -> Trace:
    """The trace at ``rate_scale`` times its rate (arrival times divided, exactly as ``trace_of`` divides them)."""
    return replace(trace, arrival_ms=trace.arrival_ms / rate_scale)


def replay_judge(trace: Trace, settings: ServerSettings, graphs: GraphSet, cost: ServingCost, slo: Slo,
                 tick: Callable[[], None] | None = None,
                 seen: Callable[[int, ReplayResult, ReplaySummary], None] | None = None) -> Callable[[int], Probe]:
    """Judge a replica count by replaying ``trace`` on that many replicas (``seen`` gets every replay)."""
    if slo.ttft_ms is None and slo.tpot_ms is None:
        raise ValueError("the capacity search needs an SLO on TTFT or TPOT")

    def judge(replicas: int) -> Probe:
        result = replay(trace, settings, graphs, cost, replicas, tick=tick)
        summary = summarize(result, cost, slo)
        if seen is not None:
            seen(replicas, result, summary)
        return probe_of(summary)

    return judge


def capacity(trace: Trace, rate_scales: Sequence[float], settings: ServerSettings, graphs: GraphSet,
             cost: ServingCost, slo: Slo, cap: int, tick: Callable[[], None] | None = None,
             scan_below: int = 0) -> tuple[Search, ...]:
    """The fewest replicas meeting ``slo`` at each rate scale (``trace`` at scale 1): the capacity table's rows."""
    return tuple(fewest_replicas(replay_judge(scaled(trace, x), settings, graphs, cost, slo, tick), cap, scan_below, x,
                                 len(trace)) for x in rate_scales)
