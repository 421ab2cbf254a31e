"""A planned serving graph set in every format of the serving registry, or the reason a format cannot hold it.

A serving plan is a graph set and the server settings it needs, not plans of batches,
so the plan writers (``model.serving.formats.render``, which derive graphs from batches)
do not apply.  Each file here is written for the set and then read back through the
registry's own reader (``model.serving.formats.compile_config``): a file that would make
the stack compile anything else -- a graph dropped by a filter, a prefix-cache graph
added, a ladder that does not close -- is refused, never written.

``graphs.json``
    the replay's json (``model.serving.replay_graphs``), for ``model.replay --shapes-format json``.
``gaudi-file``
    ``VLLM_BUCKETING_FROM_FILE`` lines, one per prompt length and one per decode batch, with
    ``# setting:`` lines for what the filters read.
``gaudi-env``
    the ``lin`` strategy, only when each kind of graph is the full product of two lin
    ladders (the strategy crosses every batch with every length).
``nxdi``
    ``override_neuron_config`` (context buckets at ctx_batch_size, token-generation
    buckets at max_num_seqs) and the engine arguments vLLM must agree with.
``list``, ``vllm-neuron``, ``vllm-tpu``, ``json``
    refused: they compile lengths or token budgets (or the planner's batches), not the
    (batch, length) graphs a serving set is.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from model.base.errors import InputError
from model.domain.server import GraphSet, ServerSettings
from model.serving.formats import READERS, compile_config
from model.serving.gaudi import lin_exact, lin_ladder
from model.serving.replay_graphs import graph_set_json
from model.serving.settings import Settings

FILE_NAMES = {"gaudi-file": "gaudi-buckets.txt", "gaudi-env": "gaudi.env", "nxdi": "nxdi.json"}
GRAPHS_JSON = "graphs.json"
STACK_NAMES = {"gaudi": "vLLM on Gaudi", "nxdi": "NxD Inference"}
NOT_GRAPHS = {
    "list": "a list compiles lengths, not (batch, length) graphs",
    "vllm-neuron": "the vllm-neuron plugin compiles token budgets and sequence counts, not (batch, length) graphs",
    "vllm-tpu": "vLLM on TPU compiles token budgets of a step, not (batch, length) graphs",
    "json": "the planner's json holds shapes and batch sizes of planned batches; the graph set is in graphs.json "
            "(the replay's json)",
}


@dataclass(frozen=True)
class Written:
    """One format's outcome: the file name and text, or the reason it was refused."""

    fmt: str
    name: str | None
    text: str | None
    refused: str | None = None


def max_model_len(graphs: GraphSet, longest: int) -> int:
    """The --max-model-len an export states: the longest request, and at least every prompt graph's length."""
    return max(longest, *(s for _, s in graphs.prompt), *graphs.context, 1)


def _gaudi_values(graphs: GraphSet, settings: ServerSettings, longest: int) -> dict[str, int]:
    return {"VLLM_PROMPT_BS_BUCKET_MAX": max(b for b, _ in graphs.prompt),
            "MAX_NUM_BATCHED_TOKENS": settings.max_num_batched_tokens, "MAX_NUM_SEQS": settings.max_num_seqs,
            "MAX_MODEL_LEN": max_model_len(graphs, longest), "BLOCK_SIZE": settings.block_size}


def _grouped(pairs, key: int) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for p in pairs:
        out.setdefault(p[key], []).append(p[1 - key])
    return {k: sorted(v) for k, v in sorted(out.items())}


def _literal(values: list[int]) -> str:
    return str(values[0]) if len(values) == 1 else "[" + ", ".join(map(str, values)) + "]"


def gaudi_file(graphs: GraphSet, settings: ServerSettings, longest: int, what: str) -> str:
    """The bucket file: exactly the set, and the settings its filters need as ``# setting:`` lines."""
    values = _gaudi_values(graphs, settings, longest)
    lines = [f"# shapeplan serving plan: {what}",
             "# vLLM on Gaudi bucket file (VLLM_BUCKETING_FROM_FILE): start the server with these settings",
             "# setting: VLLM_BUCKETING_FROM_FILE=<this file>",
             *(f"# setting: {k}={v}" for k, v in values.items()),
             f"# i.e. vllm serve ... --max-num-batched-tokens {values['MAX_NUM_BATCHED_TOKENS']} --max-num-seqs "
             f"{values['MAX_NUM_SEQS']} --max-model-len {values['MAX_MODEL_LEN']} --block-size {values['BLOCK_SIZE']}",
             "# prompt: (batch sizes, query length, context blocks 0)"]
    lines += [f"({_literal(bs)}, {s}, 0)" for s, bs in _grouped(graphs.prompt, 1).items()]
    lines.append(f"# decode: (batch, 1, total KV blocks at block size {settings.block_size})")
    lines += [f"({b}, 1, {_literal(nbs)})" for b, nbs in _grouped(graphs.decode, 0).items()]
    return "\n".join(lines) + "\n"


def _product_ladders(pairs: tuple[tuple[int, int], ...], kind: str) -> tuple[tuple[int, int, int], ...]:
    """The two lin ladders whose product is exactly ``pairs`` (an InputError saying why not)."""
    first, second = sorted({p[0] for p in pairs}), sorted({p[1] for p in pairs})
    if len(first) * len(second) != len(pairs):
        raise InputError("--out", None, "gaudi-env", f"the lin strategy crosses every batch with every length, and "
                         f"the {len(pairs)} {kind} graphs are not such a product ({len(first)} batches x "
                         f"{len(second)} lengths would be {len(first) * len(second)} graphs); use the gaudi-file")
    out = []
    for values, name in ((first, "batches"), (second, "lengths")):
        ladder = lin_exact(values)
        if ladder is None or lin_ladder(*ladder) != values:
            raise InputError("--out", None, "gaudi-env", f"the {kind} {name} {', '.join(map(str, values))} are no lin "
                             "ladder (MIN, doubling up to STEP, then +STEP up to MAX); use the gaudi-file")
        out.append(ladder)
    return tuple(out)


def gaudi_env(graphs: GraphSet, settings: ServerSettings, longest: int, what: str) -> str:
    """The lin strategy's variables, when both kinds of graph are products of lin ladders."""
    (pb, pq), (db, dk) = _product_ladders(graphs.prompt, "prompt"), _product_ladders(graphs.decode, "decode")
    values = _gaudi_values(graphs, settings, longest)

    def triple(prefix: str, cfg: tuple[int, int, int]) -> list[str]:
        return [f"{prefix}_{p}={v}" for p, v in zip(("MIN", "STEP", "MAX"), cfg, strict=True)]

    lines = [f"# shapeplan serving plan: {what}", "# vLLM on Gaudi bucketing variables (the lin strategy)",
             "VLLM_BUCKETING_STRATEGY=lin", *triple("VLLM_PROMPT_BS_BUCKET", pb),
             *triple("VLLM_PROMPT_QUERY_BUCKET", pq), *triple("VLLM_PROMPT_CTX_BUCKET", (0, 1, 0)),
             *triple("VLLM_DECODE_BS_BUCKET", db), *triple("VLLM_DECODE_BLOCK_BUCKET", dk),
             "# the server's flags (not read by vLLM from here; model.export --check reads them)",
             *(f"{k}={v}" for k, v in values.items() if k != "VLLM_PROMPT_BS_BUCKET_MAX")]
    return "\n".join(lines) + "\n"


def nxdi_config(graphs: GraphSet, settings: ServerSettings, what: str) -> str:
    """NeuronConfig overrides: the context buckets at ctx_batch_size, token generation at max_num_seqs."""
    m, seq_len = settings.max_num_seqs, graphs.token_generation[-1]
    conf = {"enable_bucketing": True, "context_encoding_buckets": list(graphs.context),
            "token_generation_buckets": list(graphs.token_generation), "max_context_length": graphs.context[-1],
            "seq_len": seq_len, "batch_size": m, "ctx_batch_size": settings.ctx_batch_size, "tkg_batch_size": m}
    return json.dumps({"comment": f"shapeplan serving plan: {what} Pass override_neuron_config through vLLM's "
                       f"--additional-config with --max-num-seqs {m} --max-model-len {seq_len}.",
                       "override_neuron_config": conf,
                       "engine_args": {"max_num_seqs": m, "max_model_len": seq_len}}, indent=1) + "\n"


def _read_back(fmt: str, text: str, graphs: GraphSet, settings: ServerSettings) -> str | None:
    """Why the stack would compile something else from ``text`` (None: exactly the set)."""
    try:
        back = compile_config(Path(f"<{fmt} export>"), fmt, Settings(), text=text)
    except InputError as exc:
        return f"it would not read back ({exc.message})"
    if back.graphs is None or back.dropped:
        return "the stack would drop some of its graphs"
    if graphs.stack == "gaudi":
        got = ({(g.dims[0], g.dims[1]) for g in back.graphs if g.kind == "prompt" and g.dims[2] == 0},
               {(g.dims[0], g.dims[2]) for g in back.graphs if g.kind == "decode"})
        want = (set(graphs.prompt), set(graphs.decode))
        extra = sum(1 for g in back.graphs if g.kind == "prompt" and g.dims[2] != 0)
    else:
        got = ({g.dims[1] for g in back.graphs if g.kind == "context" and g.dims[0] == settings.ctx_batch_size},
               {g.dims[1] for g in back.graphs if g.kind == "token-gen" and g.dims[0] == settings.max_num_seqs})
        want = (set(graphs.context), set(graphs.token_generation))
        extra = len(back.graphs) - len(graphs.context) - len(graphs.token_generation)
    if got != want or extra:
        return "the stack would compile other graphs than the set"
    return None


def write_all(graphs: GraphSet, settings: ServerSettings, longest: int, what: str) -> list[Written]:
    """Every registry format's file for the set, or why it is refused (each checked by reading it back)."""
    out = [Written("graphs", GRAPHS_JSON, graph_set_json(graphs))]
    for fmt in READERS:
        if fmt in NOT_GRAPHS:
            out.append(Written(fmt, None, None, NOT_GRAPHS[fmt]))
            continue
        stack = "nxdi" if fmt == "nxdi" else "gaudi"
        if stack != graphs.stack:
            out.append(Written(fmt, None, None, f"{fmt} configures {STACK_NAMES[stack]}, and the set is planned for "
                               f"{STACK_NAMES[graphs.stack]} (its lookup rule and graphs differ)"))
            continue
        try:
            text = (nxdi_config(graphs, settings, what) if fmt == "nxdi" else
                    gaudi_file(graphs, settings, longest, what) if fmt == "gaudi-file" else
                    gaudi_env(graphs, settings, longest, what))
        except InputError as exc:
            out.append(Written(fmt, None, None, exc.message))
            continue
        problem = _read_back(fmt, text, graphs, settings)
        out.append(Written(fmt, FILE_NAMES[fmt], text, None) if problem is None else Written(fmt, None, None, problem))
    return out
