"""vLLM on TPU (``vllm-tpu``, tpu-inference): the token-padding ladder the server compiles, and sizes added to it.

Follows tpu-inference's runner: one model graph per token padding.  The paddings are
a ladder from ``MIN_TOKEN_BUCKET`` (a power of two, default 16) up to the first rung
covering ``--max-num-batched-tokens`` (times the data-parallel size, 1 here): gap 0
doubles; gap g > 0 doubles while <= g, then adds g.  ``compilation_sizes`` from
``--additional-config`` are ADDED to the ladder.  The file records those as
``VAR=value`` lines (``VLLM_TPU_BUCKET_PADDING_GAP``, ``MIN_TOKEN_BUCKET``, and standing
for flags ``MAX_NUM_BATCHED_TOKENS``, ``MAX_MODEL_LEN``, ``MAX_NUM_SEQS``,
``COMPILATION_SIZES``).  Buckets there are token budgets per step; request counts are
padded on a second ladder (powers of two from 8 to --max-num-seqs) for the sampler,
not counted here.
"""

from __future__ import annotations

from pathlib import Path

from model.base.errors import InputError
from model.load.requests import MAX_LEN
from model.serving.graphs import FREE_BATCH_NOTE, Compiled, Graph, count_text, graph_set
from model.serving.parse import MAX_BUCKETS, env_int, env_int_list, env_vars
from model.serving.settings import Settings, from_env, missing
from model.serving.spec import ExportSpec, Given

TPU_MIN_TOKENS = 16  # tpu-inference's MIN_TOKEN_BUCKET default
TPU_SETTINGS = ("max_num_batched_tokens", "max_model_len", "max_num_seqs")


def tpu_count(gap: int, max_len: int, start: int = TPU_MIN_TOKENS) -> int:
    """How many sizes tpu_ladder would produce, without producing them."""
    num, count = start, 0
    if gap == 0:
        while True:
            count += 1
            if num >= max_len:
                return count
            num *= 2
    while num <= gap:
        count += 1
        num *= 2
    num //= 2
    return count + (-(-(max_len - num) // gap) if num < max_len else 0)


def tpu_ladder(gap: int, max_len: int, start: int = TPU_MIN_TOKENS) -> list[int]:
    """tpu-inference's token paddings: gap 0 doubles from ``start`` until max_len is covered; gap g doubles
    while <= g, then adds g until max_len is covered (doc: 512, 64 -> 16, 32, 64, 128, ..., 512).
    """
    out, num = [], start
    if gap == 0:
        while True:
            out.append(num)
            if num >= max_len:
                return out
            num *= 2
    while num <= gap:
        out.append(num)
        num *= 2
    num //= 2
    while num < max_len:
        num += gap
        out.append(num)
    return out


def compile_vllm_tpu(path: Path, text: str, settings: Settings) -> Compiled:
    """``vllm-tpu``: the ladder up to MAX_NUM_BATCHED_TOKENS plus COMPILATION_SIZES, one graph per size."""
    src = str(path)
    env = env_vars(text, src)
    known = from_env(env, src).merged(settings)
    budget = known.values.get("max_num_batched_tokens")
    if budget is None:
        raise InputError(src, None, "MAX_NUM_BATCHED_TOKENS", missing("max_num_batched_tokens", "the TPU token "
                         "ladder (it runs up to the token budget, not the model length)"))
    gap = env_int(env, src, "VLLM_TPU_BUCKET_PADDING_GAP", lo=0) or 0
    start = env_int(env, src, "MIN_TOKEN_BUCKET") or TPU_MIN_TOKENS
    if start & (start - 1):
        raise InputError(src, env["MIN_TOKEN_BUCKET"].line, "MIN_TOKEN_BUCKET", f"{start} is not a power of two "
                         "(tpu-inference asserts it)")
    where = env.get("VLLM_TPU_BUCKET_PADDING_GAP")
    line, fld = (where.line, "VLLM_TPU_BUCKET_PADDING_GAP") if where else (budget.line, budget.field)
    n = tpu_count(gap, budget.value, start)
    if n > MAX_BUCKETS:
        raise InputError(src, line, fld, f"gap {gap} up to {budget.value} makes {n} sizes; at most {MAX_BUCKETS}")
    ladder = tpu_ladder(gap, budget.value, start)
    if ladder[-1] > MAX_LEN:
        raise InputError(src, line, fld, f"the ladder's last size {ladder[-1]} (the first covering the token budget "
                         f"{budget.value}) is over {MAX_LEN}, the longest shape shapeplan plans")
    extra = env_int_list(env, src, "COMPILATION_SIZES")
    for g in extra:
        if g.value > budget.value:
            raise InputError(src, g.line, g.field, f"{g.value} is above the token budget {budget.value} "
                             "(--max-num-batched-tokens): no step holds that many tokens")
    lengths = [Given(v, src, line, fld) for v in ladder] + extra
    graphs = graph_set(Graph("tokens", (g.value,)) for g in lengths)
    return Compiled(tuple(lengths), graphs, settings=known.pairs(TPU_SETTINGS))


# ---------------------------------------------------------------- writer


def planned_vllm_tpu(spec: ExportSpec) -> tuple[Graph, ...]:
    """The plans' graphs on TPU: one token padding per shape (shapes are token budgets per step)."""
    return graph_set(Graph("tokens", (s,)) for s in spec.shapes)


def ladder_candidates(shapes: tuple[int, ...]) -> list[tuple[int, int]]:
    """(MIN_TOKEN_BUCKET, gap) pairs whose ladder could be made of shapes only: a rung is a doubling of the
    start (<= gap) or the last doubling plus multiples of the gap, so each candidate gap is a shape minus a
    doubling; every exact ladder is among these."""
    top = shapes[-1]
    out = []
    m = TPU_MIN_TOKENS
    while m <= 2 * top:
        out.append((m, 0))
        out += [(m, s - m // 2) for s in shapes if 0 < s - m // 2 < m]
        p = m
        while p <= top:
            out += [(m, s - p) for s in shapes if p <= s - p < 2 * p]
            p *= 2
        m *= 2
    return out


def exact_ladder(shapes: tuple[int, ...]) -> tuple[int, int, list[int]]:
    """(MIN_TOKEN_BUCKET, gap, ladder) of a ladder up to the largest shape made of shapes only, the longest
    such (fewest compilation sizes), then the smallest start and gap.  One always exists: a start m with
    m / 2 < largest <= m and gap largest - m / 2 (or 0) makes the largest shape alone."""
    wanted, top = set(shapes), shapes[-1]
    best: tuple[tuple[int, int, int], list[int]] | None = None
    for m, gap in ladder_candidates(shapes):
        if tpu_count(gap, top, m) > len(shapes):
            continue
        ladder = tpu_ladder(gap, top, m)
        if set(ladder) <= wanted:
            key = (-len(ladder), m, gap)
            if best is None or key < best[0]:
                best = (key, ladder)
    assert best is not None
    return best[0][1], best[0][2], best[1]


def write_vllm_tpu(spec: ExportSpec) -> str:
    """``vllm-tpu``: a ladder made of the shapes only, the other shapes as compilation sizes, and the flags."""
    shapes = spec.shapes
    start, gap, ladder = exact_ladder(shapes)
    extra = sorted(set(shapes) - set(ladder))
    seqs = max(spec.batch_sizes or (1,))
    if seqs > shapes[-1]:
        raise InputError("--format", None, None, f"vllm-tpu cannot express the plans: vLLM needs "
                         f"--max-num-batched-tokens ({shapes[-1]}, the largest shape) >= --max-num-seqs ({seqs}, "
                         "the largest batch)")
    mml = spec.max_model_len or max(shapes[-1], *(u.context or 0 for u in spec.uses))
    graphs = planned_vllm_tpu(spec)
    sizes = f" --additional-config '{{\"compilation_sizes\": [{', '.join(map(str, extra))}]}}'" if extra else ""
    lines = ["# shapeplan export for vLLM on TPU (tpu-inference; VAR=value lines).",
             f"# the server compiles exactly the graphs the plans run: {count_text(graphs, spec.compile_ms)}",
             *([f"# ({FREE_BATCH_NOTE})"] if spec.compile_ms is None else []),
             "# TPU buckets are token budgets per scheduler step (requests packed together), not per-request",
             "# prompt lengths: the plans' shapes are used as token budgets. Request counts are padded on a second",
             "# ladder (powers of two from 8 to --max-num-seqs) for the sampler, not counted here.",
             "# The server compiles its whole ladder, from MIN_TOKEN_BUCKET up to the first size covering",
             "# --max-num-batched-tokens (x the data-parallel size, 1 here): gap 0 doubles; gap g doubles up to g,",
             "# then adds g. compilation_sizes are ADDED to it; this ladder is made of plan shapes only.",
             "# MAX_NUM_BATCHED_TOKENS, MAX_MODEL_LEN, MAX_NUM_SEQS and COMPILATION_SIZES are not read by vLLM:",
             "# they record the flags this export needs (model.export --check reads them).",
             f"# ladder: {', '.join(map(str, ladder))}",
             f"# start: --max-num-batched-tokens {shapes[-1]} --max-model-len {mml} --max-num-seqs {seqs}{sizes}",
             f"VLLM_TPU_BUCKET_PADDING_GAP={gap}",
             f"MIN_TOKEN_BUCKET={start}",
             f"MAX_NUM_BATCHED_TOKENS={shapes[-1]}",
             f"MAX_MODEL_LEN={mml}",
             f"MAX_NUM_SEQS={seqs}"]
    if extra:
        lines.append(f"COMPILATION_SIZES={','.join(map(str, extra))}")
    return "\n".join(lines) + "\n"
