"""Compiled shapes in the formats serving stacks read: one reader and one writer per format.

Import (``read_shapes``) gives the sorted, unique sequence lengths a configuration makes
a server compile, each rounded up to the 64-token granularity of shapeplan's shapes; the
(given, rounded) pairs come back too, so a caller can warn naming them.  Export
(``render``) writes the shapes a set of plans uses and, where the format has them, batch
sizes and decode/context buckets.  Every problem with an input file is an InputError
naming file, line and field; none is a traceback.  See shared/serving-configs.md.

This module is the registry: each format's reader and writer live with the rules of
the stack they follow (``lists``: list, json; ``gaudi``: gaudi-file, gaudi-env;
``neuron``: nxdi, vllm-neuron; ``tpu``: vllm-tpu), the shared readers and limits in
``parse`` and ``parse_json``, the records in ``spec``.

What each format writes, reads and guarantees on a round trip (export, then import):

``list``
    One length a line (or comma separated), ``#`` comments.  Round trip: the same shapes.
``json``
    ``{"shapes": [...], "batch_sizes": [...], "buckets": {name: [...]}}``; the only bucket
    list is ``context`` (per shape: shape + longest generation of its batches, rounded up
    to 64), present when the requests are known.  Import checks every list; at most 64
    named bucket lists, 100,000 entries among them.  Round trip: the same shapes.
``gaudi-file``
    vllm-gaudi's ``VLLM_BUCKETING_FROM_FILE``: one Python literal 3-tuple a line.  Export:
    a prompt line ``(batch sizes, shape, 0)`` per shape with exactly the batch sizes the
    plans use at it, and (with requests) a decode line ``(n, 1, [total KV blocks])`` per
    batch size n, a batch's blocks being n * ceil(context / block size).  Import: the
    query_len of every prompt tuple (decode tuples, middle element 1, are checked and
    skipped).  Round trip: the same shapes.
``gaudi-env``
    ``VAR=value`` lines.  Export uses the ``lin`` strategy (``exp``, the default, overwrites
    user values): the prompt query ladder MIN/STEP/MAX must generate EXACTLY the shapes
    (start at MIN, double until STEP, then add STEP up to MAX); a set ``lin`` cannot
    express (192, 704, 1536) is refused with one line pointing at ``gaudi-file``, so the
    export never compiles lengths the plans do not use.  Batch sizes and decode blocks,
    which ``lin`` crosses into a Cartesian product anyway, get the smallest ladder found
    that covers them.  Import: ``lin`` (QUERY or legacy SEQ names), ``exp`` (from the max
    model length, key ``MAX_MODEL_LEN`` or the ``max_model_len`` argument, block size key
    ``BLOCK_SIZE``, default 128), or the bucket file named by ``VLLM_BUCKETING_FROM_FILE``
    (relative to the env file's folder).  Round trip: the same shapes, for every set it
    accepts.
``nxdi``
    NeuronConfig keyword arguments as JSON (top level, or under ``neuron_config`` /
    ``override_neuron_config``).  Export: enable_bucketing, context_encoding_buckets (the
    shapes), token_generation_buckets (the contexts, with requests), max_context_length
    (largest shape), seq_len, batch_size (largest batch).  Import: context_encoding_buckets
    (sorted; the last must be <= max_context_length); without a list, NxDI's default
    powers of two from 128 to max_context_length.  Round trip: the same shapes.
``vllm-neuron``
    ``{"additional_config": {"neuron_config": {"num_batched_tokens_buckets": [...],
    "num_seqs_buckets": [...]}}, "engine_args": {"max_num_batched_tokens": N,
    "max_num_seqs": M}}``: the largest bucket of each list EQUALS its maximum, as the
    plugin requires.  Import also takes the bare ``{"neuron_config": ...}`` object.
    Buckets there are token budgets per scheduler step.  Round trip: the same shapes.
``vllm-tpu``
    ``VAR=value`` lines: ``VLLM_TPU_BUCKET_PADDING_GAP``, ``MAX_MODEL_LEN`` (stands for
    ``--max-model-len``) and ``COMPILATION_SIZES`` (stands for ``--additional-config
    '{"compilation_sizes": [...]}'``, sizes ADDED to the ladder).  The server always
    compiles its whole ladder (gap 0: powers of two from 16 until the max is covered;
    gap g: doubling from 16 up to g, then +g until the max is covered), so export picks
    the gap (0 or a multiple of 64) whose ladder plus the shapes it misses -- written as
    compilation sizes -- is smallest.  Round trip, honestly: the import is exactly what
    the server compiles (ladder plus compilation sizes, rounded up to 64); it contains
    every exported shape, and everything else in it is a rung of the written ladder.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from model.base.errors import InputError
from model.cost.common import GRANULARITY
from model.serving import gaudi, lists, neuron, tpu
from model.serving.parse import check_range, read_text
from model.serving.spec import ExportSpec, Given, ShapeImport, align, check_spec

Reader = Callable[[Path, str, int | None], list[Given]]
Writer = Callable[[ExportSpec], str]

READERS: dict[str, Reader] = {
    "list": lists.read_list,
    "gaudi-env": gaudi.read_gaudi_env,
    "gaudi-file": gaudi.read_gaudi_file,
    "nxdi": neuron.read_nxdi,
    "vllm-neuron": neuron.read_vllm_neuron,
    "vllm-tpu": tpu.read_vllm_tpu,
    "json": lists.read_json,
}

WRITERS: dict[str, Writer] = {
    "list": lists.write_list,
    "gaudi-file": gaudi.write_gaudi_file,
    "gaudi-env": gaudi.write_gaudi_env,
    "nxdi": neuron.write_nxdi,
    "vllm-neuron": neuron.write_vllm_neuron,
    "vllm-tpu": tpu.write_vllm_tpu,
    "json": lists.write_json,
}


def read_shapes(path: str | Path, fmt: str, max_model_len: int | None = None) -> ShapeImport:
    """The shapes the configuration at ``path`` (in format ``fmt``) makes a server compile.

    ``max_model_len`` is needed by the formats whose buckets derive from it (Gaudi's exp
    strategy, TPU) and otherwise bounds every length read.
    """
    if fmt not in READERS:
        raise InputError("--shapes-format", None, None, f"unknown format {fmt!r} ({', '.join(READERS)})")
    if max_model_len is not None:
        max_model_len = check_range(max_model_len, "max_model_len", None, None)
    path = Path(path)
    given = READERS[fmt](path, read_text(path), max_model_len)
    if not given:
        raise InputError(str(path), None, None, "no sequence lengths found")
    if max_model_len is not None and fmt != "vllm-tpu":  # TPU's last rung covers the max, may pass it
        for g in given:
            if g.value > max_model_len:
                raise InputError(g.source, g.line, g.field, f"{g.value} is longer than max_model_len {max_model_len}")
    return finish(given, str(path))


def render(fmt: str, spec: ExportSpec) -> str:
    """The text of ``spec`` in format ``fmt`` (an InputError if the format cannot express it)."""
    if fmt not in WRITERS:
        raise InputError("--format", None, None, f"unknown format {fmt!r} ({', '.join(WRITERS)})")
    check_spec(spec)
    return WRITERS[fmt](spec)


def finish(given: list[Given], source: str) -> ShapeImport:
    """Round every length up to a multiple of 64; keep the pairs that moved for the warning."""
    shapes = sorted({align(g.value) for g in given})
    rounded = sorted({(g.value, align(g.value)) for g in given if g.value % GRANULARITY})
    return ShapeImport(tuple(shapes), tuple(rounded), source)

