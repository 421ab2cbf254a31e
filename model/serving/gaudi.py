"""vLLM on Gaudi (vllm-gaudi): the bucketing rules, as its code applies them (late 2026).

Ranges: ``lin`` is MIN, doubling while below STEP, then +STEP up to MAX (MIN 0 adds a 0
bucket); ``exp`` spaces ``limit`` points geometrically from MIN to MAX, each rounded
up to STEP (MIN 0 or 1 adds that value), the last held at MAX.  Graphs: prompt
``(batch, query_len, ctx_blocks)`` and decode ``(batch, 1, total KV blocks)``, the full
product of the ranges (a file lists them).  Filters (prefix caching on, the vLLM
default, so no contiguous PA): a prompt graph is dropped when its query is over
``--max-model-len``, its context blocks over ceil((max_model_len - 1) / block size),
batch x query over ``--max-num-batched-tokens`` or its batch over
``VLLM_PROMPT_BS_BUCKET_MAX`` (1 when unset), the most prompts a step batches.  A
decode graph is dropped when its batch is over its blocks and capped at batch x
ceil(max_model_len / block size) blocks.  Reading files is in ``gaudi_read``,
writing them in ``gaudi_write``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from model.base.errors import InputError
from model.serving.graphs import Dropped, Graph
from model.serving.parse import MAX_BUCKETS
from model.serving.settings import missing

LONG_CTX_THRESHOLD = 8192  # from this max model length on, the largest prompt context follows each query
DEFAULT_PROMPT_BS_MAX = 1  # vllm-gaudi's max prefill batch when VLLM_PROMPT_BS_BUCKET_MAX is unset

# ---------------------------------------------------------------- ranges


def lin_ladder(bmin: int, bstep: int, bmax: int) -> list[int]:
    """vllm-gaudi's ``lin`` rule: start at MIN, double while below STEP, then STEP, 2 STEP, ... up to MAX.

    Values below MIN are dropped, as vllm-gaudi's warmup_range does (bmin >= 1 here).
    Documented example: (2, 32, 64) -> 2, 4, 8, 16, 32, 64.
    """
    ramp = []
    x = bmin
    while x < bstep and x <= bmax:
        ramp.append(x)
        x *= 2
    return [b for b in ramp + list(range(bstep, bmax + 1, bstep)) if b >= bmin]


def lin_count(bmin: int, bstep: int, bmax: int) -> int:
    """How many values lin_ladder would produce, without producing them (to refuse huge ones)."""
    ramp = 0
    x = bmin
    while x < bstep and x <= bmax:
        ramp += 1
        x *= 2
    first = max(bstep, -(-bmin // bstep) * bstep)
    return ramp + (len(range(first, bmax + 1, bstep)) if first <= bmax else 0)


def lin_range(bmin: int, bstep: int, bmax: int) -> list[int]:
    """The whole ``lin`` range: MIN 0 stands for a 0 bucket plus the ladder from STEP (0, 0, 0 -> [0])."""
    if bmin == 0:
        return [0] if bmax == 0 else sorted({0, *lin_ladder(bstep, bstep, bmax)})
    return lin_ladder(bmin, bstep, bmax)


def lin_range_count(bmin: int, bstep: int, bmax: int) -> int:
    """len(lin_range(...)) without building it."""
    if bmin == 0:
        return 1 if bmax == 0 else 1 + lin_count(bstep, bstep, bmax)
    return lin_count(bmin, bstep, bmax)


def lin_cover(values: list[int] | tuple[int, ...]) -> tuple[int, int, int]:
    """(MIN, STEP, MAX) of the smallest ``lin`` ladder found that contains every value.

    MIN and MAX are the smallest and largest value; every value on the STEP part is a
    multiple of STEP, so the STEPs worth trying are the divisors of the values.  When an
    exact ladder exists this finds it (its size equals the number of values): a ladder
    made only of doublings is the STEP = MAX case.
    """
    vals = sorted(set(values))
    lo, hi = vals[0], vals[-1]
    best: tuple[int, int] | None = None
    for step in sorted({d for v in vals for d in divisors(v)}):
        if not _lin_covers(vals, lo, step, hi):
            continue
        key = (lin_count(lo, step, hi), -step)
        if best is None or key < best:
            best = key
    assert best is not None  # STEP 1 always covers
    return lo, -best[1], hi


def lin_exact(values: Iterable[int]) -> tuple[int, int, int] | None:
    """(MIN, STEP, MAX) of a ``lin`` ladder that makes exactly these values, or None if none does."""
    vals = sorted(set(values))
    cfg = lin_cover(vals)
    return cfg if lin_ladder(*cfg) == vals else None


def _lin_covers(vals: list[int], lo: int, step: int, hi: int) -> bool:
    ramp = set()
    x = lo
    while x < step and x <= hi:
        ramp.add(x)
        x *= 2
    return all(v in ramp or (v >= step and v % step == 0) for v in vals)


def divisors(n: int) -> set[int]:
    """Every positive divisor of n (n >= 1; trial division, n is at most 2**20-ish)."""
    out = set()
    for d in range(1, math.isqrt(n) + 1):
        if n % d == 0:
            out.update((d, n // d))
    return out


def exp_ladder(bmin: int, bstep: int, bmax: int, count: int) -> list[int]:
    """vllm-gaudi's ``exp`` range: ``count`` points from bmin to bmax on a geometric scale, each rounded up
    to a multiple of bstep, duplicates dropped, the largest held at bmax; a bmin of 0 or 1 starts the scale
    at bstep and adds that value.  Its docstring's example: (128, 128, 2048, 10) -> 128, 256, 384, 512,
    640, 896, 1152, 1536, 2048.
    """
    origin = bmin
    if bmin in (0, 1):
        bmin = bstep
    if count <= 1:
        return [bmax]
    out = {math.ceil(float(bmin * np.float_power(bmax / bmin, (1.0 / float(count - 1)) * i)) / bstep) * bstep
           for i in range(count)}
    if origin in (0, 1):
        out.add(origin)
    ordered = sorted(int(b) for b in out)
    if ordered[-1] > bmax:
        ordered[-1] = bmax
    return ordered


def log_points(n: int) -> int:
    """ceil(log2(n)): the ``limit`` vllm-gaudi gives an exp range up to n (0 for n = 1)."""
    return math.ceil(math.log2(n)) if n > 1 else 0


# ---------------------------------------------------------------- the server a config runs on


@dataclass(frozen=True)
class GaudiServer:
    """What vllm-gaudi's bucketing reads besides the bucket settings (None: not known here)."""

    block_size: int
    max_model_len: int | None = None
    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None
    prompt_bs_max: int | None = None  # VLLM_PROMPT_BS_BUCKET_MAX
    ctx_bucket_max: int | None = None  # VLLM_PROMPT_CTX_BUCKET_MAX (the long-context edge respects it)
    contiguous_pa: bool = False  # VLLM_CONTIGUOUS_PA (off whenever prefix caching is on, vLLM's default)

    @property
    def max_prefill(self) -> int:
        return self.prompt_bs_max or DEFAULT_PROMPT_BS_MAX

    def need(self, value: int | None, name: str, why: str, src: str) -> int:
        """A setting a rule cannot be followed without: its value, or an InputError naming it."""
        if value is None:
            raise InputError(src, None, name, missing(name, why))
        return value


def check_count(count: int, src: str, what: str) -> None:
    """Refuse a product of ranges larger than MAX_BUCKETS before it is built."""
    if count > MAX_BUCKETS:
        raise InputError(src, None, None, f"the {what} expand to {count} graphs; at most {MAX_BUCKETS} are "
                         "counted (refused before expanding)")


def prompt_product(bs: list[int], query: list[int], ctx: list[int], server: GaudiServer) -> list[tuple[int, ...]]:
    """Every prompt tuple of the ranges, with vllm-gaudi's long-context edge: from a max model length of 8192
    the largest context value becomes (max_model_len - query) // block size per query, when
    VLLM_PROMPT_CTX_BUCKET_MAX allows it (the value carries to the next query otherwise, as in its loop)."""
    out = []
    top = max(ctx)
    long = server.max_model_len is not None and server.max_model_len >= LONG_CTX_THRESHOLD
    for b, c0 in itertools.product(bs, ctx):
        c = c0
        for q in query:
            if long and c0 == top:
                edge = (server.max_model_len - q) // server.block_size
                if edge >= 0 and (server.ctx_bucket_max is None or edge < server.ctx_bucket_max):
                    c = edge
            out.append((b, q, c))
    return out


Ruled = tuple[list[Graph], list[Dropped], list[str]]  # (compiled, dropped, notes)


def prompt_rules(tuples: Iterable[tuple[int, ...]], server: GaudiServer) -> Ruled:
    """(compiled, dropped, notes) of prompt tuples under the server's filters; a filter whose setting is not
    known is not applied and a note names the setting."""
    kept, dropped, notes = [], [], []
    mml, budget, block = server.max_model_len, server.max_num_batched_tokens, server.block_size
    for b, q, c in tuples:
        g = Graph("prompt", (b, q, c))
        if mml is not None and q > mml:
            dropped.append(Dropped(g, f"query_len {q} over --max-model-len {mml}"))
        elif mml is not None and c > math.ceil((mml - 1) / block):
            dropped.append(Dropped(g, f"{c} context blocks over ceil((--max-model-len - 1) / block size) = "
                                      f"{math.ceil((mml - 1) / block)}"))
        elif budget is not None and b * q > budget:
            dropped.append(Dropped(g, f"batch x query_len {b * q} over --max-num-batched-tokens {budget}"))
        elif b > server.max_prefill:
            unset = "" if server.prompt_bs_max else " (its default when unset)"
            dropped.append(Dropped(g, f"batch {b} over VLLM_PROMPT_BS_BUCKET_MAX {server.max_prefill}{unset}"))
        else:
            kept.append(g)
    if mml is None:
        notes.append(missing("max_model_len", "dropping prompt graphs longer than the max model length"))
    if budget is None:
        notes.append(missing("max_num_batched_tokens", "dropping prompt graphs over the token budget"))
    return kept, dropped, notes


def decode_rules(tuples: Iterable[tuple[int, ...]], server: GaudiServer) -> Ruled:
    """(compiled, dropped, notes) of decode tuples: without contiguous PA a graph needs at least a block per
    sequence and is capped at batch x ceil(max_model_len / block size) blocks."""
    kept, dropped, notes = [], [], []
    mml = server.max_model_len
    for b, q, blocks in tuples:
        g = Graph("decode", (b, q, blocks))
        if server.contiguous_pa:
            kept.append(g)
        elif b > blocks:
            dropped.append(Dropped(g, f"batch {b} over its {blocks} blocks"))
        elif mml is not None and blocks > b * -(-mml // server.block_size):
            cap = b * -(-mml // server.block_size)
            dropped.append(Dropped(g, f"capped at batch x ceil(--max-model-len / block size) = {cap} blocks: "
                                      f"compiled as ({b}, 1, {cap})"))
            kept.append(Graph("decode", (b, q, cap)))
        else:
            kept.append(g)
    if mml is None and not server.contiguous_pa:
        notes.append(missing("max_model_len", "capping decode graphs at the max model length"))
    return kept, dropped, notes


# ---------------------------------------------------------------- the lin and exp strategies' ranges


Triple = tuple[int | None, int | None, int | None]  # (MIN, STEP, MAX) as set; None: vllm-gaudi's default


def pick(value: int | None, default: int | None, setting: str, why: str, src: str) -> int:
    """A range parameter: as set, else vllm-gaudi's default, else an InputError naming the setting it needs."""
    if value is not None:
        return value
    if default is None:
        raise InputError(src, None, setting, missing(setting, why))
    return default


def lin_prompt_cfgs(cfg: dict[str, Triple], server: GaudiServer, src: str) -> list[tuple[int, int, int]]:
    """The lin prompt (MIN, STEP, MAX) triples, each parameter as set or by vllm-gaudi's default: batch (1, 1,
    VLLM_PROMPT_BS_BUCKET_MAX), query (block, block, token budget), context (0, 1, (max model len - query
    MIN) // block)."""
    block, mml = server.block_size, server.max_model_len
    b0, b1, b2 = cfg.get("bs", (None, None, None))
    bs = (pick(b0, 1, "", "", src), pick(b1, 1, "", "", src), pick(b2, server.max_prefill, "", "", src))
    q0, q1, q2 = cfg.get("query", (None, None, None))
    query = (pick(q0, block, "", "", src), pick(q1, block, "", "", src),
             pick(q2, server.max_num_batched_tokens, "max_num_batched_tokens", "lin's default query MAX", src))
    c0, c1, c2 = cfg.get("ctx", (None, None, None))
    ctx = (pick(c0, 0, "", "", src), pick(c1, 1, "", "", src),
           pick(c2, None if mml is None else (mml - query[0]) // block, "max_model_len",
                "lin's default context MAX", src))
    return [check_order(r, src) for r in (bs, query, ctx)]


def check_order(cfg: tuple[int, int, int], src: str) -> tuple[int, int, int]:
    """vllm-gaudi asserts MIN <= MAX (and a 0 STEP would never end): an InputError instead."""
    if cfg[0] > cfg[2] or (cfg[1] < 1 and cfg[2] > 0):
        raise InputError(src, None, None, f"a lin range (MIN, STEP, MAX) = {cfg} needs MIN <= MAX and STEP >= 1")
    return cfg


def exp_prompt_ranges(server: GaudiServer, query_min: int, src: str) -> tuple[list[int], list[int], list[int]]:
    """The exp prompt ranges (since October 2025): batch 1..VLLM_PROMPT_BS_BUCKET_MAX, query up to the token
    budget with ceil(log2(budget)) points, context 0..max blocks; the user's bucket values are ignored."""
    block = server.block_size
    budget = server.need(server.max_num_batched_tokens, "max_num_batched_tokens", "the exp query range", src)
    mml = server.need(server.max_model_len, "max_model_len", "the exp context range", src)
    if log_points(budget) < 1:
        raise InputError(src, None, "max_num_batched_tokens", f"{budget} gives the exp range no point")
    bs_max = server.max_prefill
    bs = exp_ladder(1, 2, bs_max, log_points(bs_max) + 1)
    query = exp_ladder(query_min, block, budget, log_points(budget))
    if mml >= LONG_CTX_THRESHOLD:
        top = max(1, (mml - budget) // block)
    else:
        top = max(1, (mml - query_min) // block)
    ctx = exp_ladder(0, 1, top, 2 if top == 1 else log_points(top) + 1)
    return bs, query, ctx


def lin_decode_cfgs(cfg: dict[str, Triple], server: GaudiServer, src: str) -> list[tuple[int, int, int]]:
    """The lin decode triples, each parameter as set or by default: batch (1, 32, --max-num-seqs), blocks
    (1, block, max model len x max seqs // block); a block MIN above MAX becomes MAX - STEP, as in vllm-gaudi."""
    block, seqs, mml = server.block_size, server.max_num_seqs, server.max_model_len
    b0, b1, b2 = cfg.get("decode_bs", (None, None, None))
    bs = (pick(b0, 1, "", "", src), pick(b1, 32, "", "", src),
          pick(b2, seqs, "max_num_seqs", "lin's default decode batch MAX", src))
    k0, k1, k2 = cfg.get("block", (None, None, None))
    top = None if mml is None or seqs is None else max(mml * seqs // block, block)
    bmin, bstep, bmax = (pick(k0, 1, "", "", src), pick(k1, block, "", "", src),
                         pick(k2, top, "max_model_len" if mml is None else "max_num_seqs",
                              "lin's default decode block MAX", src))
    if bmin > bmax:
        bmin = max(1, bmax - bstep)
    return [check_order(bs, src), check_order((bmin, bstep, bmax), src)]


def lin_ranges(cfgs: list[tuple[int, int, int]], src: str, what: str) -> list[list[int]]:
    """The ranges of lin triples, their product counted (and refused over MAX_BUCKETS) before any is built."""
    check_count(math.prod(lin_range_count(*c) for c in cfgs), src, what)
    return [lin_range(*c) for c in cfgs]


def exp_decode_ranges(server: GaudiServer, kv_blocks: int | None, src: str) -> tuple[list[int], list[int], str | None]:
    """The exp decode ranges: batch 1..--max-num-seqs, blocks 1..max seqs x ceil(max model len / block),
    clamped to 3 x the KV cache's blocks (a note when that count is not known)."""
    seqs = server.need(server.max_num_seqs, "max_num_seqs", "the exp decode range", src)
    mml = server.need(server.max_model_len, "max_model_len", "the exp decode range", src)
    top = -(-mml // server.block_size) * seqs
    note = None
    if kv_blocks is not None:
        top = min(top, 3 * kv_blocks)
    else:
        note = missing("num_gpu_blocks_override", "clamping the exp decode block range to 3 x the KV cache's blocks")
    bs = exp_ladder(1, 2, seqs, log_points(seqs) + 1)
    blocks = exp_ladder(1, seqs, top, log_points(top) + 1)
    return bs, blocks, note
