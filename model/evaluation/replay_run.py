"""A trace replayed on R replicas: the requests in arrival order, the checks before the replay, the round-robin deal.

The scheduler (``model.evaluation.replay``) needs requests that the server can serve at
all; a request it could never admit would make it wait forever, so every such request
is an input error here, naming its file and line, before any step runs: a prompt over
the step's token budget (no chunked prefill), a gaudi reservation over the whole KV
pool, an nxdi request longer than the largest bucket (nxdi compiles nothing at run time).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from model.base.errors import InputError
from model.cost.serving import ServingCost
from model.domain.schema import Bucket
from model.domain.server import GraphSet, ServerSettings
from model.evaluation.replay import ReplicaRun, replay_replica

# The replay's clock is float64 ms from the first arrival: over 1e11 ms (about 3 years) a step of 20 ms still
# lands within 2e-5 ms.  --rate-scale 1e-9 stretched a 70-minute trace to 4e15 ms (latencies off by 0.004 ms),
# 1e-300 to 1e306 ms, where a step added nothing (every TTFT 0) and the JSON held inf (a traceback).
MAX_SPAN_MS = 1e11


def check_span(span_ms: float, rate_scales: Sequence[float]) -> None:
    """The trace (first to last arrival: ``span_ms`` at rate scale 1) at every rate scale stays within
    ``MAX_SPAN_MS``, else an InputError naming --rate-scale, before any replay."""
    for x in rate_scales:
        if not span_ms / x <= MAX_SPAN_MS:
            raise InputError("--rate-scale", None, None, f"at {x:g} the trace's {span_ms / 1000.0:.6g} s of arrivals "
                             f"span {span_ms / x / 1000.0:.3g} s; the replay's clock (float64 ms) stays exact to "
                             f"microseconds over at most {MAX_SPAN_MS / 1000.0:g} s: give a larger --rate-scale")


TIME_HINT = ("give each request an arrival time: an arrival_s field or column, TIMESTAMP with --columns azure, "
             "or --time-column NAME")


@dataclass(frozen=True, eq=False)
class Trace:
    """The requests to replay in arrival order (ties: file order, files in the order given).

    ``arrival_ms`` counts from the first arrival, divided by the rate scale (a scale of
    2 compresses the trace into half the time).  ``source``/``line`` say where each
    request was read, so an error can point at it.
    """

    ids: np.ndarray
    prompt: np.ndarray
    gen: np.ndarray
    arrival_ms: np.ndarray
    source: np.ndarray
    line: np.ndarray

    def __len__(self) -> int:
        return int(self.prompt.shape[0])

    def where(self, k: int) -> tuple[str, int]:
        """File and line of the k-th request (arrival order)."""
        return str(self.source[k]), int(self.line[k])


def trace_of(buckets: Sequence[Bucket], rate_scale: float = 1.0) -> Trace:
    """The buckets' requests as one trace in arrival order; every request needs an arrival time."""
    for b in buckets:
        if b.arrival_s is None:
            raise InputError(b.source, None, "arrival_s", f"no arrival times: {TIME_HINT}")
    arrival = np.concatenate([b.arrival_s for b in buckets])
    order = np.argsort(arrival, kind="stable")
    seconds = arrival[order] - arrival[order[0]]
    check_span(float(seconds[-1]) * 1000.0 if len(seconds) else 0.0, (rate_scale,))
    cat = {name: np.concatenate([getattr(b, name) for b in buckets])[order]
           for name in ("request_ids", "prompt_len", "gen_len", "lines")}
    source = np.concatenate([np.full(len(b), b.source, dtype=object) for b in buckets])[order]
    return Trace(cat["request_ids"], cat["prompt_len"], cat["gen_len"], seconds * 1000.0 / rate_scale, source,
                 cat["lines"])


def check_fits(trace: Trace, settings: ServerSettings, graphs: GraphSet, kv_capacity_tokens: int | None) -> None:
    """Every request can be served (see the module docstring); the first that cannot is an InputError."""
    budget = settings.max_num_batched_tokens
    _first_over(trace, trace.prompt > budget, "prompt_len", lambda p, g: f"{p} is above max_num_batched_tokens "
                f"{budget}: the replay has no chunked prefill, so the prompt could never be admitted")
    if settings.stack == "gaudi":
        if kv_capacity_tokens is None:
            raise InputError("--device-profile", None, "device.kv_capacity_tokens", "missing: gaudi reserves KV blocks "
                             "from a pool of kv_capacity_tokens")
        pool = settings.total_blocks(kv_capacity_tokens)
        need = -(-(trace.prompt + trace.gen) // settings.block_size)
        _first_over(trace, need > pool, "gen_len", lambda p, g: f"prompt_len + gen_len = {p + g} needs "
                    f"{-(-(p + g) // settings.block_size)} KV blocks of {settings.block_size} tokens; the pool "
                    f"holds {pool} (kv_capacity_tokens {kv_capacity_tokens})")
        if not graphs.prompt and settings.max_prefill_seqs is None:
            raise InputError(graphs.source or "--graphs", None, "prompt", "no prompt graphs, so no default for "
                             "max_prefill_seqs: list prompt graphs or set max_prefill_seqs")
        return
    top_context, top_tkg = graphs.context[-1], graphs.token_generation[-1]
    _first_over(trace, trace.prompt > top_context, "prompt_len", lambda p, g: f"{p} is above the largest context "
                f"bucket {top_context} (nxdi compiles nothing at run time)")
    _first_over(trace, (trace.gen > 1) & (trace.prompt + trace.gen - 1 > top_tkg), "gen_len",
                lambda p, g: f"the context reaches prompt_len + gen_len - 1 = {p + g - 1}, above the largest "
                f"token-generation bucket {top_tkg} (nxdi compiles nothing at run time)")


def _first_over(trace: Trace, bad: np.ndarray, field: str, message: Callable[[int, int], str]) -> None:
    """An InputError for the first request (in file order of its file) where ``bad`` holds."""
    hits = np.flatnonzero(bad)
    if hits.size:
        k = int(hits[np.lexsort((trace.line[hits], trace.source[hits].astype(str)))][0])
        raise InputError(*trace.where(k), field, message(int(trace.prompt[k]), int(trace.gen[k])))


@dataclass(frozen=True, eq=False)
class ReplayResult:
    """Every replica's replay; ``first_ms`` and ``finish_ms`` are per request of the trace (arrival order)."""

    trace: Trace
    settings: ServerSettings
    graphs: GraphSet
    replicas: tuple[ReplicaRun, ...]
    first_ms: np.ndarray
    finish_ms: np.ndarray


def replay(trace: Trace, settings: ServerSettings, graphs: GraphSet, cost: ServingCost, replicas: int = 1,
           record: bool = False, tick: Callable[[], None] | None = None) -> ReplayResult:
    """Deal the trace round-robin (the k-th request in arrival order to replica k mod R) and replay each share.

    Each replica compiles the same graph set before serving and keeps its own run-time
    compiles.  Call ``check_fits`` first.  ``tick`` is also called before each replica: a replica's loop
    looks at it only every few thousand rounds, and a short share (a capacity probe of 1,024 replicas)
    never reaches that many, so without it a search of thousands of short replays never stopped.
    """
    first = np.zeros(len(trace))
    finish = np.zeros(len(trace))
    runs = []
    for r in range(replicas):
        if tick is not None:
            tick()
        share = slice(r, None, replicas)
        run = replay_replica(trace.prompt[share].tolist(), trace.gen[share].tolist(),
                             trace.arrival_ms[share].tolist(), settings, graphs, cost, record, tick)
        first[share], finish[share] = run.first_ms, run.finish_ms
        runs.append(run)
    return ReplayResult(trace, settings, graphs, tuple(runs), first, finish)
