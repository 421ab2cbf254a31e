"""The fast replay against a plain one: the contract's scheduler written out step by step, on random small traces.

``plain_replay`` below is an independent reading of ``shared/serving_model.md``: lists
of waiting and running requests, every step's block count and longest context summed
from scratch, graphs looked up by walking the sorted list.  It shares no code with
``model.evaluation.replay`` beyond the records it is handed.  Hypothesis draws traces
(ties in arrival, integer step times so arrivals land exactly on step boundaries),
servers, profiles (with decode_large, overheads, run-time compile times) and graph sets
(gaudi sets with misses, empty decode sets; nxdi buckets), and every number must agree:
each step (its start to the last bit, prompt and decode graphs, duration), each
request's first token and finish, the token sums behind the pad ratios and the graphs
compiled at run time.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_replay_examples import expanded_steps

from model.cost.device import DeviceProfile
from model.cost.serving import ServingCost
from model.domain.schema import Bucket
from model.domain.server import GraphSet, ServerSettings
from model.evaluation.replay import replay_replica
from model.evaluation.replay_run import check_fits, replay, trace_of


def rounded(x: int, base: int) -> int:
    """r(x, base) of the contract, by search: the smallest k with k^3 >= x, then x up to a multiple of k*base."""
    if x <= 1:
        return x
    k = 1
    while k ** 3 < x:
        k += 1
    return math.ceil(x / (k * base)) * (k * base)


def plain_replay(prompt, gen, arrival, server: ServerSettings, graphs: GraphSet, prof: DeviceProfile):
    """One step at a time, everything recomputed: (steps, first, finish, compiles, sums)."""
    p0, p1, p2 = prof.prefill
    ovh = prof.batch_overhead_ms
    rc = prof.compile_ms if prof.runtime_compile_ms is None else prof.runtime_compile_ms
    big_m, budget, bs = server.max_num_seqs, server.max_num_batched_tokens, server.block_size
    gaudi = server.stack == "gaudi"
    prompts, decodes = sorted(graphs.prompt), sorted(graphs.decode)
    if gaudi:
        cap = server.max_prefill_seqs or max(b for b, _ in graphs.prompt)
        free = prof.kv_capacity_tokens // bs
    else:
        cap, free = server.ctx_batch_size, 0
    n_req = len(prompt)
    first, finish = [None] * n_req, [None] * n_req
    waiting, running = [], []  # running: [request, tokens so far]
    steps, compiles = [], []
    sums = [0, 0, 0, 0]  # prompt tokens, prompt B*S, decode context, decode graph context
    t, nxt = (arrival[0] if arrival else 0.0), 0
    while nxt < n_req or waiting or running:
        while nxt < n_req and arrival[nxt] <= t:
            waiting.append(nxt)
            nxt += 1
        if not waiting and not running:
            t = arrival[nxt]
            continue
        admitted, used = [], 0
        while waiting:
            i = waiting[0]
            if len(running) + len(admitted) >= big_m or len(admitted) >= cap:
                break
            if prompt[i] > budget - len(running) - used:
                break
            if gaudi:
                need = math.ceil((prompt[i] + gen[i]) / bs)
                if need > free:
                    break
                free -= need
            admitted.append(waiting.pop(0))
            used += prompt[i]
        duration, misses, prow, drow = 0.0, 0, None, None
        if admitted:
            n, s = len(admitted), max(prompt[i] for i in admitted)
            if gaudi:
                graph = next((g for g in prompts if g[0] >= n and g[1] >= s), None)
                if graph is None:
                    graph = (min(rounded(n, 2), big_m), min(rounded(s, 32), budget))
                    prompts = sorted(prompts + [graph])
                    compiles.append((len(steps) + 1, "prompt", graph))
                    misses += 1
            else:
                graph = (server.ctx_batch_size, min(b for b in graphs.context if b >= s))
            b, x = graph
            duration += p0 + p1 * (b * x) + p2 * (b * x * x) + ovh
            sums[0] += sum(prompt[i] for i in admitted)
            sums[1] += b * x
            prow = ((n, s), graph)
        if running:
            n = len(running)
            if gaudi:
                need = sum(math.ceil((prompt[i] + j) / bs) for i, j in running)
                graph = next((g for g in decodes if g[0] >= n and g[1] >= need), None)
                if graph is None:
                    graph = (min(rounded(n, 2), big_m), rounded(need, 32))
                    decodes = sorted(decodes + [graph])
                    compiles.append((len(steps) + 1, "decode", graph))
                    misses += 1
                context = graph[1] * bs
            else:
                need = max(prompt[i] + j for i, j in running)
                graph = (big_m, min(b for b in graphs.token_generation if b >= need))
                context = big_m * graph[1]
            large = prof.decode_large_from is not None and graph[0] >= prof.decode_large_from
            d0, d1, d2 = prof.decode_large if large else prof.decode
            duration += d0 + d1 * context + d2 * graph[0] + ovh
            sums[2] += sum(prompt[i] + j for i, j in running)
            sums[3] += context
            drow = ((n, need), graph)
        duration += misses * rc
        steps.append((len(steps) + 1, t, *(prow or (None, None)), *(drow or (None, None)), duration))
        t += duration
        still = []
        for i, j in running:
            if j + 1 == gen[i]:
                finish[i] = t
                free += math.ceil((prompt[i] + gen[i]) / bs) if gaudi else 0
            else:
                still.append([i, j + 1])
        for i in admitted:
            first[i] = t
            if gen[i] == 1:
                finish[i] = t
                free += math.ceil((prompt[i] + gen[i]) / bs) if gaudi else 0
            else:
                still.append([i, 1])
        running = still
    return steps, first, finish, compiles, sums


NUMBER = st.one_of(st.integers(0, 4).map(float), st.floats(0.0, 5.0, allow_nan=False, allow_subnormal=False))


@st.composite
def cases(draw):
    """(prompt, gen, arrival_ms, server, graphs, profile): the trace sorted by arrival, every request servable."""
    stack = draw(st.sampled_from(["gaudi", "nxdi"]))
    count = draw(st.integers(1, 24))
    prompt = draw(st.lists(st.integers(1, 200), min_size=count, max_size=count))
    gen = draw(st.lists(st.one_of(st.just(1), st.integers(1, 40)), min_size=count, max_size=count))
    # half the cases have whole-number coefficients and gaps: every time is an integer, so arrivals land exactly
    # on step ends (where "at or before t" decides)
    exact = draw(st.booleans())
    gap = st.integers(0, 40).map(float) if exact else st.one_of(st.just(0.0), st.floats(0, 300))
    gaps = draw(st.lists(gap, min_size=count, max_size=count))
    arrival = list(np.cumsum(gaps) + draw(st.sampled_from([0.0, 1000.0, 1.5e9])))  # absolute origins too
    seqs = draw(st.integers(1, 6))
    budget = max(prompt) + draw(st.one_of(st.sampled_from([0, 1, 2]), st.integers(0, 300)))  # prompts that just fit
    bs = draw(st.sampled_from([1, 4, 16, 128]))
    large_from = draw(st.one_of(st.none(), st.integers(1, 6)))
    # exact: whole numbers, the per-token ones mostly 0 so steps stay as short as the gaps between arrivals
    number = st.integers(0, 4).map(float) if exact else NUMBER
    per_token = st.sampled_from([0.0, 0.0, 0.0, 1.0]) if exact else NUMBER
    scale = (1, 1, 1) if exact else (10, 1000, 100)
    prof = DeviceProfile(prefill=(draw(number), draw(per_token) / scale[0], draw(per_token) / scale[1]),
                         decode=(draw(number), draw(per_token) / scale[2], draw(number)),
                         decode_large=None if large_from is None else (draw(number), draw(per_token) / scale[2],
                                                                       draw(number)),
                         decode_large_from=large_from,
                         batch_overhead_ms=draw(st.sampled_from([0.0, 1.0] if exact else [0.0, 1.0, 0.25])),
                         compile_ms=draw(st.sampled_from([100.0, 7.0])),
                         runtime_compile_ms=draw(st.sampled_from([None, 0.0, 33.0] if exact else [None, 0.0, 2.125])),
                         kv_capacity_tokens=bs * (max(math.ceil((p + g) / bs) for p, g in zip(prompt, gen, strict=True))
                                                  + draw(st.integers(0, 30))) + draw(st.integers(0, bs - 1)))
    if stack == "gaudi":
        pair = st.tuples(st.integers(1, 7), st.integers(1, 260))
        prompts = tuple(sorted(set(draw(st.lists(pair, max_size=5)))))
        decodes = tuple(sorted(set(draw(st.lists(st.tuples(st.integers(1, 7), st.integers(1, 90)), max_size=5)))))
        cap = draw(st.one_of(st.none(), st.integers(1, 4))) if prompts else draw(st.integers(1, 4))
        server = ServerSettings(stack="gaudi", max_num_seqs=seqs, max_num_batched_tokens=budget, block_size=bs,
                                max_prefill_seqs=cap)
        graphs = GraphSet("gaudi", prompt=prompts, decode=decodes)
    else:
        longest = max(p + g - 1 for p, g in zip(prompt, gen, strict=True))
        context = sorted({*draw(st.lists(st.integers(1, 260), max_size=3)), max(prompt) + draw(st.integers(0, 40))})
        tkg = sorted({*draw(st.lists(st.integers(1, 300), max_size=3)), longest + draw(st.integers(0, 40))})
        server = ServerSettings(stack="nxdi", max_num_seqs=seqs, max_num_batched_tokens=budget,
                                ctx_batch_size=draw(st.integers(1, seqs)))
        graphs = GraphSet("nxdi", context=tuple(context), token_generation=tuple(tkg))
    return prompt, gen, arrival, server, graphs, prof


@pytest.mark.slow  # 2-7 s each on 2 cores: the default run's 90 s budget; cheaper siblings cover it by default
@settings(max_examples=400, deadline=None, derandomize=True)
@given(case=cases())
def test_the_fast_replay_equals_the_plain_one(case):
    prompt, gen, arrival, server, graphs, prof = case
    steps, first, finish, compiles, sums = plain_replay(prompt, gen, arrival, server, graphs, prof)
    run = replay_replica(prompt, gen, arrival, server, graphs, ServingCost(prof), record=True)
    got = expanded_steps(run.runs, server.stack)
    assert len(got) == len(steps) == run.steps
    for mine, plain in zip(got, steps, strict=True):
        assert mine[:6] == plain[:6], (mine, plain)  # the start bit for bit, the graphs and what they hold
        assert mine[6] == pytest.approx(plain[6], rel=1e-12, abs=1e-12)
    assert run.first_ms.tolist() == first and run.finish_ms.tolist() == finish
    assert [(c.step, c.kind, c.graph) for c in run.compiled] == compiles
    assert [run.prompt_tokens, run.prompt_padded, run.decode_tokens, run.decode_padded] == sums
    assert run.prompt_steps == sum(s[2] is not None for s in steps)
    assert run.decode_steps == sum(s[4] is not None for s in steps)
    assert run.busy_ms == pytest.approx(math.fsum(s[6] for s in steps), rel=1e-9, abs=1e-9)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(case=cases(), replicas=st.integers(1, 4))
def test_replicas_replay_the_round_robin_shares(case, replicas):
    """The k-th request in arrival order goes to replica k mod R, and each share replays on its own."""
    prompt, gen, arrival, server, graphs, prof = case
    seconds = np.asarray(arrival) / 1000.0
    bucket = Bucket("b", "b.jsonl", np.array([f"r{i}" for i in range(len(prompt))], dtype=object),
                    np.asarray(prompt), np.asarray(gen), np.arange(1, len(prompt) + 1), seconds)
    trace = trace_of([bucket])
    check_fits(trace, server, graphs, prof.kv_capacity_tokens)
    result = replay(trace, server, graphs, ServingCost(prof), replicas)
    for r in range(replicas):
        share = slice(r, None, replicas)
        _, first, finish, _, _ = plain_replay(trace.prompt[share].tolist(), trace.gen[share].tolist(),
                                              trace.arrival_ms[share].tolist(), server, graphs, prof)
        assert result.first_ms[share].tolist() == first and result.finish_ms[share].tolist() == finish


@pytest.mark.parametrize("stack", ["gaudi", "nxdi"])
def test_an_arrival_exactly_at_a_step_end_is_admitted_at_the_next_step(stack):
    """a decodes in steps of 2 ms from t = 1; b arrives at 5, the end of a's second decode step: b's prefill
    starts at 5 ("arrival at or before t"), not one decode step later."""
    prof = DeviceProfile(prefill=(1.0, 0.0, 0.0), decode=(2.0, 0.0, 0.0), compile_ms=1.0, kv_capacity_tokens=1024)
    server = ServerSettings(stack=stack, max_num_seqs=4, max_num_batched_tokens=100, block_size=16)
    graphs = (GraphSet("gaudi", prompt=((4, 64),), decode=((4, 64),)) if stack == "gaudi"
              else GraphSet("nxdi", context=(64,), token_generation=(64,)))
    prompt, gen, arrival = [10, 10], [10, 3], [0.0, 5.0]
    run = replay_replica(prompt, gen, arrival, server, graphs, ServingCost(prof))
    assert run.first_ms.tolist() == [1.0, 8.0] and run.finish_ms.tolist() == [20.0, 12.0]
    _, first, finish, _, _ = plain_replay(prompt, gen, arrival, server, graphs, prof)
    assert (first, finish) == ([1.0, 8.0], [20.0, 12.0])
