"""Serving mode's scheduler (``shared/serving_model.md``): one replica replays its requests step by step.

Each step admits waiting requests first come first served, runs one prompt graph (the
admitted prompts) and one decode graph (every running request, one token each), and
advances the clock by the sum of their times (``model.cost.serving``).  The replay is
exact -- every step the contract describes happens here, in its order, with its float
additions -- but it does not pay Python's price for every step:

- Every running request gains one token a step, so a request admitted at step a with
  ``gen_len`` g finishes after step a + g - 1, and its context at step s is
  ``prompt_len - a + s``.  Finishes are a heap of steps, and the context sum of the
  running batch is ``base + n*s`` with ``base`` the sum of ``prompt_len - a``.
- gaudi's block count nb changes only when some request's context crosses a block
  boundary, at steps known in advance: a heap of crossings (about gen_len/block_size a
  request).  nxdi's longest context is ``max(prompt_len - a) + s``, a heap too.
- A step that admits nothing, compiles nothing, and is followed by steps with the same
  running set and the same decode graph has the same duration as they do: such a
  stretch runs as one loop of float additions (the clock stays bit for bit what step-by-
  step addition gives), up to the next finish, bucket change, crossing that takes nb
  past the graph (a crossing within it is counted and the stretch goes on) or -- when a
  request could be admitted -- the step at whose end the next one has arrived.  A queue
  whose head does not fit stays blocked until a request finishes, whatever arrives.

The brute-force check (``tests/test_replay_bruteforce.py``) replays random traces with
a plain step-by-step scheduler and compares every number.
"""

from __future__ import annotations

import array
import heapq
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from model.cost.serving import ServingCost
from model.domain.server import Graph, GraphSet, ServerSettings, runtime_decode_graph, runtime_prompt_graph

TICK_EVERY = 4095  # loop rounds between two looks at the deadline (a mask: 2**k - 1)


@dataclass(frozen=True)
class RuntimeCompile:
    """A graph the set lacked, compiled while serving (gaudi): the step that needed it and the graph."""

    step: int  # 1-based, as the contract's worked example counts steps
    start_ms: float
    kind: str  # "prompt" or "decode"
    graph: Graph


@dataclass(frozen=True, eq=False)
class StepRuns:
    """The steps, as runs of equal consecutive steps (``count`` steps of ``duration_ms`` from ``start_ms``).

    A run of several steps is decode only, on one graph, with the same running batch and nb;
    its later steps start at ``start_ms`` plus the duration added once per step.
    ``prompt_*`` and ``decode_*`` are 0 where the step has no such graph; ``decode_need``
    is nb (gaudi) or the longest context (nxdi) at the run's first step: within a run nb
    stays (a run ends before a block boundary), the longest context grows by one a step.
    """

    start_ms: np.ndarray
    count: np.ndarray
    duration_ms: np.ndarray
    prompt_n: np.ndarray
    prompt_len: np.ndarray
    prompt_b: np.ndarray
    prompt_x: np.ndarray
    decode_n: np.ndarray
    decode_need: np.ndarray
    decode_b: np.ndarray
    decode_x: np.ndarray
    compiles: np.ndarray


@dataclass(frozen=True, eq=False)
class ReplicaRun:
    """What one replica's replay gives: each request's first token and finish, and the step totals.

    Requests are indexed in the replica's arrival order.  Token sums are exact integers:
    prompt tokens and the padded B*S of the prompt graphs; decode context (prompt_len +
    j over the running requests) and the context tokens of the decode graphs.
    """

    first_ms: np.ndarray
    finish_ms: np.ndarray
    steps: int
    prompt_steps: int
    decode_steps: int
    busy_ms: float
    prompt_tokens: int
    prompt_padded: int
    decode_tokens: int
    decode_padded: int
    compiled: tuple[RuntimeCompile, ...]
    runs: StepRuns | None = None


class _Cover:
    """gaudi's lookup: the first graph in sorted order with B >= n and X >= x, per n by bisection.

    For the graphs with B >= n in sorted order, the running maximum of X first reaches x
    at the first graph whose X >= x, so one bisection over those maxima finds it.
    """

    def __init__(self, graphs: tuple[Graph, ...]):
        self.graphs = sorted(graphs)
        self.tables: dict[int, tuple[list[int], list[Graph]]] = {}

    def find(self, n: int, x: int) -> Graph | None:
        table = self.tables.get(n)
        if table is None:
            chosen = [g for g in self.graphs if g[0] >= n]
            tops, top = [], 0
            for g in chosen:
                top = max(top, g[1])
                tops.append(top)
            table = self.tables[n] = (tops, chosen)
        at = bisect_left(table[0], x)
        return table[1][at] if at < len(table[1]) else None

    def add(self, graph: Graph) -> None:
        self.graphs = sorted({*self.graphs, graph})
        self.tables.clear()


def replay_replica(prompt: list[int], gen: list[int], arrival_ms: list[float], settings: ServerSettings,
                   graphs: GraphSet, cost: ServingCost, record: bool = False,
                   tick: Callable[[], None] | None = None) -> ReplicaRun:
    """Replay one replica's requests (sorted by arrival, ms from any origin) on ``graphs``.

    The requests must fit the server (each prompt within the token budget; gaudi: each
    reservation within the KV pool; nxdi: each request within the largest buckets):
    ``model.evaluation.replay_run`` checks that first, naming the request's line.
    ``tick`` is called every few thousand loop rounds (a deadline's check).
    """
    gaudi = settings.stack == "gaudi"
    bs = settings.block_size
    big_m, budget = settings.max_num_seqs, settings.max_num_batched_tokens
    cap = settings.prefill_cap(graphs)
    count = len(prompt)
    p_arr, g_arr = np.asarray(prompt, dtype=np.int64), np.asarray(gen, dtype=np.int64)
    resv = (-(-(p_arr + g_arr) // bs)).tolist()  # gaudi's reservation, blocks
    last_blocks = (-(-(p_arr + g_arr - 1) // bs)).tolist()  # blocks at a request's last decode step
    first_blocks = (-(-p_arr // bs)).tolist()  # ceil(p / bs): the count before its first token
    first = [0.0] * count
    finish = [0.0] * count
    offset = [0] * count  # prompt_len - admission step
    last_step = [0] * count
    gone = bytearray(count)
    free = settings.total_blocks(cost.profile.kv_capacity_tokens or 0) if gaudi else 0
    prompt_cover, decode_cover = _Cover(graphs.prompt), _Cover(graphs.decode)
    context, tkg = list(graphs.context), list(graphs.token_generation)
    prompt_time: dict[Graph, float] = {}
    decode_time: dict[Graph, float] = {}
    rc = cost.runtime_compile_ms
    compiled: list[RuntimeCompile] = []
    runs = [array.array("d"), array.array("q"), array.array("d")] + [array.array("q") for _ in range(9)]

    fin: list[tuple[int, int]] = []  # (last step, request)
    cross: list[tuple[int, int]] = []  # gaudi: (step whose context enters a new block, request)
    longest: list[tuple[int, int]] = []  # nxdi: (-(prompt_len - admission step), request)
    t = arrival_ms[0] if count else 0.0
    s = nxt = head = n = done = base = nb = 0
    blocked, dirty = False, True
    dgraph: Graph = (0, 0)
    dd, dctx, hi = 0.0, 0, 0
    busy = 0.0
    steps = psteps = dsteps = ptok = ppad = dtok = dpad = 0
    rounds = 0
    while done < count:
        rounds += 1
        if tick is not None and not rounds & TICK_EVERY:
            tick()
        if not blocked:  # a blocked queue takes no one before a finish: later arrivals are scanned then
            while nxt < count and arrival_ms[nxt] <= t:
                nxt += 1
            if n == 0 and head == nxt:
                t = arrival_ms[nxt]  # nothing runs, nothing waits: the clock jumps to the next arrival
                continue
        k = smax = 0
        room = budget - n
        if head < nxt and not blocked:
            limit = min(big_m - n, cap)
            while head < nxt and k < limit:
                pi = prompt[head]
                if pi > room:
                    break
                if gaudi:
                    if resv[head] > free:
                        break
                    free -= resv[head]
                room -= pi
                k += 1
                head += 1
                if pi > smax:
                    smax = pi
            blocked = k == 0
        compiles = 0
        pgraph: Graph = (0, 0)
        pms = 0.0
        if k:
            if gaudi:
                found = prompt_cover.find(k, smax)
                if found is None:
                    found = runtime_prompt_graph(k, smax, settings)
                    prompt_cover.add(found)
                    compiled.append(RuntimeCompile(s + 1, t, "prompt", found))
                    compiles += 1
                pgraph = found
            else:
                pgraph = (settings.ctx_batch_size, context[bisect_left(context, smax)])
            pms = prompt_time.get(pgraph)
            if pms is None:
                pms = prompt_time[pgraph] = cost.prompt_ms(*pgraph)
            psteps += 1
            ptok += budget - n - room
            ppad += pgraph[0] * pgraph[1]
        need = 0
        if n:
            if gaudi:
                while cross and cross[0][0] == s:
                    _, i = heapq.heappop(cross)
                    nb += 1
                    if s + bs <= last_step[i]:
                        heapq.heappush(cross, (s + bs, i))
                need = nb
                if dirty or nb > dgraph[1]:
                    found = decode_cover.find(n, nb)
                    if found is None:
                        found = runtime_decode_graph(n, nb, settings)
                        decode_cover.add(found)
                        compiled.append(RuntimeCompile(s + 1, t, "decode", found))
                        compiles += 1
                    dgraph, dctx = found, found[1] * bs
                    dd = _time_of(decode_time, dgraph, dctx, cost)
            else:
                need = s - longest[0][0]
                if dirty or need > hi:
                    hi = tkg[bisect_left(tkg, need)]
                    dgraph, dctx = (big_m, hi), big_m * hi
                    dd = _time_of(decode_time, dgraph, dctx, cost)
            dirty = False
        if n and not k and not compiles:
            # a stretch of equal decode-only steps, up to the next finish or bucket change, or the step at whose
            # end the next request has arrived; a block crossing that leaves nb within the graph continues it
            last = fin[0][0]
            while True:
                most = last - s + 1
                if gaudi and cross and cross[0][0] - s < most:
                    most = cross[0][0] - s
                elif not gaudi and hi + 1 - need < most:
                    most = hi + 1 - need  # the step whose longest context passes the bucket
                start, run = t, 0
                if blocked or nxt == count:
                    for _ in range(most):
                        t += dd
                    run = most
                else:
                    arrive = arrival_ms[nxt]
                    while run < most:
                        t += dd
                        run += 1
                        if t >= arrive:
                            break
                busy += dd * run
                steps += run
                dsteps += run
                dtok += run * base + n * (run * s + run * (run - 1) // 2)
                dpad += run * dctx
                if record:
                    for col, v in zip(runs, (start, run, dd, 0, 0, 0, 0, n, need, *dgraph, 0), strict=True):
                        col.append(v)
                s += run  # the next step
                if s > last or not gaudi or not (blocked or nxt == count or t < arrival_ms[nxt]):
                    break  # a finish, nxdi's bucket change, or a request that has arrived: the top takes over
                while cross and cross[0][0] == s:  # s is a crossing step: count it, as the step itself would
                    _, i = heapq.heappop(cross)
                    nb += 1
                    if s + bs <= last_step[i]:
                        heapq.heappush(cross, (s + bs, i))
                need = nb
                if nb > dgraph[1]:  # the graph changes: the step runs from the top, its crossings counted
                    break
            s -= 1  # the stretch's last step, whose finishes follow
        else:
            if not k and not n:  # check_fits rules this out: without it the clock would stand still forever
                raise AssertionError(f"request {head} can never be admitted and nothing runs")
            start = t
            duration = pms + dd if n else pms
            if compiles:
                duration += compiles * rc
            t += duration
            busy += duration
            steps += 1
            if n:
                dsteps += 1
                dtok += base + n * s
                dpad += dctx
            if record:
                row = (start, 1, duration, k, smax, *pgraph, n, need, *(dgraph if n else (0, 0)), compiles)
                for col, v in zip(runs, row, strict=True):
                    col.append(v)
        # the step (or the stretch's last step) s ends at t: finishes, then the admitted join
        while fin and fin[0][0] == s:
            _, i = heapq.heappop(fin)
            finish[i] = t
            gone[i] = 1
            done += 1
            n -= 1
            base -= offset[i]
            if gaudi:
                nb -= last_blocks[i]
                free += resv[i]
            blocked, dirty = False, True
        if not gaudi:
            while longest and gone[longest[0][1]]:
                heapq.heappop(longest)
        for i in range(head - k, head):
            first[i] = t
            if gen[i] == 1:
                finish[i] = t
                done += 1
                free += resv[i] if gaudi else 0
                continue
            last = s + gen[i] - 1
            last_step[i] = last
            offset[i] = prompt[i] - s
            base += offset[i]
            n += 1
            heapq.heappush(fin, (last, i))
            if gaudi:
                nb += first_blocks[i]
                crossing = s + 1 + (-prompt[i]) % bs
                if crossing <= last:
                    heapq.heappush(cross, (crossing, i))
            else:
                heapq.heappush(longest, (-offset[i], i))
            dirty = True
        s += 1
    return ReplicaRun(np.asarray(first), np.asarray(finish), steps, psteps, dsteps, busy, ptok, ppad, dtok, dpad,
                      tuple(compiled), _runs(runs) if record else None)


def _time_of(times: dict[Graph, float], graph: Graph, context_tokens: int, cost: ServingCost) -> float:
    """A decode graph's step time, priced once per graph (the replay asks again only when the graph changes)."""
    found = times.get(graph)
    if found is None:
        found = times[graph] = cost.decode_ms(graph[0], context_tokens)
    return found


def _runs(columns: list[array.array]) -> StepRuns:
    """The recorded runs as arrays (float64 times, int64 counts and dimensions)."""
    return StepRuns(*(np.frombuffer(c, dtype=np.float64 if c.typecode == "d" else np.int64).copy() for c in columns))
