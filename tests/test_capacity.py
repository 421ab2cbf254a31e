"""The capacity search (``model.evaluation.capacity``) against brute force over every replica count.

Two layers: synthetic judges (any set of passing counts, monotone or not) check the
search's own claims -- the count it returns passes, count - 1 fails, "proved" only when
every smaller count was replayed, at most one judgement a count, never past the cap --
and tiny random traces replayed on 1..cap replicas check the search through the real
replay: its answer is the brute-force fewest whenever meeting the SLOs is monotone there.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from replay_helpers import GAUDI, GAUDI_SERVER, PROFILE, bucket_of, example_trace

from model.base.runtime import DeadlineExceeded
from model.cost.serving import ServingCost
from model.evaluation.capacity import Probe, capacity, fewest_replicas, replay_judge, scaled
from model.evaluation.replay_metrics import Slo, summarize
from model.evaluation.replay_run import replay, trace_of


def counting_judge(passing: set[int]):
    calls: list[int] = []

    def judge(r: int) -> Probe:
        calls.append(r)
        return Probe(r, r in passing)

    return judge, calls


def check_claims(passing: set[int], cap: int, scan_below: int, alone_from: int | None = None) -> None:
    """``alone_from``: every count from it on passes or fails as it does (the caller builds ``passing`` so)."""
    judge, calls = counting_judge(passing)
    search = fewest_replicas(judge, cap, scan_below, alone_from=alone_from)
    assert len(calls) == len(set(calls)), "a count judged twice"
    limit = cap if alone_from is None else min(cap, alone_from)
    assert all(1 <= r <= limit for r in calls), "a count past the cap"
    assert [p.replicas for p in search.probes] == sorted(calls)
    truth = min((r for r in passing if r <= cap), default=None)
    if search.replicas is None:
        assert limit in calls and not any(r in passing for r in calls)
        assert search.no_more_to_try == (alone_from is not None and cap >= alone_from)
        return
    assert truth is not None and search.replicas in passing
    assert search.replicas == 1 or (search.replicas - 1) in calls and (search.replicas - 1) not in passing
    if search.proved:
        assert search.replicas == truth
    if search.replicas <= scan_below:
        assert search.proved
    monotone = all((r in passing) == (r >= truth) for r in range(1, cap + 1))
    if monotone:
        assert search.replicas == truth


@pytest.mark.parametrize("cap", [1, 2, 3, 7, 16, 33])
def test_monotone_thresholds_give_the_fewest(cap):
    for threshold in range(1, 40):
        for scan in (0, 4):
            check_claims(set(range(threshold, 100)), cap, scan)


def test_arbitrary_passing_sets_keep_every_claim():
    rng = random.Random(20)
    for _ in range(600):
        cap = rng.randint(1, 40)
        passing = {r for r in range(1, 45) if rng.random() < rng.choice((0.05, 0.3, 0.7))}
        alone = rng.choice((None, rng.randint(1, 50)))
        if alone is not None:  # from ``alone`` on, every count judges as ``alone`` does
            passing = {r for r in passing if r < alone} | (set(range(alone, 100)) if alone in passing else set())
        check_claims(passing, cap, rng.choice((0, 3, 16)), alone)


def test_no_passing_count_stops_at_the_cap():
    judge, calls = counting_judge(set())
    search = fewest_replicas(judge, 1000)
    assert search.replicas is None and not search.proved and max(calls) == 1000 and len(calls) == 11
    assert search.chosen.replicas == 1000
    with pytest.raises(ValueError):
        fewest_replicas(judge, 0)


def test_a_non_monotone_answer_is_not_called_proved():
    judge, _ = counting_judge({2, 4, 5, 6, 7, 8})  # 3 fails between passing counts
    search = fewest_replicas(judge, 8)  # 1 no, 2 yes
    assert search.replicas == 2 and search.proved
    judge, _ = counting_judge({1, 8, 9, 10})
    assert fewest_replicas(judge, 10).replicas == 1
    judge, _ = counting_judge({3, 7, 8})  # 1, 2, 4 fail; 8 passes; bisect 6 no, 7 yes
    search = fewest_replicas(judge, 8)
    assert search.replicas == 7 and not search.proved
    judge, _ = counting_judge({3, 7, 8})
    search = fewest_replicas(judge, 8, scan_below=8)  # every count below 7 replayed: 3 is found
    assert search.replicas == 3 and search.proved


def test_the_search_stops_where_every_request_has_a_replica_to_itself():
    trace, cost = example_trace(), ServingCost(PROFILE)
    (row,) = capacity(trace, (1.0,), GAUDI_SERVER, GAUDI, cost, Slo(ttft_ms=0.0), 1 << 16)
    assert row.replicas is None and row.no_more_to_try and max(p.replicas for p in row.probes) == len(trace)
    (row,) = capacity(trace, (1.0,), GAUDI_SERVER, GAUDI, cost, Slo(ttft_ms=0.0), 3)
    assert row.replicas is None and not row.no_more_to_try and row.chosen.replicas == 3
    alone = summarize(replay(trace, GAUDI_SERVER, GAUDI, cost, len(trace)), cost, Slo(ttft_ms=0.0)).slo
    beyond = summarize(replay(trace, GAUDI_SERVER, GAUDI, cost, 3 * len(trace)), cost, Slo(ttft_ms=0.0)).slo
    assert (alone.ttft_at_quantile, alone.tpot_at_quantile) == (beyond.ttft_at_quantile, beyond.tpot_at_quantile)


def test_the_deadline_is_looked_at_before_every_replica_of_a_short_replay():
    """A tiny trace never reaches a replica loop's first tick: the search must still stop at the deadline (it ran
    every probe of --replicas auto --time-limit 0.01 to the end)."""
    trace, cost = example_trace(), ServingCost(PROFILE)
    calls: list[int] = []

    def tick() -> None:
        calls.append(1)
        if len(calls) > 3:
            raise DeadlineExceeded("capacity search")

    with pytest.raises(DeadlineExceeded):
        capacity(trace, (1.0, 2.0), GAUDI_SERVER, GAUDI, cost, Slo(ttft_ms=0.0), 1 << 16, tick)
    assert len(calls) == 4


def test_scaled_traces_are_the_loaders_scaled_traces():
    bucket = bucket_of([("a", 100, 3, 0.0), ("b", 50, 2, 0.3), ("c", 70, 4, 1.7), ("d", 10, 1, 2.9)])
    for x in (0.5, 1.0, 3.0, 7.3):
        assert np.array_equal(scaled(trace_of([bucket]), x).arrival_ms, trace_of([bucket], x).arrival_ms)


def random_trace(rng: random.Random, n: int, span_s: float):
    rows = sorted(((f"r{k}", rng.randint(1, 900), rng.randint(1, 6), round(rng.uniform(0, span_s), 3))
                   for k in range(n)), key=lambda r: r[3])
    return trace_of([bucket_of(rows)])


@pytest.mark.parametrize("seed", range(12))
def test_the_search_through_the_replay_matches_brute_force(seed):
    rng = random.Random(seed)
    trace = random_trace(rng, rng.randint(5, 30), rng.choice((0.2, 1.0, 5.0)))
    cost = ServingCost(PROFILE)
    slo = Slo(ttft_ms=rng.choice((30.0, 80.0, 200.0, 10500.0)), tpot_ms=rng.choice((None, 40.0, 60.0)))
    cap = 8
    brute = {}
    for r in range(1, cap + 1):
        s = summarize(replay(trace, GAUDI_SERVER, GAUDI, cost, r), cost, slo).slo
        brute[r] = s.ttft_met is not False and s.tpot_met is not False
    search = fewest_replicas(replay_judge(trace, GAUDI_SERVER, GAUDI, cost, slo), cap)
    passing = {r for r, ok in brute.items() if ok}
    for p in search.probes:
        assert p.ok == brute[p.replicas]
    truth = min(passing, default=None)
    if truth is None:
        assert search.replicas is None
    elif all(brute[r] == (r >= truth) for r in brute):
        assert search.replicas == truth
    else:
        assert search.replicas in passing and (search.replicas == 1 or not brute[search.replicas - 1])


def test_capacity_rows_per_rate_and_the_numbers_they_show():
    trace, cost = example_trace(), ServingCost(PROFILE)
    slo = Slo(ttft_ms=200.0)
    rows = capacity(trace, (1.0, 4.0), GAUDI_SERVER, GAUDI, cost, slo, 8, scan_below=8)
    assert [r.rate_scale for r in rows] == [1.0, 4.0]
    for row in rows:
        chosen = row.chosen
        summary = summarize(replay(scaled(trace, row.rate_scale), GAUDI_SERVER, GAUDI, cost, chosen.replicas),
                            cost, slo)
        assert chosen.ttft_ms == summary.slo.ttft_at_quantile and chosen.busy_share == summary.utilisation
        assert chosen.ok == (row.replicas is not None)
    with pytest.raises(ValueError):
        replay_judge(trace, GAUDI_SERVER, GAUDI, cost, Slo())
