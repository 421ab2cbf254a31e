"""Reading vLLM-on-Gaudi configs by vllm-gaudi's rules: the ``gaudi-file`` bucket file and ``gaudi-env`` variables.

``VLLM_BUCKETING_FROM_FILE`` wins over any strategy; then the deprecated
``VLLM_EXPONENTIAL_BUCKETING`` (true: exp, false: lin; a warning) overrides
``VLLM_BUCKETING_STRATEGY`` (default ``exp``).  Each gives the graphs the server
compiles after its filters (``model.serving.gaudi``), the prompt lengths among them,
and warnings for names vllm-gaudi never reads (``*_LIMIT``; ``PAD_*`` outside the pad
strategy) and for the bucket values ``exp`` overwrites.  A misspelt bucket variable is
an error, not a silently ignored line.
"""

from __future__ import annotations

import ast
import itertools
import math
import re
from pathlib import Path

from model.base.errors import InputError
from model.load.requests import MAX_LEN
from model.serving.gaudi import (
    GaudiServer,
    check_count,
    decode_rules,
    exp_decode_ranges,
    exp_prompt_ranges,
    lin_decode_cfgs,
    lin_prompt_cfgs,
    lin_range_count,
    lin_ranges,
    prompt_product,
    prompt_rules,
)
from model.serving.graphs import Compiled, graph_set
from model.serving.parse import MAX_BUCKETS, EnvValue, check_range, env_int, env_vars, read_text, shown, text_lines
from model.serving.settings import Settings, from_comments, from_env, missing
from model.serving.spec import DEFAULT_BLOCK_SIZE, Given

SERVER_SETTINGS = ("max_model_len", "max_num_batched_tokens", "max_num_seqs", "block_size", "prompt_bs_bucket_max")

# ---------------------------------------------------------------- gaudi-file

_RANGE = re.compile(r"range\s*\(([^()]*)\)")
_GAUDI_FIELDS = ("batch", "query_len", "ctx_blocks")
Row = tuple[int, int, int, int]  # (batch, query_len, ctx_blocks, line)


def bucket_rows(path: Path, text: str) -> list[Row]:
    """``gaudi-file``: one Python literal 3-tuple a line, read with ast.literal_eval only, expanded.

    ``range(a, b[, step])`` is recognised here (its arguments are literal integers) and
    stands in for its values lazily, so ``range(0, 10**12, 1)`` or a huge Cartesian
    product is refused by counting, before anything is expanded.  Strings are not
    allowed in a bucket, which keeps the stand-ins unambiguous.  A tuple whose middle
    element is 1 is a decode bucket; its block count may reach batch x 2**20 (every
    sequence at the longest length in blocks of one token), a prompt bucket's 2**20.
    """
    src = str(path)
    out: list[Row] = []
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
        total = len(out) + count
        if count > MAX_BUCKETS or total > MAX_BUCKETS:
            raise InputError(src, number, None, f"expands to {total if count <= MAX_BUCKETS else count} buckets; "
                             f"at most {MAX_BUCKETS} are accepted (refused before expanding)")
        for name, lo, hi, values in zip(_GAUDI_FIELDS, (1, 1, 0), (MAX_LEN, MAX_LEN, MAX_LEN * MAX_LEN), dims,
                                        strict=True):
            for v in (values[0], values[-1]) if isinstance(values, range) else values:
                check_range(v, src, number, name, lo, hi)
        for b, q, c in itertools.product(*dims):
            if q != 1 and c > MAX_LEN:
                check_range(c, src, number, "ctx_blocks", 0, MAX_LEN)
            elif c > b * MAX_LEN:
                raise InputError(src, number, "ctx_blocks", f"{c} blocks is more than batch {b} x {MAX_LEN} "
                                 "(a sequence of 2**20 tokens in blocks of one)")
            out.append((b, q, c, number))
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


def server_of(settings: Settings, env: dict[str, EnvValue] | None = None, src: str = "") -> GaudiServer:
    """The server a config runs on: its settings, and (gaudi-env) the variables beside the bucket ones."""
    env = env or {}
    contiguous = env.get("VLLM_CONTIGUOUS_PA")
    return GaudiServer(settings.get("block_size") or DEFAULT_BLOCK_SIZE, settings.get("max_model_len"),
                       settings.get("max_num_batched_tokens"), settings.get("max_num_seqs"),
                       settings.get("prompt_bs_bucket_max"), env_int(env, src, "VLLM_PROMPT_CTX_BUCKET_MAX", lo=0),
                       contiguous is not None and contiguous.value.strip().lower() in ("1", "true", "t", "yes"))


def compiled_rows(rows: list[Row], server: GaudiServer, settings: Settings, src: str,
                  notes: tuple[str, ...] = ()) -> Compiled:
    """The graphs a bucket file's rows make the server compile, and the prompt lengths among them."""
    line = {}
    for b, q, c, number in rows:
        line.setdefault((b, q, c), number)
    prompt, p_dropped, p_notes = prompt_rules([k for k in line if k[1] != 1], server)
    decode, d_dropped, d_notes = decode_rules([k for k in line if k[1] == 1], server)
    extra = [] if any(k[1] == 1 for k in line) else [
        f"{src}: no decode bucket (middle element 1): vllm-gaudi builds no decode graph and the server cannot start"]
    lengths = tuple(Given(g.dims[1], src, line[g.dims], "query_len") for g in prompt)
    if not lengths and p_dropped:
        first = p_dropped[0]
        raise InputError(src, line[first.graph.dims], None, f"no prompt graph survives the server's filters: "
                         f"{first.graph}: {first.reason}")
    return Compiled(lengths, graph_set(prompt + decode), tuple(p_dropped + d_dropped),
                    settings.pairs(SERVER_SETTINGS), (*notes, *(f"{src}: {n}" for n in p_notes + d_notes), *extra))


def compile_gaudi_file(path: Path, text: str, settings: Settings) -> Compiled:
    """``gaudi-file``: the file's graphs under the server's filters (settings from ``# setting:`` lines too)."""
    src = str(path)
    settings = from_comments(text, src).merged(settings)
    rows = bucket_rows(path, text)
    if not rows:  # a truncated or comment-only file: replayed, it ran on run-time compiles alone (exit 0)
        raise InputError(src, None, None, "no bucket line (one Python 3-tuple a line): the file lists no graph")
    return compiled_rows(rows, server_of(settings), settings, src)


# ---------------------------------------------------------------- gaudi-env

_BUCKET_VAR = re.compile(r"VLLM_(PROMPT|DECODE)_\w*BUCKET\w*")
_PARAMS = ("MIN", "STEP", "MAX")
_WELL_FORMED = frozenset(f"VLLM_{phase}_{dim}_BUCKET_{p}" for phase in ("PROMPT", "DECODE")
                         for dim in ("BS", "QUERY", "SEQ", "CTX", "BLOCK")
                         for p in (*_PARAMS, "LIMIT", "PAD_MAX", "PAD_PERCENT"))
_READ = frozenset(f"VLLM_{phase}_{dim}_BUCKET_{p}" for phase, dims in (("PROMPT", ("BS", "QUERY", "SEQ", "CTX")),
                                                                       ("DECODE", ("BS", "BLOCK")))
                  for dim in dims for p in _PARAMS)
_EXP_KEEPS = frozenset({"VLLM_PROMPT_BS_BUCKET_MAX", "VLLM_PROMPT_CTX_BUCKET_MAX"})
GAUDI_STRATEGIES = ("exp", "lin", "pad")
_TRUE, _FALSE = ("1", "true", "t", "yes"), ("0", "false", "f", "no")


def compile_gaudi_env(path: Path, text: str, settings: Settings) -> Compiled:
    """``gaudi-env``: the graphs vllm-gaudi makes from these variables (and the server settings)."""
    src = str(path)
    env = env_vars(text, src)
    notes = []
    for name, v in env.items():
        if _BUCKET_VAR.fullmatch(name) and name not in _WELL_FORMED:
            raise InputError(src, v.line, name, "unknown bucketing variable (a typo?)")
    settings = from_env(env, src).merged(settings)
    bucket_file = env.get("VLLM_BUCKETING_FROM_FILE")
    if bucket_file is not None:
        target = Path(bucket_file.value)
        target = target if target.is_absolute() else path.parent / target
        if not bucket_file.value or not target.is_file():
            raise InputError(src, bucket_file.line, "VLLM_BUCKETING_FROM_FILE",
                             f"{str(target)!r} is not a file (relative paths are taken from {str(path.parent)!r})")
        body = read_text(target)
        both = from_comments(body, str(target)).merged(settings)
        return compiled_rows(bucket_rows(target, body), server_of(both, env, src), both, str(target))
    strategy, legacy_note = gaudi_strategy(env, src)
    notes += [legacy_note] if legacy_note else []
    if strategy == "pad":
        v = env["VLLM_BUCKETING_STRATEGY"]
        raise InputError(src, v.line, "VLLM_BUCKETING_STRATEGY", "the pad strategy is not supported; "
                         "use lin, exp or VLLM_BUCKETING_FROM_FILE")
    for name, v in env.items():
        if name in _WELL_FORMED and name not in _READ:
            notes.append(f"{src}:{v.line}: {name} is never read by vllm-gaudi (ignored)")
        elif strategy == "exp" and name in _READ and name not in _EXP_KEEPS and not (
                name == "VLLM_PROMPT_QUERY_BUCKET_MIN" and v.value.strip() == "1"):
            notes.append(f"{src}:{v.line}: the exp strategy overwrites {name} (ignored)")
    server = server_of(settings, env, src)
    if strategy == "exp":
        unread = _lin_only(env) if "VLLM_BUCKETING_STRATEGY" not in env and legacy_note is None else []
        if unread:
            notes.append(f"{src}: {strategy_hint(unread)}")
        try:
            return exp_graphs(env, server, settings, src, notes)
        except InputError as exc:  # the setting exp needs is not what the user meant: they wrote a lin config
            if not unread:
                raise
            raise InputError(exc.file, exc.line, exc.field, f"{exc.message}; {strategy_hint(unread)}") from None
    return lin_graphs(env, server, settings, src, notes)


def _lin_only(env: dict[str, EnvValue]) -> list[str]:
    """The ladder variables only lin reads (exp, vllm-gaudi's default, overwrites them), in file order."""
    return [name for name in env if name in _READ and name not in _EXP_KEEPS]


def strategy_hint(unread: list[str]) -> str:
    """What a config with lin ladder values and no strategy runs, and the line that makes them count."""
    more = f" and {len(unread) - 1} more" if len(unread) > 1 else ""
    return (f"no VLLM_BUCKETING_STRATEGY is set, so vllm-gaudi runs its default exp, which overwrites "
            f"{unread[0]}{more}; for the lin ladder these values describe add VLLM_BUCKETING_STRATEGY=lin "
            "(or the deprecated VLLM_EXPONENTIAL_BUCKETING=false)")


def gaudi_strategy(env: dict[str, EnvValue], src: str) -> tuple[str, str | None]:
    """The strategy vllm-gaudi would run with these variables, and the warning the deprecated switch earns."""
    legacy = env.get("VLLM_EXPONENTIAL_BUCKETING")
    if legacy is not None:
        flag = legacy.value.strip().lower()
        if flag not in _TRUE + _FALSE:
            raise InputError(src, legacy.line, "VLLM_EXPONENTIAL_BUCKETING", f"expected true or false, "
                             f"got {legacy.value!r}")
        chosen = "exp" if flag in _TRUE else "lin"
        return chosen, (f"{src}:{legacy.line}: VLLM_EXPONENTIAL_BUCKETING is deprecated (use "
                        f"VLLM_BUCKETING_STRATEGY={chosen}); it still overrides the strategy")
    chosen = env.get("VLLM_BUCKETING_STRATEGY")
    if chosen is None:
        return "exp", None
    if chosen.value not in GAUDI_STRATEGIES:
        raise InputError(src, chosen.line, "VLLM_BUCKETING_STRATEGY", f"expected one of "
                         f"{', '.join(GAUDI_STRATEGIES)}, got {chosen.value!r}")
    return chosen.value, None


def lin_param(env: dict[str, EnvValue], src: str, phase: str, dim: str, p: str) -> tuple[int | None, str]:
    """One lin parameter and the variable that set it; QUERY falls back to its legacy SEQ name."""
    new = f"VLLM_{phase}_{dim}_BUCKET_{p}"
    value = env_int(env, src, new, lo=0)
    if dim != "QUERY":
        return value, new
    old = f"VLLM_{phase}_SEQ_BUCKET_{p}"
    legacy = env_int(env, src, old, lo=0)
    if value is not None and legacy is not None and value != legacy:
        raise InputError(src, env[old].line, old, f"{legacy} disagrees with {new}={value}")
    return (value, new) if value is not None or legacy is None else (legacy, old)


def lin_graphs(env: dict[str, EnvValue], server: GaudiServer, settings: Settings, src: str,
               notes: list[str]) -> Compiled:
    """``lin``: the product of the ranges (every parameter as set or by default), after the filters."""
    cfg, names = {}, {}
    for key, phase, dim in (("bs", "PROMPT", "BS"), ("query", "PROMPT", "QUERY"), ("ctx", "PROMPT", "CTX"),
                            ("decode_bs", "DECODE", "BS"), ("block", "DECODE", "BLOCK")):
        got = [lin_param(env, src, phase, dim, p) for p in _PARAMS]
        cfg[key] = tuple(v for v, _ in got)
        names[key] = [n for _, n in got]
    for key, (lo, _, hi) in cfg.items():
        if lo is not None and hi is not None and lo > hi:
            raise InputError(src, env[names[key][2]].line, names[key][2], f"{hi} is below MIN {lo}")
    q_max = cfg["query"][2]
    q_min, q_step = (v if v is not None else server.block_size for v in cfg["query"][:2])
    if q_max is not None and lin_range_count(q_min, q_step, q_max) > MAX_BUCKETS:
        step = names["query"][1]
        raise InputError(src, env[step].line if step in env else None, step, f"the ladder has "
                         f"{lin_range_count(q_min, q_step, q_max)} values; at most {MAX_BUCKETS}")
    if q_max is None and server.max_num_batched_tokens is None:
        raise InputError(src, None, "VLLM_PROMPT_QUERY_BUCKET_MAX", "missing (or its legacy name "
                         "VLLM_PROMPT_SEQ_BUCKET_MAX); lin's default is the token budget: "
                         + missing("max_num_batched_tokens", "the default"))
    line = env[names["query"][2]].line if q_max is not None else settings.values["max_num_batched_tokens"].line
    mml_known = server.max_model_len is not None or cfg["ctx"][2] is not None
    if not mml_known:
        query = lin_ranges([lin_prompt_cfgs({**cfg, "ctx": (0, 1, 0)}, server, src)[1]], src, "lin query range")[0]
        notes.append(f"{src}: graphs not counted: " + missing("max_model_len", "lin's default context range"))
        return Compiled(tuple(Given(q, src, line, names["query"][2]) for q in query), None,
                        settings=settings.pairs(SERVER_SETTINGS), notes=tuple(notes))
    bs, query, ctx = lin_ranges(lin_prompt_cfgs(cfg, server, src), src, "lin prompt ranges")
    prompt, dropped, p_notes = prompt_rules(prompt_product(bs, query, ctx, server), server)
    lengths = tuple(Given(q, src, line, names["query"][2]) for q in sorted({g.dims[1] for g in prompt}))
    needs = {"max_num_seqs": cfg["decode_bs"][2] is None or cfg["block"][2] is None,
             "max_model_len": cfg["block"][2] is None}
    decode_needs = [n for n, needed in needs.items() if needed and settings.get(n) is None]
    if decode_needs:
        notes.append(f"{src}: decode graphs not counted: " + missing(decode_needs[0], "lin's default decode range"))
        return Compiled(lengths, None, tuple(dropped), settings.pairs(SERVER_SETTINGS),
                        tuple(notes + [f"{src}: {n}" for n in p_notes]))
    d_bs, blocks = lin_ranges(lin_decode_cfgs(cfg, server, src), src, "lin decode ranges")
    decode, d_dropped, d_notes = decode_rules([(b, 1, k) for b, k in itertools.product(d_bs, blocks)], server)
    return Compiled(lengths, graph_set(prompt + decode), tuple(dropped + d_dropped), settings.pairs(SERVER_SETTINGS),
                    tuple(notes + [f"{src}: {n}" for n in p_notes + d_notes]))


def exp_graphs(env: dict[str, EnvValue], server: GaudiServer, settings: Settings, src: str,
               notes: list[str]) -> Compiled:
    """``exp``: prompt ranges up to the token budget (ceil(log2) points), decode up to max seqs x blocks."""
    query_min = 1 if env_int(env, src, "VLLM_PROMPT_QUERY_BUCKET_MIN", lo=0) == 1 else server.block_size
    bs, query, ctx = exp_prompt_ranges(server, query_min, src)
    check_count(len(bs) * len(query) * len(ctx), src, "exp prompt ranges")
    prompt, dropped, p_notes = prompt_rules(prompt_product(bs, query, ctx, server), server)
    line = settings.values["max_num_batched_tokens"].line
    lengths = tuple(Given(q, src, line, "MAX_NUM_BATCHED_TOKENS") for q in sorted({g.dims[1] for g in prompt}))
    if server.max_num_seqs is None:
        notes.append(f"{src}: decode graphs not counted: " + missing("max_num_seqs", "the exp decode range"))
        return Compiled(lengths, None, tuple(dropped), settings.pairs(SERVER_SETTINGS), tuple(notes))
    d_bs, blocks, clamp = exp_decode_ranges(server, settings.get("num_gpu_blocks_override"), src)
    decode, d_dropped, d_notes = decode_rules([(b, 1, k) for b, k in itertools.product(d_bs, blocks)], server)
    notes += [f"{src}: {clamp}"] if clamp else []
    return Compiled(lengths, graph_set(prompt + decode), tuple(dropped + d_dropped), settings.pairs(SERVER_SETTINGS),
                    tuple(notes + [f"{src}: {n}" for n in p_notes + d_notes]))

