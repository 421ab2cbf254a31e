"""Compiled graph sets for serving mode (``shared/serving_model.md``), read from the configs that hold them.

The planner's readers (``model.serving.formats.READERS``) give sequence lengths; a
replay needs the graphs themselves: gaudi's prompt graphs (B, S) and decode graphs
(B, NB), nxdi's context-encoding and token-generation buckets.  The formats that state
them, and what each gives:

``json`` (the replay's own, for hand-written or generated sets)
    gaudi: ``{"prompt": [[B, S], ...], "decode": [[B, NB], ...]}``;
    nxdi: ``{"context": [S, ...], "token_generation": [S, ...]}``.
    An optional ``"stack"`` must name the same stack; no other key is allowed.
``gaudi-file``
    Every expanded tuple: middle element 1 -> decode (B, NB); else a prompt (B, S) when its
    ctx_blocks is 0.  A prompt tuple with context blocks is a prefix-cache graph: compiled
    at warm-up (counted in ``unused``) but never run, since the replay has no prefix cache.
``gaudi-env``
    ``VLLM_BUCKETING_FROM_FILE`` (the file above), or the ``lin`` strategy: prompt batch
    ladder x query ladder, decode batch ladder x block ladder, every MIN/STEP/MAX given
    (their defaults depend on server settings the file does not hold); the CTX ladders
    are for prefix caching, off here.  ``exp`` and ``pad`` derive their ranges from
    settings this reader does not model: refused, naming the strategy.
``nxdi``
    context_encoding_buckets (NxDI's defaults without a list) and token_generation_buckets
    (without a list: powers of two from 128 up to seq_len with bucketing on, seq_len alone
    with it off).

``list``, ``vllm-neuron`` and ``vllm-tpu`` state lengths or token budgets but no graphs
of this model, so they are refused with a pointer to ``json``.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path

from model.base.errors import InputError
from model.domain.server import Graph, GraphSet
from model.serving.gaudi import bucket_file_of, gaudi_env, gaudi_file_buckets, gaudi_lin_query, gaudi_strategy
from model.serving.ladders import lin_count, lin_ladder
from model.serving.neuron import nxdi_config, nxdi_default
from model.serving.parse import MAX_BUCKETS, EnvValue, check_range, env_int, read_text, shown
from model.serving.parse_json import JsonLineIndex, json_int_list, key_line, load_json_object

GRAPH_FORMATS = ("json", "gaudi-file", "gaudi-env", "nxdi")
FORMAT_STACK = {"gaudi-file": "gaudi", "gaudi-env": "gaudi", "nxdi": "nxdi"}
SHAPE_ONLY = ("list", "vllm-neuron", "vllm-tpu")
JSON_KEYS = {"gaudi": ("prompt", "decode"), "nxdi": ("context", "token_generation")}


def read_graphs(path: str | Path, fmt: str, stack: str) -> GraphSet:
    """The graphs the configuration at ``path`` makes a ``stack`` server compile before serving."""
    if fmt in SHAPE_ONLY:
        raise InputError("--shapes-format", None, None, f"{fmt} lists lengths (or token budgets), not the graphs a "
                         f"replay runs; give the graphs as --shapes-format json ({_json_hint(stack)}) or as "
                         f"{'gaudi-file or gaudi-env' if stack == 'gaudi' else 'nxdi'}")
    if fmt not in GRAPH_FORMATS:
        raise InputError("--shapes-format", None, None, f"unknown format {fmt!r} ({', '.join(GRAPH_FORMATS)})")
    if fmt in FORMAT_STACK and FORMAT_STACK[fmt] != stack:
        raise InputError("--shapes-format", None, None, f"{fmt} holds {FORMAT_STACK[fmt]} graphs, and the stack is "
                         f"{stack} (set it with [server] stack or --stack)")
    path = Path(path)
    text = read_text(path)
    if fmt == "json":
        return json_graphs(path, text, stack)
    if fmt == "gaudi-file":
        return gaudi_file_graphs(path, text)
    if fmt == "gaudi-env":
        return gaudi_env_graphs(path, text)
    return nxdi_graphs(path, text)


def _json_hint(stack: str) -> str:
    first, second = JSON_KEYS[stack]
    return f'{{"{first}": [[B, S], ...], "{second}": [[B, NB], ...]}}' if stack == "gaudi" else \
        f'{{"{first}": [S, ...], "{second}": [S, ...]}}'


def json_graphs(path: Path, text: str, stack: str) -> GraphSet:
    """The replay's ``json`` graph lists (schema in the module docstring)."""
    src = str(path)
    top = load_json_object(text, src)
    wanted = JSON_KEYS[stack]
    other = JSON_KEYS["nxdi" if stack == "gaudi" else "gaudi"]
    for key in top:
        if key in other:
            raise InputError(src, key_line(text, key), key, f"is a list of the other stack's graphs, and the stack is "
                             f"{stack}: expected {_json_hint(stack)}")
        if key not in (*wanted, "stack"):
            raise InputError(src, key_line(text, key), key, f"unknown key (expected {_json_hint(stack)})")
    if "stack" in top and top["stack"] != stack:
        raise InputError(src, key_line(text, "stack"), "stack", f"{shown(top['stack'])} is not the server's stack "
                         f"{stack!r}")
    index = JsonLineIndex(text, wanted)
    if stack == "nxdi":
        context, tkg = (sorted({g.value for g in json_int_list(index, src, top, key, "")}) for key in wanted)
        return GraphSet("nxdi", context=tuple(context), token_generation=tuple(tkg), source=src)
    for key in wanted:
        if key not in top:
            raise InputError(src, None, key, f"missing (expected {_json_hint(stack)})")
    prompt, decode = (_json_pairs(index, src, top[key], key) for key in wanted)
    if not prompt and not decode:
        raise InputError(src, index.key_line("prompt"), "prompt", "no graphs listed")
    return GraphSet("gaudi", prompt=prompt, decode=decode, source=src)


def _json_pairs(index: JsonLineIndex, src: str, value: object, key: str) -> tuple[Graph, ...]:
    """A JSON list of [B, X] pairs, each a pair of integers in range, as a sorted unique tuple."""
    if not isinstance(value, list):
        raise InputError(src, index.key_line(key), key, f"expected a list of [B, X] pairs, got {shown(value)}")
    if len(value) > MAX_BUCKETS:
        raise InputError(src, index.key_line(key), key, f"{len(value)} entries; at most {MAX_BUCKETS}")
    out = set()
    for i, (pair, line) in enumerate(zip(value, index.element_lines(key, len(value)), strict=True)):
        if not isinstance(pair, list) or len(pair) != 2:
            raise InputError(src, line, f"{key}[{i}]", f"expected a pair [B, X], got {shown(pair)}")
        out.add((check_range(pair[0], src, line, f"{key}[{i}][0]"), check_range(pair[1], src, line, f"{key}[{i}][1]")))
    return tuple(sorted(out))


def gaudi_file_graphs(path: Path, text: str) -> GraphSet:
    """Every tuple of a vllm-gaudi bucket file, expanded: decode (middle element 1) or prompt graphs."""
    src = str(path)
    prompt: set[Graph] = set()
    decode: set[Graph] = set()
    cached: set[tuple[int, int, int]] = set()
    for number, (batches, queries, contexts) in gaudi_file_buckets(path, text):
        for b, q, c in itertools.product(batches, queries, contexts):
            if q == 1:
                decode.add((b, check_range(c, src, number, "ctx_blocks")))  # a decode bucket's blocks
            elif c == 0:
                prompt.add((b, q))
            else:
                cached.add((b, q, c))
    return GraphSet("gaudi", prompt=tuple(sorted(prompt)), decode=tuple(sorted(decode)), unused=len(cached),
                    source=src)


def gaudi_env_graphs(path: Path, text: str) -> GraphSet:
    """vllm-gaudi's bucketing variables: the bucket file they name, or the ``lin`` ladders crossed."""
    src = str(path)
    env = gaudi_env(text, src)
    target = bucket_file_of(env, path)
    if target is not None:
        return gaudi_file_graphs(target, read_text(target))
    strategy = gaudi_strategy(env, src)
    if strategy != "lin":
        line = env["VLLM_BUCKETING_STRATEGY"].line if "VLLM_BUCKETING_STRATEGY" in env else None
        raise InputError(src, line, "VLLM_BUCKETING_STRATEGY", f"the {strategy} strategy derives its batch and block "
                         "ranges from server settings the replay does not model; use lin (every MIN/STEP/MAX given) "
                         "or VLLM_BUCKETING_FROM_FILE")
    queries = [g.value for g in gaudi_lin_query(env, src)]
    prompt_batches = _lin_values(env, src, "VLLM_PROMPT_BS_BUCKET")
    decode_batches = _lin_values(env, src, "VLLM_DECODE_BS_BUCKET")
    blocks = _lin_values(env, src, "VLLM_DECODE_BLOCK_BUCKET")
    for first, second, name in ((prompt_batches, queries, "VLLM_PROMPT_BS_BUCKET_MAX"),
                                (decode_batches, blocks, "VLLM_DECODE_BS_BUCKET_MAX")):
        if len(first) * len(second) > MAX_BUCKETS:
            raise InputError(src, env[name].line, name, f"lin crosses the ladders into {len(first) * len(second)} "
                             f"graphs; at most {MAX_BUCKETS}")
    prompt = tuple(sorted(set(itertools.product(prompt_batches, (q for q in queries if q != 1)))))
    decode = tuple(sorted(set(itertools.product(decode_batches, blocks))))
    return GraphSet("gaudi", prompt=prompt, decode=decode, source=src)


def _lin_values(env: dict[str, EnvValue], src: str, prefix: str) -> list[int]:
    """One ``lin`` ladder from its MIN/STEP/MAX variables, each required (the defaults need server settings)."""
    names = [f"{prefix}_{p}" for p in ("MIN", "STEP", "MAX")]
    values = []
    for name in names:
        value = env_int(env, src, name)
        if value is None:
            raise InputError(src, None, name, "missing; lin's default depends on server settings, so the replay needs "
                             "every MIN/STEP/MAX")
        values.append(value)
    bmin, bstep, bmax = values
    if bmin > bmax:
        raise InputError(src, env[names[2]].line, names[2], f"{bmax} is below MIN {bmin}")
    if lin_count(bmin, bstep, bmax) > MAX_BUCKETS:
        raise InputError(src, env[names[1]].line, names[1], f"the ladder has more than {MAX_BUCKETS} values")
    return lin_ladder(bmin, bstep, bmax)


def nxdi_graphs(path: Path, text: str) -> GraphSet:
    """NxD Inference's context-encoding and token-generation buckets (NxDI's defaults where none are listed)."""
    src = str(path)
    conf = nxdi_config(path, text)
    if conf.token_generation is not None:
        tkg = [g.value for g in conf.token_generation]
    elif conf.seq_len is None:
        raise InputError(src, None, f"{conf.where}token_generation_buckets", "missing, and no seq_len to derive "
                         "the buckets from")
    else:
        tkg = nxdi_default(conf.seq_len) if conf.enabled else [conf.seq_len]
    return GraphSet("nxdi", context=tuple(sorted({g.value for g in conf.context})),
                    token_generation=tuple(sorted(set(tkg))), source=src)


def oversized_prompt_graphs(graphs: GraphSet, max_num_batched_tokens: int) -> list[Graph]:
    """gaudi prompt graphs with B*S above the token budget: vllm-gaudi drops them at start-up (say so)."""
    return [g for g in graphs.prompt if math.prod(g) > max_num_batched_tokens]
