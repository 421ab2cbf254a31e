"""``--batch-buckets auto``: the planner chooses the batch buckets with the shapes and the batching.

The space searched is every strictly increasing list of batch sizes within 1..``bucket_top``:
no bucket above ``--max-batch-size`` (it would only add padding rows), and none larger than
the KV capacity lets any batch be at the smallest prompt + generation (such a graph holds no
batch) or than the most requests a bucket has.

The plan.  The planner plans with candidate buckets ``C`` (1, powers of two below the top, the
top) as explicit buckets: ``GraphCost`` with one size class per candidate and the graph cap
across them, so the MIP chooses shapes, graphs and batching jointly.  The buckets chosen are
those the plan's batches run in.  A batch of n runs in the smallest candidate >= n, and that
one is chosen, so it is also the smallest chosen bucket >= n: the plan costs exactly the same
judged under its chosen buckets (``used_buckets``), graphs and pad rows included.

The bound (``auto_bound``) holds for every list in the space, not only for lists of
candidates.  A batch of n members at shape s in graph (B, s), B >= n, costs T(B, s, g_max);
each member's share is at least T(B, s, G_i) / B, with G_i its own gen.  Within a decode
regime T is affine in B with non-negative parts, so T(B) / B falls as B grows: the share is at
least the free batch's floor at the largest batch the regime, the KV capacity and
``--max-batch-size`` allow -- which is device mode's own request floor (``DeviceCost``).  Every
shape runs at least one graph, so at most min(K, graph cap) shapes, each with a compile: the
device-mode shape relaxation with the batch free under that many shapes is a lower bound on
every plan with any buckets of the space.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from model.base.runtime import Deadline
from model.cost.common import align
from model.cost.device import graph_batch
from model.cost.model import CostModel, cost_model
from model.domain.schema import Batching, Problem
from model.histogram.cells import build_histogram
from model.planning.device_search import shape_relaxation


def bucket_top(problem: Problem) -> int:
    """The largest batch bucket worth compiling: --max-batch-size, the most members the KV capacity lets a
    batch hold at the smallest prompt + generation, and the most requests in a bucket (whichever is least)."""
    top = max(len(b) for b in problem.buckets)
    if problem.max_batch_size is not None:
        top = min(top, problem.max_batch_size)
    kv = problem.cost.params.kv_capacity_tokens
    if kv is not None:
        least = min(int((align(b.prompt_len) + b.gen_len).min()) for b in problem.buckets)
        top = min(top, max(kv // least, 1))
    return max(int(top), 1)


def candidate_buckets(top: int) -> tuple[int, ...]:
    """The buckets the planner chooses among: 1, the powers of two below ``top``, and ``top`` itself (the top
    lets the largest batches the KV capacity allows run unpadded)."""
    out = [1 << k for k in range(max(top.bit_length(), 1)) if (1 << k) < top]
    return tuple(sorted({*out, top}))


def device_params(cost: CostModel):
    """The device profile without batch buckets (neither a list nor auto)."""
    return replace(cost.params, batch_buckets=None, auto_buckets=False)


def auto_problem(problem: Problem) -> Problem:
    """The problem the planner solves under ``--batch-buckets auto``: graphs priced over the candidate buckets,
    marked ``choose_buckets``."""
    params = replace(device_params(problem.cost), batch_buckets=candidate_buckets(bucket_top(problem)))
    return replace(problem, cost=cost_model("device", params), choose_buckets=True)


def with_buckets(problem: Problem, buckets: tuple[int, ...]) -> Problem:
    """The same problem with these batch buckets fixed (nothing left to choose)."""
    params = replace(device_params(problem.cost), batch_buckets=tuple(buckets))
    return replace(problem, cost=cost_model("device", params), choose_buckets=False)


def used_buckets(problem: Problem, batchings: tuple[Batching, ...]) -> tuple[int, ...]:
    """The buckets a plan's batches run in under ``problem``'s buckets: judged under them alone it costs the
    same (see the module docstring)."""
    buckets = problem.cost.batch_buckets
    sizes = [np.bincount(bt.batch_of) for bt in batchings if len(bt.batch_of)]
    used = np.unique(np.concatenate([graph_batch(n[n > 0], buckets) for n in sizes])) if sizes else np.ones(1)
    return tuple(int(b) for b in used)


def bound_problem(problem: Problem) -> Problem:
    """The relaxation ``auto_bound`` solves: the batch free, no graph caps, at most min(K, graph cap) shapes."""
    cap = problem.graph_cap
    k = problem.max_shapes if cap is None else max(min(problem.max_shapes, cap), 1)
    return replace(problem, cost=cost_model("device", device_params(problem.cost)), choose_buckets=False,
                   max_graphs=None, max_warmup_s=None, max_shapes=k)


def auto_bound(problem: Problem, deadline: Deadline = Deadline.never()) -> float:
    """A lower bound on every plan under any batch buckets of the space (module docstring); -inf when the
    deadline cuts it short."""
    relaxed = bound_problem(problem)
    return float(shape_relaxation(relaxed, [build_histogram(b) for b in relaxed.buckets], deadline).bound)


def full_batch_sizes(problem: Problem, shapes: tuple[int, ...], top: int) -> tuple[int, ...]:
    """Batch sizes worth trying as buckets: at each shape, the most members the KV capacity lets a batch hold
    at the median and the 90th-percentile generation of the requests that shape covers first (a bucket there
    runs full batches unpadded); empty without a KV capacity."""
    kv = problem.cost.params.kv_capacity_tokens
    if kv is None or not shapes:
        return ()
    out: set[int] = set()
    edges = np.asarray(shapes, dtype=np.int64)
    for b in problem.buckets:
        at = np.searchsorted(edges, align(b.prompt_len), side="left")
        for i, s in enumerate(shapes):
            gens = b.gen_len[at == i]
            if len(gens):
                out.update(int(kv // (s + int(g))) for g in np.percentile(gens, [50, 90]).astype(np.int64))
    return tuple(sorted(v for v in out if 1 <= v <= top))


def bucket_moves(buckets: tuple[int, ...], values: tuple[int, ...]) -> list[tuple[int, ...]]:
    """The lists one move from ``buckets``: a bucket dropped, a value added, or a bucket replaced by a value
    between its neighbours (the largest bucket stays: it holds the largest batches)."""
    out: list[tuple[int, ...]] = []
    have = set(buckets)
    for b in buckets[:-1]:
        out.append(tuple(x for x in buckets if x != b))
    for v in values:
        if v not in have:
            out.append(tuple(sorted(have | {v})))
    for k, b in enumerate(buckets[:-1]):
        lo = buckets[k - 1] if k else 0
        hi = buckets[k + 1]
        out += [tuple(sorted((have - {b}) | {v})) for v in values if lo < v < hi and v != b]
    seen: set[tuple[int, ...]] = set()
    return [m for m in out if m and not (m in seen or seen.add(m))]
