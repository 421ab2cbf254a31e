"""Compiled graphs in the formats serving stacks read: one reader, one writer and one plan view per format.

Import (``read_shapes``, ``compile_config``) reads a configuration by its stack's rules:
the graphs it makes the server compile (after the stack's filters, with the server
settings they need from the file or ``--server-settings``), the graphs it lists that
the stack drops, and the sorted, unique prompt lengths, each rounded up to the 64-token
granularity of shapeplan's shapes (the (given, rounded) pairs come back too, so a
caller can warn naming them).  Export (``render``) writes exactly the graphs the plans
run (``planned``) and the settings they need, or refuses with one line naming the
format that can; every export is read back before it is returned, so one the importer
would refuse or read differently is refused instead.  Every problem with an input
file is an InputError naming file, line and field; none is a traceback.  See
shared/serving-configs.md.

This module is the registry: each format's rules live with the stack they follow
(``lists``: list, json; ``gaudi``/``gaudi_read``/``gaudi_write``: gaudi-file,
gaudi-env; ``neuron``: nxdi, vllm-neuron; ``tpu``: vllm-tpu), the shared readers and
limits in ``parse``, ``parse_json`` and ``settings``, the records in ``spec`` and
``graphs``.

What each format writes (a plan's batch of n at shape s runs the graph (n, s); with
requests, its decode graph covers s + the longest generation of the plans' batches of
n at s):

``list``
    One length a line; its graphs are its shapes (the format holds no batch).
``json``
    ``{"shapes", "batch_sizes", "buckets": {"context": [...]}, "graphs": {"prompt": [[n, s]],
    "decode": [[n, context bucket]]}}``; read back: the same graphs.
``gaudi-file``
    ``VLLM_BUCKETING_FROM_FILE``: ``([n...], s, 0)`` prompt lines and ``(n, 1, [blocks...])``
    decode lines, exactly the plans' graphs, and ``# setting:`` lines for
    VLLM_PROMPT_BS_BUCKET_MAX, --max-num-batched-tokens, --max-num-seqs, --max-model-len,
    --block-size.  Needs the requests (vllm-gaudi cannot start without decode graphs).
``gaudi-env``
    The ``lin`` strategy, written only when the filtered product of its ladders is exactly
    the plans' graphs (else refused, pointing at gaudi-file).
``nxdi``
    ``override_neuron_config`` (context and token-generation buckets, one batch size for
    both, refused when the plans run several) and ``engine_args`` vLLM must agree with.
``vllm-neuron``
    Token buckets = the shapes (multiples of 128, the last = the budget = max_model_len),
    seqs buckets = the batch sizes; refused when a context or --max-model-len passes the
    largest shape.
``vllm-tpu``
    A ladder (MIN_TOKEN_BUCKET, gap) made of plan shapes only, the rest as compilation
    sizes, up to --max-num-batched-tokens = the largest shape.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from model.base.errors import InputError, unknown_name
from model.cost.common import GRANULARITY
from model.serving import gaudi_read, gaudi_write, lists, neuron, tpu
from model.serving.graphs import Compiled, Graph, ShapeImport
from model.serving.parse import check_range, read_text
from model.serving.settings import Setting, Settings
from model.serving.spec import ExportSpec, Given, align, check_spec

Reader = Callable[[Path, str, Settings], Compiled]
Writer = Callable[[ExportSpec], str]
Planner = Callable[[ExportSpec], tuple[Graph, ...]]

READERS: dict[str, Reader] = {
    "list": lists.compile_list,
    "gaudi-env": gaudi_read.compile_gaudi_env,
    "gaudi-file": gaudi_read.compile_gaudi_file,
    "nxdi": neuron.compile_nxdi,
    "vllm-neuron": neuron.compile_vllm_neuron,
    "vllm-tpu": tpu.compile_vllm_tpu,
    "json": lists.compile_json,
}

WRITERS: dict[str, Writer] = {
    "list": lists.write_list,
    "gaudi-file": gaudi_write.write_gaudi_file,
    "gaudi-env": gaudi_write.write_gaudi_env,
    "nxdi": neuron.write_nxdi,
    "vllm-neuron": neuron.write_vllm_neuron,
    "vllm-tpu": tpu.write_vllm_tpu,
    "json": lists.write_json,
}

PLANNED: dict[str, Planner] = {
    "list": lists.planned_list,
    "gaudi-file": gaudi_write.planned_gaudi,
    "gaudi-env": gaudi_write.planned_gaudi,
    "nxdi": neuron.planned_nxdi,
    "vllm-neuron": neuron.planned_vllm_neuron,
    "vllm-tpu": tpu.planned_vllm_tpu,
    "json": lists.planned_json,
}


def check_format(fmt: str, flag: str) -> None:
    if fmt not in READERS:
        raise InputError(flag, None, None, unknown_name("format", fmt, READERS))


def compile_config(path: str | Path, fmt: str, settings: Settings | None = None, text: str | None = None) -> Compiled:
    """The graphs the configuration at ``path`` (format ``fmt``) makes its stack compile, by the stack's rules.

    ``text`` is the file's content when the caller has it (an export checking itself).
    """
    check_format(fmt, "--shapes-format")
    path = Path(path)
    return READERS[fmt](path, read_text(path) if text is None else text, settings or Settings())


def read_shapes(path: str | Path, fmt: str, max_model_len: int | None = None,
                settings: Settings | None = None) -> ShapeImport:
    """The shapes the configuration at ``path`` (in format ``fmt``) makes a server compile, and its graphs.

    ``max_model_len`` (or the max_model_len setting) is needed by the formats whose rules
    derive from it and otherwise bounds every length read.
    """
    check_format(fmt, "--shapes-format")
    settings = settings or Settings()
    if max_model_len is not None:
        max_model_len = check_range(max_model_len, "max_model_len", None, None)
        settings = Settings({"max_model_len": Setting(max_model_len, "max_model_len", None, "max_model_len")}
                            ).merged(settings)
    compiled = compile_config(path, fmt, settings)
    given = list(compiled.lengths)
    if not given:
        raise InputError(str(path), None, None, "no sequence lengths found")
    if max_model_len is not None and fmt != "vllm-tpu":  # TPU's last rung covers the budget, may pass it
        for g in given:
            if g.value > max_model_len:
                raise InputError(g.source, g.line, g.field, f"{g.value} is longer than max_model_len {max_model_len}")
    return finish(given, str(path), compiled)


def planned(fmt: str, spec: ExportSpec) -> tuple[Graph, ...]:
    """The graphs the plans in ``spec`` run, in format ``fmt``'s notation."""
    check_format(fmt, "--format")
    return PLANNED[fmt](spec)


def render(fmt: str, spec: ExportSpec) -> str:
    """The text of ``spec`` in format ``fmt``: exactly the plans' graphs (an InputError if the format
    cannot express them, or if the text would not read back to them)."""
    check_format(fmt, "--format")
    check_spec(spec)
    text = WRITERS[fmt](spec)
    try:
        back = compile_config(Path(f"<{fmt} export>"), fmt, text=text)
    except InputError as exc:
        raise InputError("--format", None, None, f"the {fmt} export would not read back ({exc.message}); "
                         "nothing written") from None
    if back.graphs != PLANNED[fmt](spec) or back.dropped:
        raise InputError("--format", None, None, f"the {fmt} export would read back to other graphs than the "
                         "plans run; nothing written")
    return text


def finish(given: list[Given], source: str, compiled: Compiled | None = None) -> ShapeImport:
    """Round every length up to a multiple of 64; keep the pairs that moved for the warning."""
    shapes = sorted({align(g.value) for g in given})
    rounded = sorted({(g.value, align(g.value)) for g in given if g.value % GRANULARITY})
    return ShapeImport(tuple(shapes), tuple(rounded), source, compiled)
