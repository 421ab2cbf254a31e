"""vLLM on Gaudi (vllm-gaudi): the ``gaudi-file`` bucket file and the ``gaudi-env`` bucketing variables.

Follows vllm-gaudi's rules: ``VLLM_BUCKETING_FROM_FILE`` wins over any strategy, the
deprecated ``VLLM_EXPONENTIAL_BUCKETING`` overrides ``VLLM_BUCKETING_STRATEGY`` (default
``exp``), ``lin`` ladders are MIN, doubling up to STEP, then +STEP up to MAX, and ``exp``
spaces ceil(log2(max model length)) + 1 points geometrically from the block size.  Export
writes exactly the shapes the plans use: a bucket file always can; the variables only
when a ``lin`` ladder generates exactly them (otherwise one line points at gaudi-file).
"""

from __future__ import annotations

import ast
import math
import re
from pathlib import Path

from model.base.errors import InputError
from model.serving.ladders import exp_ladder, lin_count, lin_cover, lin_ladder
from model.serving.parse import (
    MAX_BUCKETS,
    EnvValue,
    check_range,
    env_int,
    env_vars,
    max_model_len_of,
    read_text,
    shown,
    text_lines,
)
from model.serving.spec import DEFAULT_BLOCK_SIZE, ExportSpec, Given

# ---------------------------------------------------------------- gaudi-file


_RANGE = re.compile(r"range\s*\(([^()]*)\)")
_GAUDI_FIELDS = ("batch", "query_len", "ctx_blocks")


def read_gaudi_file(path: Path, text: str, max_model_len: int | None) -> list[Given]:
    """``gaudi-file``: the query_len of every prompt bucket (see ``gaudi_file_buckets``)."""
    src = str(path)
    return [Given(q, src, number, "query_len") for number, dims in gaudi_file_buckets(path, text) for q in dims[1]
            if q != 1]


def gaudi_file_buckets(path: Path, text: str) -> list[tuple[int, list[range | list[int]]]]:
    """``gaudi-file``: (line, [batch values, query_len values, ctx_blocks values]) of every bucket line.

    One Python literal 3-tuple a line, read with ast.literal_eval only.

    ``range(a, b[, step])`` is recognised here (its arguments are literal integers) and
    stands in for its values lazily, so ``range(0, 10**12, 1)`` or a huge Cartesian
    product is refused by counting, before anything is expanded.  Strings are not
    allowed in a bucket, which keeps the stand-ins unambiguous.  A tuple whose middle
    element is 1 is a decode bucket (checked, not a shape); any other is a prompt bucket
    whose query_len is a shape.
    """
    src = str(path)
    out: list[tuple[int, list[range | list[int]]]] = []
    total = 0
    for number, body in text_lines(text, src):
        if "'" in body or '"' in body:
            raise InputError(src, number, None, "strings are not allowed in a bucket line")
        literal, ranges = _range_stand_ins(body, src, number)
        try:
            bucket = ast.literal_eval(literal)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            raise InputError(src, number, None, f"not a Python literal 3-tuple: {shown(body)}") from None
        if not isinstance(bucket, tuple) or len(bucket) != 3:
            raise InputError(src, number, None, f"expected a 3-tuple (batch, query_len, ctx_blocks), got {shown(body)}")
        dims = [_gaudi_values(v, ranges, src, number, name) for v, name in zip(bucket, _GAUDI_FIELDS, strict=True)]
        count = math.prod(len(d) for d in dims)
        total += count
        if count > MAX_BUCKETS or total > MAX_BUCKETS:
            raise InputError(src, number, None, f"expands to {total if count <= MAX_BUCKETS else count} buckets; "
                             f"at most {MAX_BUCKETS} are accepted (refused before expanding)")
        for name, lo, values in zip(_GAUDI_FIELDS, (1, 1, 0), dims, strict=True):
            for v in (values[0], values[-1]) if isinstance(values, range) else values:
                check_range(v, src, number, name, lo)
        out.append((number, dims))
    return out


def _range_stand_ins(body: str, src: str, line: int) -> tuple[str, list[range]]:
    """body with each ``range(...)`` replaced by the string literal 'range#k', and the k-th lazy range."""
    ranges: list[range] = []
    pieces, at = [], 0
    for m in _RANGE.finditer(body):
        ranges.append(_literal_range(m.group(1), src, line))
        pieces += [body[at:m.start()], repr(f"range#{len(ranges) - 1}")]
        at = m.end()
    return "".join(pieces) + body[at:], ranges


def _literal_range(args: str, src: str, line: int) -> range:
    """``range(...)``'s arguments, each a literal integer; the range stays lazy."""
    try:
        values = ast.literal_eval(f"({args},)")
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise InputError(src, line, "range", f"arguments must be literal integers, got {shown(args)}") from None
    if not 1 <= len(values) <= 3 or any(isinstance(v, bool) or not isinstance(v, int) for v in values):
        raise InputError(src, line, "range", f"expected range(a, b[, step]) of integers, got range({args})")
    if len(values) == 3 and values[2] == 0:
        raise InputError(src, line, "range", "step must not be zero")
    r = range(*values)
    try:
        n = len(r)
    except OverflowError:
        n = MAX_BUCKETS + 1
    if n > MAX_BUCKETS:
        raise InputError(src, line, "range", f"range({args}) has more than {MAX_BUCKETS} values; refused "
                         "before expanding")
    if n == 0:
        raise InputError(src, line, "range", f"range({args}) is empty")
    return r if r.step > 0 else r[::-1]


def _gaudi_values(value, ranges: list[range], src: str, line: int, name: str) -> range | list[int]:
    """One element of a bucket tuple: an int, a list of ints or a recognised range."""
    if isinstance(value, str):
        return ranges[int(value.split("#")[1])]
    items = value if isinstance(value, list) else [value]
    if any(isinstance(v, str) for v in items):
        raise InputError(src, line, name, "range(...) cannot stand inside a list: use the range or a list")
    if not items:
        raise InputError(src, line, name, "empty list: the line would describe no bucket")
    for v in items:
        if isinstance(v, bool) or not isinstance(v, int):
            raise InputError(src, line, name, f"expected an integer, a list of integers or range(...), "
                             f"got {shown(v) if not isinstance(v, (tuple, set, dict)) else repr(v)[:40]}")
    return items


# ---------------------------------------------------------------- gaudi-env


_BUCKET_VAR = re.compile(r"VLLM_(PROMPT|DECODE)_\w*BUCKET\w*")
_KNOWN_BUCKET_VARS = frozenset(f"VLLM_{phase}_{dim}_BUCKET_{p}" for phase in ("PROMPT", "DECODE")
                               for dim in ("BS", "QUERY", "SEQ", "CTX", "BLOCK")
                               for p in ("MIN", "STEP", "MAX", "LIMIT", "PAD_MAX", "PAD_PERCENT"))
GAUDI_STRATEGIES = ("exp", "lin", "pad")


def read_gaudi_env(path: Path, text: str, max_model_len: int | None) -> list[Given]:
    """``gaudi-env``: vllm-gaudi's bucketing variables; the shapes are the prompt query lengths.

    ``VLLM_BUCKETING_FROM_FILE`` wins over any strategy (as in vllm-gaudi); then the
    deprecated ``VLLM_EXPONENTIAL_BUCKETING`` (true -> exp, false -> lin) overrides
    ``VLLM_BUCKETING_STRATEGY`` (default exp).  A misspelt bucket variable is an error,
    not a silently ignored line.
    """
    src = str(path)
    env = gaudi_env(text, src)
    target = bucket_file_of(env, path)
    if target is not None:
        return read_gaudi_file(target, read_text(target), max_model_len)
    strategy = gaudi_strategy(env, src)
    if strategy == "pad":
        v = env["VLLM_BUCKETING_STRATEGY"]
        raise InputError(src, v.line, "VLLM_BUCKETING_STRATEGY", "the pad strategy is not supported; "
                         "use lin, exp or VLLM_BUCKETING_FROM_FILE")
    if strategy == "exp":
        return gaudi_exp_query(env, src, max_model_len)
    return gaudi_lin_query(env, src)


def gaudi_env(text: str, src: str) -> dict[str, EnvValue]:
    """The variables of a gaudi-env file; a misspelt bucketing variable is an error, not an ignored line."""
    env = env_vars(text, src)
    for name, v in env.items():
        if _BUCKET_VAR.fullmatch(name) and name not in _KNOWN_BUCKET_VARS:
            raise InputError(src, v.line, name, "unknown bucketing variable (a typo?)")
    return env


def bucket_file_of(env: dict[str, EnvValue], path: Path) -> Path | None:
    """The bucket file ``VLLM_BUCKETING_FROM_FILE`` names (relative to the env file's folder), or None."""
    bucket_file = env.get("VLLM_BUCKETING_FROM_FILE")
    if bucket_file is None:
        return None
    target = Path(bucket_file.value)
    target = target if target.is_absolute() else path.parent / target
    if not bucket_file.value or not target.is_file():
        raise InputError(str(path), bucket_file.line, "VLLM_BUCKETING_FROM_FILE",
                         f"{str(target)!r} is not a file (relative paths are taken from {str(path.parent)!r})")
    return target


def gaudi_strategy(env: dict[str, EnvValue], src: str) -> str:
    """The strategy vllm-gaudi would run with these variables."""
    legacy = env.get("VLLM_EXPONENTIAL_BUCKETING")
    if legacy is not None:
        flag = legacy.value.strip().lower()
        if flag not in ("1", "true", "t", "yes", "0", "false", "f", "no"):
            raise InputError(src, legacy.line, "VLLM_EXPONENTIAL_BUCKETING", f"expected true or false, "
                             f"got {legacy.value!r}")
        return "exp" if flag in ("1", "true", "t", "yes") else "lin"
    chosen = env.get("VLLM_BUCKETING_STRATEGY")
    if chosen is None:
        return "exp"
    if chosen.value not in GAUDI_STRATEGIES:
        raise InputError(src, chosen.line, "VLLM_BUCKETING_STRATEGY", f"expected one of "
                         f"{', '.join(GAUDI_STRATEGIES)}, got {chosen.value!r}")
    return chosen.value


def gaudi_lin_query(env: dict[str, EnvValue], src: str) -> list[Given]:
    """The ``lin`` prompt query ladder, from the QUERY variables or their legacy SEQ names."""
    cfg: list[int] = []
    names: list[str] = []
    for p in ("MIN", "STEP", "MAX"):
        new, old = f"VLLM_PROMPT_QUERY_BUCKET_{p}", f"VLLM_PROMPT_SEQ_BUCKET_{p}"
        a, b = env_int(env, src, new), env_int(env, src, old)
        if a is not None and b is not None and a != b:
            raise InputError(src, env[old].line, old, f"{b} disagrees with {new}={a}")
        if a is None and b is None:
            raise InputError(src, None, new, "missing (or its legacy name " + old + "); lin's default depends on "
                             "the server's block size and token budget")
        cfg.append(a if a is not None else b)
        names.append(new if a is not None else old)
    bmin, bstep, bmax = cfg
    if bmin > bmax:
        raise InputError(src, env[names[2]].line, names[2], f"{bmax} is below MIN {bmin}")
    n = lin_count(bmin, bstep, bmax)
    if n > MAX_BUCKETS:
        raise InputError(src, env[names[1]].line, names[1], f"the ladder has {n} values; at most {MAX_BUCKETS}")
    line = env[names[2]].line
    return [Given(v, src, line, names[2]) for v in lin_ladder(bmin, bstep, bmax)]


def gaudi_exp_query(env: dict[str, EnvValue], src: str, max_model_len: int | None) -> list[Given]:
    """The ``exp`` prompt query buckets vllm-gaudi derives, ignoring the user's QUERY values.

    block_size to max_model_len, ceil(log2(max_model_len)) + 1 points on a geometric
    scale rounded up to the block size -- before the server drops buckets over its
    token budget, which this file cannot know.
    """
    mml = max_model_len_of(env, src, max_model_len, "the exp strategy derives its buckets from the max model length")
    block = env_int(env, src, "BLOCK_SIZE") or DEFAULT_BLOCK_SIZE
    if block > mml:
        raise InputError(src, env["BLOCK_SIZE"].line if "BLOCK_SIZE" in env else None, "BLOCK_SIZE",
                         f"{block} is larger than the max model length {mml}")
    line = env["MAX_MODEL_LEN"].line if "MAX_MODEL_LEN" in env else None
    count = math.ceil(math.log2(mml)) + 1
    return [Given(v, src, line, "MAX_MODEL_LEN") for v in exp_ladder(block, block, mml, count)]


# ---------------------------------------------------------------- writers


def decode_buckets(spec: ExportSpec) -> list[tuple[int, int]]:
    """Gaudi decode buckets (batch n, total KV blocks) for every (shape, n) the plans use.

    A batch of n sequences at context c holds n * ceil(c / block size) blocks; the shape's
    context (its longest) covers every batch at that shape.
    """
    out = set()
    for u in spec.uses:
        if u.context is None:
            continue
        per_seq = -(-u.context // spec.block_size)
        out.update((n, n * per_seq) for n in (u.batch_sizes or (1,)))
    return sorted(out)


def _literal(values: list[int] | tuple[int, ...]) -> str:
    """One gaudi-file element: a bare int when there is one value, else a list."""
    return str(values[0]) if len(values) == 1 else "[" + ", ".join(map(str, values)) + "]"


def write_gaudi_file(spec: ExportSpec) -> str:
    """``gaudi-file``: exactly the (batch, shape) pairs used, and their decode buckets."""
    lines = ["# shapeplan export: vLLM on Gaudi bucket file. Start the server with",
             "# VLLM_BUCKETING_FROM_FILE=<this file>; it takes precedence over VLLM_BUCKETING_STRATEGY.",
             "# prompt: (batch sizes, query_len, ctx_blocks) -- each shape with the batch sizes the plans use"]
    lines += [f"({_literal(u.batch_sizes or (1,))}, {u.shape}, 0)" for u in spec.uses]
    decode = decode_buckets(spec)
    if decode:
        lines.append(f"# decode: (batch, 1, total KV blocks of the batch at block size {spec.block_size}), "
                     "a sequence's context being shape + longest generation")
        by_size: dict[int, list[int]] = {}
        for n, blocks in decode:
            by_size.setdefault(n, []).append(blocks)
        lines += [f"({n}, 1, {_literal(blocks)})" for n, blocks in sorted(by_size.items())]
    else:
        lines.append("# decode buckets need the generation lengths: export with --requests or --scenario")
    return "\n".join(lines) + "\n"


def write_gaudi_env(spec: ExportSpec) -> str:
    """``gaudi-env``: the lin strategy with a query ladder that generates exactly the shapes.

    Refused (one line naming gaudi-file) when no MIN/STEP/MAX generates exactly them:
    a covering ladder would compile lengths the plans never use, which is what they
    were optimised to avoid.
    """
    shapes = spec.shapes
    qmin, qstep, qmax = lin_cover(shapes)
    if lin_ladder(qmin, qstep, qmax) != list(shapes):
        raise InputError("--format", None, None,
                         f"gaudi-env cannot express the shapes {', '.join(map(str, shapes))}: the lin strategy "
                         "only makes ladders (MIN, doubling up to STEP, then +STEP up to MAX); export with "
                         "--format gaudi-file and set VLLM_BUCKETING_FROM_FILE to that file")
    sizes = spec.batch_sizes or (1,)
    lines = ["# shapeplan export: vLLM on Gaudi bucketing variables (VAR=value; source or pass as environment).",
             "# lin keeps these values; exp (the default) would overwrite them. VLLM_EXPONENTIAL_BUCKETING,",
             "# deprecated, overrides the strategy when set, so it is pinned to lin (false) as well.",
             "VLLM_BUCKETING_STRATEGY=lin",
             "VLLM_EXPONENTIAL_BUCKETING=false",
             f"# prompt query lengths: exactly the shapes {', '.join(map(str, shapes))}",
             *_triple("VLLM_PROMPT_QUERY_BUCKET", (qmin, qstep, qmax)),
             "# the same under the legacy names older releases read",
             *_triple("VLLM_PROMPT_SEQ_BUCKET", (qmin, qstep, qmax))]
    bs = lin_cover(sizes)
    lines += [(f"# prompt batch sizes: a ladder covering {', '.join(map(str, sizes))} "
               f"(it makes {', '.join(map(str, lin_ladder(*bs)))}); lin crosses it with every query length"),
              *_triple("VLLM_PROMPT_BS_BUCKET", bs)]
    decode = decode_buckets(spec)
    if decode:
        dbs = lin_cover([n for n, _ in decode])
        blocks = lin_cover([b for _, b in decode])
        lines += [(f"# decode: batch sizes and total KV blocks (block size {spec.block_size}); each ladder "
                   "covers what the plans' batches need"),
                  *_triple("VLLM_DECODE_BS_BUCKET", dbs), *_triple("VLLM_DECODE_BLOCK_BUCKET", blocks)]
    else:
        lines.append("# decode buckets need the generation lengths: export with --requests or --scenario")
    return "\n".join(lines) + "\n"


def _triple(prefix: str, cfg: tuple[int, int, int]) -> list[str]:
    return [f"{prefix}_{p}={v}" for p, v in zip(("MIN", "STEP", "MAX"), cfg, strict=True)]

