"""AWS Neuron: NxDI's NeuronConfig (``nxdi``) and the vllm-neuron plugin's ``--additional-config`` (``vllm-neuron``).

NxDI (its config and autobucketing code): context-encoding graphs are
``(ctx_batch_size, bucket)`` for each ``context_encoding_buckets`` entry (sorted on load,
the last <= max_context_length; without a list powers of two from 128 up to
max_context_length; with bucketing off max_context_length alone), token-generation
graphs ``(tkg_batch_size, bucket)`` likewise from ``token_generation_buckets`` up to
seq_len, crossed with ``token_generation_batches`` when given.  ``batch_size`` is both
batches unless ``ctx_batch_size`` / ``tkg_batch_size`` say otherwise (defaults: batch
1, seq_len 128).  Through vLLM, ``batch_size`` and ``seq_len`` replace what it derives,
so ``engine_args`` (--max-num-seqs, --max-model-len) must agree with them.

The plugin: one graph per ``num_batched_tokens_buckets`` and per ``num_seqs_buckets``
entry, the largest of each EQUAL to max_num_batched_tokens / max_num_seqs; its token
budget is min(max_num_batched_tokens, max_model_len), and below max_model_len it runs
segmented prefill (token buckets in multiples of 128).  Its buckets are token budgets
per scheduler step.
"""

from __future__ import annotations

import math
from pathlib import Path

from model.base.errors import InputError
from model.serving.graphs import FREE_BATCH_NOTE, Compiled, Dropped, Graph, count_text, graph_set
from model.serving.parse import shown
from model.serving.parse_json import JsonLineIndex, json_int_list, json_scalar, json_text, key_line, load_json_object
from model.serving.settings import Settings, from_json
from model.serving.spec import ExportSpec, Given, context_bucket

NXDI_MIN_BUCKET = 128  # NxDI's default buckets start at 128
NXDI_DEFAULT_SEQ_LEN = 128
NEURON_TOKEN_STEP = 128  # the plugin's prefill segments
NXDI_KEYS = ("context_encoding_buckets", "token_generation_buckets", "max_context_length", "seq_len",
             "enable_bucketing", "batch_size", "ctx_batch_size", "tkg_batch_size", "token_generation_batches",
             "max_length")
NXDI_HINT = ("nxdi (NxD Inference, also through vllm-neuron as --additional-config "
             "'{\"override_neuron_config\": ...}')")


def nxdi_default(max_len: int) -> list[int]:
    """NxDI's buckets when none are listed: powers of two from 128, then the maximum itself."""
    if max_len == NXDI_MIN_BUCKET:
        return [max_len]
    return [2 ** i for i in range(int(math.log2(NXDI_MIN_BUCKET)), round(math.log2(max_len)))] + [max_len]


def nxdi_scope(text: str, top: dict, src: str) -> tuple[str, dict]:
    """Where the NeuronConfig settings are: the top level, neuron_config or override_neuron_config (one only)."""
    scopes: list[tuple[str, dict]] = [("", top)]
    for name in ("neuron_config", "override_neuron_config"):
        if name in top:
            if not isinstance(top[name], dict):
                raise InputError(src, key_line(text, name), name, f"expected an object, got {shown(top[name])}")
            scopes.append((name + ".", top[name]))
    holding = [(w, c) for w, c in scopes if any(k in c for k in NXDI_KEYS)]
    if not holding:
        raise InputError(src, None, "context_encoding_buckets", "missing (no NeuronConfig settings found at the "
                         "top level, in neuron_config or in override_neuron_config)")
    if len(holding) > 1:
        raise InputError(src, None, holding[1][0].rstrip("."), f"NeuronConfig settings in both "
                         f"{holding[0][0].rstrip('.') or 'the top level'} and {holding[1][0].rstrip('.')}: "
                         "which one applies is ambiguous")
    return holding[0]


def engine_settings(text: str, top: dict, index: JsonLineIndex, src: str) -> Settings:
    """The vLLM engine arguments an export records under ``engine_args`` (nothing when absent)."""
    engine = top.get("engine_args")
    if engine is None:
        return Settings()
    if not isinstance(engine, dict):
        raise InputError(src, key_line(text, "engine_args"), "engine_args", f"expected an object, got {shown(engine)}")
    return from_json(engine, src, index.key_line, "engine_args.")


def compile_nxdi(path: Path, text: str, settings: Settings) -> Compiled:
    """``nxdi``: the context-encoding and token-generation graphs NxDI compiles from these NeuronConfig settings."""
    src = str(path)
    top = load_json_object(text, src)
    where, conf = nxdi_scope(text, top, src)
    enabled = conf.get("enable_bucketing")
    if enabled is not None and not isinstance(enabled, bool):
        raise InputError(src, key_line(text, "enable_bucketing"), f"{where}enable_bucketing",
                         f"expected true or false, got {shown(enabled)}")
    index = JsonLineIndex(text, (*NXDI_KEYS, "engine_args", "max_num_seqs", "max_model_len"))
    scalar = {k: json_scalar(index, src, conf, k, where) for k in ("max_context_length", "seq_len", "batch_size",
                                                                  "ctx_batch_size", "tkg_batch_size", "max_length")}
    buckets = json_int_list(index, src, conf, "context_encoding_buckets", where, required=False)
    tkg = json_int_list(index, src, conf, "token_generation_buckets", where, required=False)
    batches = json_int_list(index, src, conf, "token_generation_batches", where, required=False)
    seq_len = scalar["seq_len"]
    max_length = scalar["max_length"] or seq_len or NXDI_DEFAULT_SEQ_LEN
    if tkg and max(g.value for g in tkg) > max_length:
        worst = max(tkg, key=lambda g: g.value)
        bound = "seq_len" if scalar["max_length"] is None else "max_length"
        raise InputError(src, worst.line, worst.field, f"{worst.value} is above {bound} {max_length}")
    for lst, key in ((buckets, "context_encoding_buckets"), (tkg, "token_generation_buckets")):
        if lst is not None and enabled is False:
            raise InputError(src, index.key_line(key), f"{where}{key}", "given while enable_bucketing is false")
    max_ctx = scalar["max_context_length"]
    if buckets is not None:
        if max_ctx is not None and max(g.value for g in buckets) > max_ctx:
            worst = max(buckets, key=lambda g: g.value)
            raise InputError(src, worst.line, worst.field, f"{worst.value} is above max_context_length {max_ctx} "
                             "(the last bucket, after sorting, must be <= it)")
        lengths = sorted(buckets, key=lambda g: g.value)
    else:
        if max_ctx is None:
            raise InputError(src, None, f"{where}context_encoding_buckets", "missing, and no max_context_length "
                             "to derive the buckets from")
        line, fld = index.key_line("max_context_length"), f"{where}max_context_length"
        lengths = [Given(v, src, line, fld) for v in (nxdi_default(max_ctx) if enabled else [max_ctx])]
    batch = scalar["batch_size"] or 1
    ctx_bs, tkg_bs = scalar["ctx_batch_size"] or batch, scalar["tkg_batch_size"] or batch
    if batches and max(g.value for g in batches) > tkg_bs:
        worst = max(batches, key=lambda g: g.value)
        raise InputError(src, worst.line, worst.field, f"{worst.value} is above tkg_batch_size {tkg_bs}")
    engine = engine_settings(text, top, index, src).merged(settings)
    for name, value in (("max_num_seqs", tkg_bs), ("max_model_len", seq_len)):
        given = engine.values.get(name)
        if given is not None and value is not None and given.value != value:
            what = "tkg_batch_size (batch_size)" if name == "max_num_seqs" else "seq_len"
            raise InputError(given.source, given.line, given.field, f"{given.value} disagrees with {what} {value}: "
                             "through vLLM the NeuronConfig value replaces it")
    tkg_values = ([g.value for g in tkg] if tkg else nxdi_default(max_length) if enabled else [max_length])
    tkg_batches = sorted({tkg_bs, *(g.value for g in batches or ())})
    graphs = [Graph("context", (ctx_bs, g.value)) for g in lengths]
    graphs += [Graph("token-gen", (b, t)) for b in tkg_batches for t in tkg_values]
    return Compiled(tuple(lengths), graph_set(graphs), settings=engine.pairs(("max_num_seqs", "max_model_len")))


def compile_vllm_neuron(path: Path, text: str, settings: Settings) -> Compiled:
    """``vllm-neuron``: one graph per num_batched_tokens_buckets / num_seqs_buckets entry.

    Takes the ``--additional-config`` object itself or this module's export (under
    additional_config, with engine_args).  Where max_num_batched_tokens / max_num_seqs
    are given, the largest bucket must EQUAL them, as the plugin requires; a token
    bucket over the budget min(max_num_batched_tokens, max_model_len) never runs.
    """
    src = str(path)
    top = load_json_object(text, src)
    holder, where = top, ""
    if "neuron_config" not in top and isinstance(top.get("additional_config"), dict):
        holder, where = top["additional_config"], "additional_config."
    conf = holder.get("neuron_config")
    if not isinstance(conf, dict):
        raise InputError(src, key_line(text, "neuron_config"), f"{where}neuron_config",
                         "missing or not an object (expected {\"neuron_config\": {\"num_batched_tokens_buckets\": "
                         "[...]}})")
    where += "neuron_config."
    index = JsonLineIndex(text, ("num_batched_tokens_buckets", "num_seqs_buckets", "max_num_batched_tokens",
                                 "max_num_seqs", "max_model_len"))
    tokens = json_int_list(index, src, conf, "num_batched_tokens_buckets", where)
    seqs = json_int_list(index, src, conf, "num_seqs_buckets", where, required=False)
    engine = top.get("engine_args", top)
    if not isinstance(engine, dict):
        raise InputError(src, key_line(text, "engine_args"), "engine_args", f"expected an object, got {shown(engine)}")
    for key, lst in (("max_num_batched_tokens", tokens), ("max_num_seqs", seqs)):
        value = json_scalar(index, src, engine, key, "engine_args." if engine is not top else "")
        if value is not None and lst and value != max(g.value for g in lst):
            raise InputError(src, index.key_line(key), key, f"{value} must equal the largest bucket, "
                             f"{max(g.value for g in lst)} (vllm-neuron requires it)")
    known = from_json(engine, src, index.key_line, "engine_args." if engine is not top else "").merged(settings)
    budget = min(v for v in (known.get("max_num_batched_tokens"), known.get("max_model_len"), MAX_BUDGET)
                 if v is not None)
    dropped = [Dropped(Graph("tokens", (g.value,)), f"over the token budget min(max_num_batched_tokens, "
                       f"max_model_len) = {budget}") for g in tokens if g.value > budget]
    segmented = known.get("max_model_len") is not None and budget < known.get("max_model_len")
    if segmented and any(g.value % NEURON_TOKEN_STEP for g in tokens):
        worst = next(g for g in tokens if g.value % NEURON_TOKEN_STEP)
        raise InputError(src, worst.line, worst.field, f"{worst.value} is not a multiple of {NEURON_TOKEN_STEP}: "
                         f"with a token budget {budget} below max_model_len the plugin runs segmented prefill")
    graphs = [Graph("tokens", (g.value,)) for g in tokens if g.value <= budget]
    graphs += [Graph("seqs", (g.value,)) for g in seqs or ()]
    return Compiled(tuple(g for g in tokens if g.value <= budget), graph_set(graphs), tuple(dropped),
                    known.pairs(("max_num_batched_tokens", "max_num_seqs", "max_model_len")))


MAX_BUDGET = 1 << 40  # no budget given: nothing is over it


# ---------------------------------------------------------------- writers


def planned_nxdi(spec: ExportSpec) -> tuple[Graph, ...]:
    """The plans' graphs as NxDI compiles them: context (n, shape), token-gen (n, context bucket)."""
    out = []
    for u in spec.uses:
        for n, context in u.runs():
            out.append(Graph("context", (n, u.shape)))
            if context is not None:
                out.append(Graph("token-gen", (n, context_bucket(context, spec))))
    return graph_set(out)


def planned_vllm_neuron(spec: ExportSpec) -> tuple[Graph, ...]:
    """The plans' graphs as the plugin compiles them: a token graph per shape, a seqs graph per batch size."""
    return graph_set([Graph("tokens", (s,)) for s in spec.shapes]
                     + [Graph("seqs", (n,)) for n in spec.batch_sizes or (1,)])


def few(values: list[int], most: int = 8) -> str:
    """Values in one short phrase: the first ``most`` and how many more."""
    more = f" and {len(values) - most} more" if len(values) > most else ""
    return ", ".join(map(str, values[:most])) + more


def header_text(graphs: tuple[Graph, ...], spec: ExportSpec, what: str) -> str:
    """The ``comment`` a JSON export opens with: what it is and how many graphs the stack compiles."""
    note = f" ({FREE_BATCH_NOTE})" if spec.compile_ms is None else ""
    return (f"shapeplan export: {what} The stack compiles exactly the graphs the plans run: "
            f"{count_text(graphs, spec.compile_ms)}{note}.")


def write_nxdi(spec: ExportSpec) -> str:
    """``nxdi``: NeuronConfig overrides with one batch size for every graph, and the vLLM values to match."""
    if not spec.has_contexts:
        raise InputError("--format", None, None, "nxdi needs the token-generation graphs, which come from the "
                         "generation lengths (without a list NxDI compiles powers of two up to seq_len): give "
                         "--scenario or --requests")
    sizes = sorted({n for u in spec.uses for n, _ in u.runs()})
    if len(sizes) > 1:
        raise InputError("--format", None, None, f"nxdi cannot express the plans: it compiles every "
                         f"context-encoding bucket at one batch size (ctx_batch_size) and every token-generation "
                         f"bucket at one (tkg_batch_size), but the plans run batches of {few(sizes)} requests; plan "
                         "with one batch size, or export with --format gaudi-file (a batch size per graph)")
    graphs = planned_nxdi(spec)
    shapes, tkg = list(spec.shapes), sorted(g.dims[1] for g in graphs if g.kind == "token-gen")
    n, seq_len = sizes[0], spec.max_model_len or tkg[-1]
    conf = {"enable_bucketing": True, "context_encoding_buckets": shapes, "token_generation_buckets": tkg,
            "max_context_length": shapes[-1], "seq_len": seq_len, "batch_size": n, "ctx_batch_size": n,
            "tkg_batch_size": n}
    what = ("NxD Inference NeuronConfig overrides: pass override_neuron_config as NeuronConfig keyword arguments, or "
            "through vLLM as --additional-config '{\"override_neuron_config\": ...}' with engine_args as "
            f"--max-num-seqs {n} --max-model-len {seq_len} (they must agree).")
    return json_text({"comment": header_text(graphs, spec, what), "override_neuron_config": conf,
                      "engine_args": {"max_num_seqs": n, "max_model_len": seq_len}})


def write_vllm_neuron(spec: ExportSpec) -> str:
    """``vllm-neuron``: the --additional-config object and the engine settings its lists must end at."""
    tokens, seqs = list(spec.shapes), list(spec.batch_sizes or (1,))
    odd = [s for s in tokens if s % NEURON_TOKEN_STEP]
    if odd:
        raise InputError("--format", None, None, f"vllm-neuron cannot express the shapes {', '.join(map(str, odd))}: "
                         f"its token buckets are multiples of {NEURON_TOKEN_STEP}; export with --format {NXDI_HINT}")
    longest = max((u.context or 0 for u in spec.uses), default=0)
    if max(longest, spec.max_model_len or 0) > tokens[-1]:
        why = (f"--max-model-len {spec.max_model_len}" if (spec.max_model_len or 0) >= longest
               else f"the longest context (shape + generation) {longest}")
        raise InputError("--format", None, None, f"vllm-neuron cannot express the plans: its token budget must equal "
                         f"max_model_len (else it runs segmented prefill) and its last token bucket the budget, so "
                         f"{why} would add a graph over the largest shape {tokens[-1]} the plans never run; export "
                         f"with --format {NXDI_HINT}")
    graphs = planned_vllm_neuron(spec)
    what = ("vllm-neuron plugin: pass additional_config as --additional-config and engine_args as "
            "--max-num-batched-tokens / --max-num-seqs / --max-model-len. Buckets are token budgets per scheduler "
            "step (requests packed together): the plans' shapes are used as token budgets. max_model_len is the "
            "largest shape, as the plugin's budget must be: the server refuses a request whose prompt plus "
            "generation passes it.")
    return json_text({
        "comment": header_text(graphs, spec, what),
        "additional_config": {"neuron_config": {"num_batched_tokens_buckets": tokens, "num_seqs_buckets": seqs}},
        "engine_args": {"max_num_batched_tokens": tokens[-1], "max_num_seqs": seqs[-1], "max_model_len": tokens[-1]},
    })
