"""The graph set a replay runs on (``shared/serving_model.md``), read from a serving config by its stack's rules.

The stack readers (``model.serving.formats.compile_config``) say which graphs a config
makes the server compile, after the stack's own filters (vllm-gaudi drops a prompt graph
over the token budget or over ``VLLM_PROMPT_BS_BUCKET_MAX``, caps decode graphs at the max
model length; NxDI's settings must agree with vLLM's).  The replay's server settings go
in as those readers' settings (``max_num_seqs``, ``max_num_batched_tokens``, gaudi's
``block_size``, and ``max_prefill_seqs`` as ``VLLM_PROMPT_BS_BUCKET_MAX``), with any
``--server-settings`` beside them; a config that states one differently is an error
naming its line.  The compiled graphs then become the replay's set:

``gaudi-file``, ``gaudi-env`` (any strategy vllm-gaudi runs: the bucket file, ``lin``, ``exp``)
    prompt graphs ``(B, S, 0)`` -> (B, S); decode graphs ``(B, 1, NB)`` -> (B, NB).  A prompt
    graph with context blocks is a prefix-cache graph: compiled at warm-up, never run here.
``nxdi``
    context graphs ``(ctx_batch_size, S)`` -> context bucket S (their batch must be the
    server's ctx_batch_size); token-generation graphs ``(max_num_seqs, S)`` -> bucket S.
    Token-generation graphs at other batches (newer SDKs' batch buckets) are compiled but
    never run: with continuous batching the decode graph runs at the full batch.
``json`` (the replay's own schema, for hand-written or generated sets)
    gaudi: ``{"prompt": [[B, S], ...], "decode": [[B, NB], ...]}``; nxdi: ``{"context": [S, ...],
    "token_generation": [S, ...]}``; an optional ``"stack"`` must name the server's stack.
    Taken as given: no stack filter applies (the contract's graph set).

``list``, ``vllm-neuron`` and ``vllm-tpu`` compile lengths or token budgets, not graphs of
this model, so they are refused with a pointer to the formats that are.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from model.base.errors import InputError, unknown_name
from model.domain.server import Graph, GraphSet, ServerSettings
from model.serving.formats import compile_config
from model.serving.parse import MAX_BUCKETS, check_range, read_text, shown
from model.serving.parse_json import JsonLineIndex, json_int_list, key_line, load_json_object
from model.serving.settings import Setting, Settings

GRAPH_FORMATS = ("json", "gaudi-file", "gaudi-env", "nxdi")
FORMAT_STACK = {"gaudi-file": "gaudi", "gaudi-env": "gaudi", "nxdi": "nxdi"}
SHAPE_ONLY = ("list", "vllm-neuron", "vllm-tpu")
JSON_KEYS = {"gaudi": ("prompt", "decode"), "nxdi": ("context", "token_generation")}
PLANNER_JSON_KEYS = ("shapes", "batch_sizes", "buckets", "graphs")  # model.serving.lists' json, not graph lists


@dataclass(frozen=True)
class GraphImport:
    """The replay's graph set and the lines to show beside it (graphs the stack drops, rules it could not apply)."""

    graphs: GraphSet
    notes: tuple[str, ...] = ()


def stack_settings(server: ServerSettings, source: str, extra: Settings | None = None) -> Settings:
    """The server settings as the stack readers name them (``source`` says where they came from)."""
    values = {"max_num_seqs": server.max_num_seqs, "max_num_batched_tokens": server.max_num_batched_tokens}
    if server.stack == "gaudi":
        values["block_size"] = server.block_size
        if server.max_prefill_seqs is not None:
            values["prompt_bs_bucket_max"] = server.max_prefill_seqs
    mine = Settings({name: Setting(v, source, None, name) for name, v in values.items()})
    return mine.merged(extra) if extra is not None else mine


def read_graph_set(path: str | Path, fmt: str, server: ServerSettings, source: str = "[server]",
                   extra: Settings | None = None) -> GraphImport:
    """The graphs the configuration at ``path`` makes a server with these settings compile, as the replay's set."""
    stack = server.stack
    if fmt in SHAPE_ONLY:
        formats = "gaudi-file or gaudi-env" if stack == "gaudi" else "nxdi"
        raise InputError("--shapes-format", None, None, f"{fmt} compiles lengths (or token budgets), not the graphs "
                         f"a replay runs; give the graphs as {formats}, or as --shapes-format json "
                         f"({_json_hint(stack)})")
    if fmt not in GRAPH_FORMATS:
        raise InputError("--shapes-format", None, None, unknown_name("format", fmt, GRAPH_FORMATS))
    if fmt in FORMAT_STACK and FORMAT_STACK[fmt] != stack:
        raise InputError("--shapes-format", None, None, f"{fmt} holds {FORMAT_STACK[fmt]} graphs, and the stack is "
                         f"{stack} (set it with [server] stack or --stack)")
    path = Path(path)
    if fmt == "json":
        return GraphImport(json_graphs(path, read_text(path), stack))
    compiled = compile_config(path, fmt, stack_settings(server, source, extra))
    notes = [*compiled.notes, *(f"{path}: the stack drops {d.graph}: {d.reason}" for d in compiled.dropped)]
    if compiled.graphs is None:
        raise InputError(str(path), None, None, "the graphs cannot be counted: " + "; ".join(compiled.notes))
    graphs = _gaudi_set(compiled.graphs, path) if stack == "gaudi" else _nxdi_set(compiled.graphs, path, server)
    return GraphImport(graphs, tuple(notes))


def _gaudi_set(graphs, path: Path) -> GraphSet:
    prompt, decode, cached = set(), set(), 0
    for g in graphs:
        if g.kind == "prompt" and g.dims[2] == 0:
            prompt.add((g.dims[0], g.dims[1]))
        elif g.kind == "prompt":
            cached += 1
        elif g.kind == "decode":
            decode.add((g.dims[0], g.dims[2]))
        else:
            raise InputError(str(path), None, None, f"a {g} graph is no gaudi graph")
    return GraphSet("gaudi", prompt=tuple(sorted(prompt)), decode=tuple(sorted(decode)), unused=cached,
                    source=str(path))


def _nxdi_set(graphs, path: Path, server: ServerSettings) -> GraphSet:
    context, tkg, other = set(), set(), 0
    for g in graphs:
        if g.kind == "context":
            if g.dims[0] != server.ctx_batch_size:
                raise InputError(str(path), None, "ctx_batch_size", f"the context graphs run at batch {g.dims[0]}, "
                                 f"and the server's ctx_batch_size is {server.ctx_batch_size}: set one to the other")
            context.add(g.dims[1])
        elif g.kind == "token-gen" and g.dims[0] == server.max_num_seqs:
            tkg.add(g.dims[1])
        elif g.kind == "token-gen":
            other += 1
        else:
            raise InputError(str(path), None, None, f"a {g} graph is no nxdi graph")
    if not tkg:
        raise InputError(str(path), None, "token_generation_buckets", f"no token-generation graph at batch "
                         f"max_num_seqs {server.max_num_seqs}: with continuous batching every decode step runs there")
    return GraphSet("nxdi", context=tuple(sorted(context)), token_generation=tuple(sorted(tkg)), unused=other,
                    source=str(path))


def _json_hint(stack: str) -> str:
    first, second = JSON_KEYS[stack]
    return f'{{"{first}": [[B, S], ...], "{second}": [[B, NB], ...]}}' if stack == "gaudi" else \
        f'{{"{first}": [S, ...], "{second}": [S, ...]}}'


def graph_set_json(graphs: GraphSet) -> str:
    """The graph set as ``json_graphs`` reads it back (``--shapes-format json``): replayed exactly as given."""
    doc: dict = {"stack": graphs.stack}
    if graphs.stack == "gaudi":
        doc.update(prompt=[list(g) for g in graphs.prompt], decode=[list(g) for g in graphs.decode])
    else:
        doc.update(context=list(graphs.context), token_generation=list(graphs.token_generation))
    return json.dumps(doc, indent=1) + "\n"


def json_graphs(path: Path, text: str, stack: str) -> GraphSet:
    """The replay's ``json`` graph lists (schema in the module docstring), taken as given."""
    src = str(path)
    top = load_json_object(text, src)
    wanted = JSON_KEYS[stack]
    other = JSON_KEYS["nxdi" if stack == "gaudi" else "gaudi"]
    for key in top:
        if key in other:
            raise InputError(src, key_line(text, key), key, f"is a list of the other stack's graphs, and the stack is "
                             f"{stack}: expected {_json_hint(stack)}")
        if key in PLANNER_JSON_KEYS:
            raise InputError(src, key_line(text, key), key, "this is the planner's json (shapes, batch sizes); the "
                             f"replay's json lists graphs: {_json_hint(stack)}")
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


def oversized_prompt_graphs(graphs: GraphSet, max_num_batched_tokens: int) -> list[Graph]:
    """gaudi prompt graphs with B*S above the token budget: vllm-gaudi would drop them (a json set keeps them)."""
    return [g for g in graphs.prompt if g[0] * g[1] > max_num_batched_tokens]
