"""vLLM on TPU (``vllm-tpu``): the padding-gap ladder the server compiles, and the compilation sizes added to it.

Follows vLLM's TPU runner: it always compiles its whole ladder (gap 0: powers of two
from 16 until the max model length is covered; gap g: doubling from 16 up to g, then
+g until it is covered) plus ``compilation_sizes`` from ``--additional-config``.  The
file records those as ``VAR=value`` lines (``VLLM_TPU_BUCKET_PADDING_GAP``,
``MAX_MODEL_LEN``, ``COMPILATION_SIZES``).  Buckets there are token budgets per step.
"""

from __future__ import annotations

from pathlib import Path

from model.base.errors import InputError
from model.cost.common import GRANULARITY
from model.serving.parse import MAX_BUCKETS, env_int, env_int_list, env_vars, max_model_len_of
from model.serving.spec import ExportSpec, Given, align

TPU_MIN_TOKENS = 16  # vLLM's TPU runner starts its ladder at 16 tokens


def tpu_count(gap: int, max_len: int) -> int:
    """How many sizes tpu_ladder would produce, without producing them."""
    num, count = TPU_MIN_TOKENS, 0
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


def tpu_ladder(gap: int, max_len: int) -> list[int]:
    """vLLM's TPU token paddings: gap 0 doubles from 16 until max_len is covered; gap g doubles
    from 16 while <= g, then adds g until max_len is covered (doc: 512, 64 -> 16, 32, 64, 128, ..., 512).
    """
    out, num = [], TPU_MIN_TOKENS
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


def read_vllm_tpu(path: Path, text: str, max_model_len: int | None) -> list[Given]:
    """``vllm-tpu``: the ladder VLLM_TPU_BUCKET_PADDING_GAP generates up to the max model length,
    plus COMPILATION_SIZES (sizes added through --additional-config compilation_sizes).

    The max model length is the ``MAX_MODEL_LEN`` key or the ``max_model_len`` argument.
    """
    src = str(path)
    env = env_vars(text, src)
    mml = max_model_len_of(env, src, max_model_len, "the TPU ladder runs up to the max model length")
    gap = env_int(env, src, "VLLM_TPU_BUCKET_PADDING_GAP", lo=0) or 0
    n = tpu_count(gap, mml)
    if n > MAX_BUCKETS:
        raise InputError(src, env["VLLM_TPU_BUCKET_PADDING_GAP"].line, "VLLM_TPU_BUCKET_PADDING_GAP",
                         f"gap {gap} up to {mml} makes {n} sizes; at most {MAX_BUCKETS}")
    line = env["VLLM_TPU_BUCKET_PADDING_GAP"].line if "VLLM_TPU_BUCKET_PADDING_GAP" in env else None
    extra = env_int_list(env, src, "COMPILATION_SIZES")
    for g in extra:
        if g.value > mml:
            raise InputError(src, g.line, g.field, f"{g.value} is above the max model length {mml}: the server "
                             "ignores it")
    return [Given(v, src, line, "VLLM_TPU_BUCKET_PADDING_GAP") for v in tpu_ladder(gap, mml)] + extra


def tpu_plan(shapes: tuple[int, ...], max_len: int) -> tuple[int, list[int], list[int]]:
    """(gap, compiled sizes, compilation sizes): the gap whose ladder plus the shapes it misses
    compiles the fewest sizes (ties: fewer compilation sizes, then the smaller gap).

    Gaps tried: 0 and every multiple of 64 up to max_len (beyond 16 and 32, which round
    up to 64, those ladders are multiples of 64 like the shapes).
    """
    wanted = set(shapes)
    best: tuple[tuple[int, int, int], list[int], list[int]] | None = None
    for gap in (0, *range(GRANULARITY, max_len + 1, GRANULARITY)):
        ladder = {align(v) for v in tpu_ladder(gap, max_len)}
        missing = sorted(wanted - ladder)
        key = (len(ladder) + len(missing), len(missing), gap)
        if best is None or key < best[0]:
            best = (key, sorted(ladder | wanted), missing)
    assert best is not None
    return best[0][2], best[1], best[2]


def write_vllm_tpu(spec: ExportSpec) -> str:
    """``vllm-tpu``: padding gap, max model length and the compilation sizes the ladder misses."""
    shapes = spec.shapes
    mml = spec.max_model_len or max(shapes[-1], *(u.context or 0 for u in spec.uses))
    gap, compiled, extra = tpu_plan(shapes, mml)
    ladder = tpu_ladder(gap, mml)
    lines = ["# shapeplan export for vLLM on TPU (VAR=value lines).",
             "# TPU buckets are token budgets per scheduler step (requests packed together), not per-request",
             "# prompt lengths: the plans' shapes are used as token budgets.",
             "# The server compiles its whole ladder: gap 0 doubles from 16 until the max model length is",
             "# covered; gap g doubles from 16 up to g, then adds g. Extra sizes go in compilation_sizes,",
             "# passed as --additional-config '{\"compilation_sizes\": [...]}'; they are ADDED to the ladder.",
             "# MAX_MODEL_LEN and COMPILATION_SIZES are not read by vLLM: they record --max-model-len and",
             "# the compilation_sizes this export needs.",
             f"# ladder: {', '.join(map(str, ladder))}",
             f"# compiled in all (rounded up to 64): {', '.join(map(str, compiled))}",
             f"# start: --max-model-len {mml}"
             + (f" --additional-config '{{\"compilation_sizes\": [{', '.join(map(str, extra))}]}}'" if extra else ""),
             f"VLLM_TPU_BUCKET_PADDING_GAP={gap}",
             f"MAX_MODEL_LEN={mml}"]
    if extra:
        lines.append(f"COMPILATION_SIZES={','.join(map(str, extra))}")
    return "\n".join(lines) + "\n"

