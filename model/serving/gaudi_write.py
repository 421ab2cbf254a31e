"""Writing vLLM-on-Gaudi configs that compile exactly the graphs the plans run, with the settings they need.

A plan's batch of n requests at shape s runs the prompt graph ``(n, s, 0)`` and, with
requests known, the decode graph ``(n, 1, n x ceil(context / block size))``, context
being s plus the longest generation among the plans' batches of n at s.  The bucket
file lists exactly those (a list in a line only where every product member is used).
The variables (the ``lin`` strategy) cross every batch value with every length, so
they are written only when that product is exactly the plans' graphs; otherwise the
export is refused with one line pointing at ``gaudi-file``.  Both set what vllm-gaudi
filters by: ``--max-num-batched-tokens`` (the largest batch x length),
``VLLM_PROMPT_BS_BUCKET_MAX`` and ``--max-num-seqs`` (the largest batch),
``--max-model-len`` and ``--block-size``.
"""

from __future__ import annotations

from model.base.errors import InputError
from model.serving.gaudi import lin_exact, lin_ladder
from model.serving.graphs import FREE_BATCH_NOTE, Graph, count_text, graph_set
from model.serving.spec import ExportSpec

FILE_HINT = "export with --format gaudi-file (the bucket file lists any set of graphs)"


def planned_gaudi(spec: ExportSpec) -> tuple[Graph, ...]:
    """The graphs the plans run, in vllm-gaudi's notation (prompt (n, s, 0), decode (n, 1, total blocks))."""
    out = []
    for u in spec.uses:
        for n, context in u.runs():
            out.append(Graph("prompt", (n, u.shape, 0)))
            if context is not None:
                out.append(Graph("decode", (n, 1, n * -(-context // spec.block_size))))
    return graph_set(out)


def server_values(spec: ExportSpec) -> dict[str, int]:
    """The settings the graphs need: token budget = the largest batch x length, prefill cap and max seqs = the
    largest batch, max model len = the given one or the longest context."""
    runs = [(n, u.shape, c) for u in spec.uses for n, c in u.runs()]
    longest = max(c if c is not None else s for _, s, c in runs)
    return {"MAX_NUM_BATCHED_TOKENS": max(n * s for n, s, _ in runs),
            "VLLM_PROMPT_BS_BUCKET_MAX": max(n for n, _, _ in runs),
            "MAX_NUM_SEQS": max(n for n, _, _ in runs),
            "MAX_MODEL_LEN": spec.max_model_len or longest,
            "BLOCK_SIZE": spec.block_size}


def need_decode(spec: ExportSpec, fmt: str) -> None:
    """vllm-gaudi cannot start without decode graphs, and they come from the generation lengths."""
    if not spec.has_contexts:
        raise InputError("--format", None, None, f"{fmt} needs the decode graphs, which come from the generation "
                         "lengths (vllm-gaudi builds no server without them): give --scenario or --requests")


def header(spec: ExportSpec, what: str) -> list[str]:
    """The comment lines every Gaudi export opens with: what it is and how many graphs the server compiles."""
    graphs = planned_gaudi(spec)
    lines = [f"# shapeplan export: {what}",
             f"# the server compiles exactly the graphs the plans run: {count_text(graphs, spec.compile_ms)}"]
    if spec.compile_ms is None:
        lines.append(f"# ({FREE_BATCH_NOTE})")
    return lines


def _literal(values: list[int] | tuple[int, ...]) -> str:
    """One gaudi-file element: a bare int when there is one value, else a list."""
    return str(values[0]) if len(values) == 1 else "[" + ", ".join(map(str, values)) + "]"


def _grouped(pairs: list[tuple[int, int]]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for key, value in pairs:
        out.setdefault(key, []).append(value)
    return out


def write_gaudi_file(spec: ExportSpec) -> str:
    """``gaudi-file``: exactly the plans' prompt and decode graphs, and the settings as ``# setting:`` lines."""
    need_decode(spec, "gaudi-file")
    values = server_values(spec)
    graphs = planned_gaudi(spec)
    lines = header(spec, "vLLM on Gaudi bucket file (VLLM_BUCKETING_FROM_FILE, which wins over any strategy).")
    lines += ["# start the server with these settings (model.export --check reads them from these lines):",
              "# setting: VLLM_BUCKETING_FROM_FILE=<this file>",
              f"# setting: VLLM_PROMPT_BS_BUCKET_MAX={values['VLLM_PROMPT_BS_BUCKET_MAX']}",
              f"# setting: MAX_NUM_BATCHED_TOKENS={values['MAX_NUM_BATCHED_TOKENS']}",
              f"# setting: MAX_NUM_SEQS={values['MAX_NUM_SEQS']}",
              f"# setting: MAX_MODEL_LEN={values['MAX_MODEL_LEN']}",
              f"# setting: BLOCK_SIZE={values['BLOCK_SIZE']}",
              (f"# i.e. vllm serve ... --max-num-batched-tokens {values['MAX_NUM_BATCHED_TOKENS']} --max-num-seqs "
               f"{values['MAX_NUM_SEQS']} --max-model-len {values['MAX_MODEL_LEN']} --block-size "
               f"{values['BLOCK_SIZE']}"),
              "# prompt: (batch sizes, query_len, ctx_blocks) -- each shape with the batch sizes the plans run at it"]
    prompt = _grouped([(g.dims[1], g.dims[0]) for g in graphs if g.kind == "prompt"])
    lines += [f"({_literal(sizes)}, {shape}, 0)" for shape, sizes in sorted(prompt.items())]
    lines.append(f"# decode: (batch, 1, total KV blocks of the batch at block size {spec.block_size}), a sequence's "
                 "context being its shape + the longest generation of the plans' batches of that size there")
    decode = _grouped([(g.dims[0], g.dims[2]) for g in graphs if g.kind == "decode"])
    lines += [f"({n}, 1, {_literal(blocks)})" for n, blocks in sorted(decode.items())]
    return "\n".join(lines) + "\n"


def _refuse(what: str) -> InputError:
    return InputError("--format", None, None, f"gaudi-env cannot express {what}; {FILE_HINT} and set "
                      "VLLM_BUCKETING_FROM_FILE to that file")


def _shown(graphs: set[tuple[int, int]], most: int = 4) -> str:
    ordered = sorted(graphs)
    more = f" and {len(ordered) - most} more" if len(ordered) > most else ""
    return ", ".join(str(g) for g in ordered[:most]) + more


def query_ladder(spec: ExportSpec) -> tuple[int, int, int]:
    """The lin (MIN, STEP, MAX) that makes exactly the shapes (an InputError pointing at gaudi-file if none)."""
    query = lin_exact(spec.shapes)
    if query is None:
        raise InputError("--format", None, None,
                         f"gaudi-env cannot express the shapes {', '.join(map(str, spec.shapes))}: the lin strategy "
                         "only makes ladders (MIN, doubling up to STEP, then +STEP up to MAX); export with "
                         "--format gaudi-file and set VLLM_BUCKETING_FROM_FILE to that file")
    return query


def lin_plan(spec: ExportSpec) -> dict[str, tuple[int, int, int]]:
    """The lin (MIN, STEP, MAX) of every range whose product, after vllm-gaudi's filters, is exactly the
    plans' graphs (an InputError naming what lin cannot express otherwise)."""
    query = query_ladder(spec)
    need_decode(spec, "gaudi-env")
    graphs = planned_gaudi(spec)
    values = server_values(spec)
    prompt = {g.dims[:2] for g in graphs if g.kind == "prompt"}
    decode = {(g.dims[0], g.dims[2]) for g in graphs if g.kind == "decode"}
    cfg = {"bs": _exact([n for n, _ in prompt], "the prompt batch sizes"), "query": query}
    made = {(b, q) for b in lin_ladder(*cfg["bs"]) for q in lin_ladder(*query)
            if b * q <= values["MAX_NUM_BATCHED_TOKENS"]}
    if made != prompt:
        raise _refuse(f"these prompt graphs: lin crosses every batch size with every length, so it would also "
                      f"compile {_shown(made - prompt)}, which the plans never run")
    cfg["decode_bs"] = _exact([n for n, _ in decode], "the decode batch sizes")
    cfg["block"] = _exact([k for _, k in decode], "the decode block counts")
    cap = -(-values["MAX_MODEL_LEN"] // spec.block_size)
    made = {(b, min(k, b * cap)) for b in lin_ladder(*cfg["decode_bs"]) for k in lin_ladder(*cfg["block"]) if b <= k}
    if made != decode:
        raise _refuse(f"these decode graphs: lin crosses every batch size with every block count, so it would "
                      f"compile {_shown(made ^ decode)} where the plans run {_shown(decode)}")
    return cfg


def _exact(values: list[int], what: str) -> tuple[int, int, int]:
    cfg = lin_exact(values)
    if cfg is None:
        raise _refuse(f"{what} {', '.join(map(str, sorted(set(values))))}: lin only makes ladders")
    return cfg


def _triple(prefix: str, cfg: tuple[int, int, int]) -> list[str]:
    return [f"{prefix}_{p}={v}" for p, v in zip(("MIN", "STEP", "MAX"), cfg, strict=True)]


def write_gaudi_env(spec: ExportSpec) -> str:
    """``gaudi-env``: the lin strategy with ladders whose filtered product is exactly the plans' graphs.

    Refused (one line naming gaudi-file) when no ladders make exactly them: a covering
    ladder would compile graphs the plans never run, which is what they were optimised
    to avoid.
    """
    cfg = lin_plan(spec)
    values = server_values(spec)
    lines = [*header(spec, "vLLM on Gaudi bucketing variables (VAR=value; source or pass as environment)."),
             "# lin keeps these values; exp (the default) would overwrite them. Leave VLLM_EXPONENTIAL_BUCKETING",
             "# unset: it is deprecated and, when set, overrides the strategy. Prefix caching is assumed on (vLLM's",
             "# default): without it vllm-gaudi's contiguous PA adds a decode graph at the KV cache's size.",
             "VLLM_BUCKETING_STRATEGY=lin",
             f"# prompt query lengths: exactly the shapes {', '.join(map(str, lin_ladder(*cfg['query'])))}",
             *_triple("VLLM_PROMPT_QUERY_BUCKET", cfg["query"]),
             "# the same under the legacy names older releases read",
             *_triple("VLLM_PROMPT_SEQ_BUCKET", cfg["query"]),
             f"# prompt batch sizes {', '.join(map(str, lin_ladder(*cfg['bs'])))} (MAX is also the most prompts a "
             "step batches); no prefix-context graphs",
             *_triple("VLLM_PROMPT_BS_BUCKET", cfg["bs"]),
             *_triple("VLLM_PROMPT_CTX_BUCKET", (0, 1, 0)),
             f"# decode: batch sizes and total KV blocks (block size {spec.block_size})",
             *_triple("VLLM_DECODE_BS_BUCKET", cfg["decode_bs"]),
             *_triple("VLLM_DECODE_BLOCK_BUCKET", cfg["block"]),
             "# not read by vLLM: they record the flags to start it with (--max-num-batched-tokens, --max-num-seqs,",
             "# --max-model-len, --block-size); model.export --check reads them",
             *(f"{key}={values[key]}" for key in ("MAX_NUM_BATCHED_TOKENS", "MAX_NUM_SEQS", "MAX_MODEL_LEN",
                                                  "BLOCK_SIZE"))]
    return "\n".join(lines) + "\n"
