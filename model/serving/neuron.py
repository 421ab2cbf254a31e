"""AWS Neuron: NxDI's NeuronConfig (``nxdi``) and the vllm-neuron plugin's ``--additional-config`` (``vllm-neuron``).

Follows NxDI's rules: context_encoding_buckets are sorted on load and the last must be
<= max_context_length; without a list, bucketing gives powers of two from 128 up to
max_context_length, and with bucketing off the one shape is max_context_length.  And
the plugin's: the largest of num_batched_tokens_buckets / num_seqs_buckets must EQUAL
max_num_batched_tokens / max_num_seqs.  Its buckets are token budgets per scheduler step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from model.base.errors import InputError
from model.serving.parse import shown
from model.serving.parse_json import JsonLineIndex, json_int_list, json_scalar, json_text, key_line, load_json_object
from model.serving.spec import ExportSpec, Given, contexts

NXDI_MIN_BUCKET = 128  # NxDI's default buckets start at 128


def nxdi_default(max_len: int) -> list[int]:
    """NxDI's buckets when none are listed: powers of two from 128, then the maximum itself."""
    if max_len == NXDI_MIN_BUCKET:
        return [max_len]
    return [2 ** i for i in range(int(math.log2(NXDI_MIN_BUCKET)), round(math.log2(max_len)))] + [max_len]


NXDI_KEYS = ("context_encoding_buckets", "token_generation_buckets", "max_context_length", "seq_len",
             "enable_bucketing")


@dataclass(frozen=True)
class NxdiConfig:
    """The NeuronConfig settings of an nxdi file, checked: where they sit and what they say about buckets."""

    where: str  # "" (top level), "neuron_config." or "override_neuron_config."
    context: list[Given]  # context-encoding buckets, sorted (NxDI's defaults when none are listed)
    token_generation: list[Given] | None  # as listed, sorted; None when the file lists none
    seq_len: int | None
    enabled: bool | None


def read_nxdi(path: Path, text: str, max_model_len: int | None) -> list[Given]:
    """``nxdi``: the context-encoding buckets of NeuronConfig settings (see ``nxdi_config``)."""
    return nxdi_config(path, text).context


def nxdi_config(path: Path, text: str) -> NxdiConfig:
    """``nxdi``: NeuronConfig settings as JSON -- top level, or under neuron_config / override_neuron_config.

    Exactly one of those places may hold the settings.  context_encoding_buckets is sorted
    (as NxDI does on load) and its last entry must be <= max_context_length; without a
    list, bucketing gives powers of two from 128 to max_context_length, and with
    bucketing off the one shape is max_context_length.
    """
    src = str(path)
    top = load_json_object(text, src)
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
    where, conf = holding[0]
    enabled = conf.get("enable_bucketing")
    if enabled is not None and not isinstance(enabled, bool):
        raise InputError(src, key_line(text, "enable_bucketing"), f"{where}enable_bucketing",
                         f"expected true or false, got {shown(enabled)}")
    index = JsonLineIndex(text, NXDI_KEYS)
    max_ctx = json_scalar(index, src, conf, "max_context_length", where)
    seq_len = json_scalar(index, src, conf, "seq_len", where)
    buckets = json_int_list(index, src, conf, "context_encoding_buckets", where, required=False)
    tkg = json_int_list(index, src, conf, "token_generation_buckets", where, required=False)
    if tkg and seq_len is not None and max(g.value for g in tkg) > seq_len:
        worst = max(tkg, key=lambda g: g.value)
        raise InputError(src, worst.line, worst.field, f"{worst.value} is above seq_len {seq_len}")
    tkg = sorted(tkg, key=lambda g: g.value) if tkg else None
    if buckets is not None and enabled is False:
        raise InputError(src, index.key_line("context_encoding_buckets"), f"{where}context_encoding_buckets",
                         "given while enable_bucketing is false")
    if buckets is not None:
        if max_ctx is not None and max(g.value for g in buckets) > max_ctx:
            worst = max(buckets, key=lambda g: g.value)
            raise InputError(src, worst.line, worst.field, f"{worst.value} is above max_context_length {max_ctx} "
                             "(the last bucket, after sorting, must be <= it)")
        return NxdiConfig(where, sorted(buckets, key=lambda g: g.value), tkg, seq_len, enabled)
    if max_ctx is None:
        raise InputError(src, None, f"{where}context_encoding_buckets", "missing, and no max_context_length "
                         "to derive the buckets from")
    line, fld = index.key_line("max_context_length"), f"{where}max_context_length"
    values = nxdi_default(max_ctx) if enabled else [max_ctx]
    return NxdiConfig(where, [Given(v, src, line, fld) for v in values], tkg, seq_len, enabled)


def read_vllm_neuron(path: Path, text: str, max_model_len: int | None) -> list[Given]:
    """``vllm-neuron``: num_batched_tokens_buckets of the plugin's neuron_config.

    Takes the ``--additional-config`` object itself or this module's export (under
    additional_config, with engine_args).  Where max_num_batched_tokens / max_num_seqs
    are given, the largest bucket must EQUAL them, as the plugin requires.
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
                                 "max_num_seqs"))
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
    return tokens


def write_nxdi(spec: ExportSpec) -> str:
    """``nxdi``: NeuronConfig keyword arguments; every list sorted, each maximum equal to its limit."""
    shapes = list(spec.shapes)
    conf: dict[str, object] = {"enable_bucketing": True, "context_encoding_buckets": shapes}
    tkg = contexts(spec)
    if tkg:
        conf["token_generation_buckets"] = tkg
    conf["max_context_length"] = shapes[-1]
    conf["seq_len"] = spec.max_model_len or (tkg[-1] if tkg else shapes[-1])
    conf["batch_size"] = max(spec.batch_sizes or (1,))
    return json_text(conf)


def write_vllm_neuron(spec: ExportSpec) -> str:
    """``vllm-neuron``: the --additional-config object and the engine maxima its lists must end at."""
    tokens = list(spec.shapes)
    seqs = list(spec.batch_sizes or (1,))
    return json_text({
        "comment": "shapeplan export for the vllm-neuron plugin: pass additional_config as --additional-config and "
                   "engine_args as --max-num-batched-tokens / --max-num-seqs. Buckets are token budgets per "
                   "scheduler step (requests packed together): the plans' shapes are used as token budgets.",
        "additional_config": {"neuron_config": {"num_batched_tokens_buckets": tokens, "num_seqs_buckets": seqs}},
        "engine_args": {"max_num_batched_tokens": tokens[-1], "max_num_seqs": seqs[-1]},
    })

