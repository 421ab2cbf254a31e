"""NxD Inference's ``benchmark_report.json`` as measurement rows (one file per batch/length run).

NxD Inference's benchmark (``neuronx_distributed_inference.utils.benchmark``, run by
``inference_demo --benchmark``) writes one JSON object per run with a section per
sub-model -- ``context_encoding_model``, ``token_generation_model`` (and ``e2e_model``,
``speculation_model``, which are not step times of our model) -- each holding
``latency_ms_p50 ... latency_ms_p100``, ``latency_ms_avg`` and ``throughput``.  The file
does not say the batch size or the lengths of the run; they come from the compiled model's
``neuron_config.json`` placed beside the report (NxD Inference saves it with the compiled
model, batch_size, ctx_batch_size, tkg_batch_size, max_context_length, seq_len), or from
flags when there is none.

How a run becomes rows (what is assumed is said in the profile's header):

- ``context_encoding_model`` -> one prefill row: ``ctx_batch_size`` (default batch_size)
  members padded to ``max_context_length`` (the benchmark's prompt fills the context
  window), time = ``latency_ms_p50`` (every call has the same shape, so the median is the
  step time without the odd slow call);
- ``token_generation_model`` -> one decode row: ``tkg_batch_size`` (default batch_size)
  members at the mean context ``(max_context_length + seq_len) / 2``, time =
  ``latency_ms_avg``: the steps run at contexts from the prompt's end to ``seq_len``, and
  the mean of a step time linear in the context is its value at the mean context.

The report's ``throughput`` is runs x max_length x max_batch_size / total time, so
``throughput * latency_ms_avg / 1000`` recovers seq_len x batch: a run whose settings do not
give that product (1 % tolerance) is refused, naming the file -- the settings are for
another run.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from model.base.errors import InputError
from model.calibration.json_text import finite_number, key_line, load_object
from model.calibration.measurements import MAX_INT, MAX_MS, MIN_MS, Measurements
from model.load.files import read_text

PREFILL_SECTION = "context_encoding_model"
DECODE_SECTION = "token_generation_model"
OTHER_SECTIONS = ("e2e_model", "speculation_model", "medusa_speculation_model")
CONFIG_FILE = "neuron_config.json"
PREFILL_STAT, DECODE_STAT = "latency_ms_p50", "latency_ms_avg"
THROUGHPUT_TOLERANCE = 0.01


def looks_like_report(data: dict) -> bool:
    """True if a JSON object is an NxD Inference benchmark report (by its section names)."""
    return any(key in data for key in (PREFILL_SECTION, DECODE_SECTION, *OTHER_SECTIONS)) and all(
        isinstance(value, dict) and any(str(k).startswith("latency_ms_") for k in value) for value in data.values())


@dataclass(frozen=True)
class RunSettings:
    """The batch and lengths of one benchmark run, and where they were read."""

    batch_size: int
    ctx_batch_size: int
    tkg_batch_size: int
    max_context_length: int
    seq_len: int
    origin: str  # the neuron_config.json read, or "flags"


def _count(value: object, source: str, line: int | None, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_INT:
        raise InputError(source, line, field, f"must be a positive integer up to {MAX_INT}, got {value!r}")
    return value


def settings_from_config(path: Path) -> RunSettings:
    """Run settings from a ``neuron_config.json`` (its ``neuron_config`` object, or the top level)."""
    src = str(path)
    text = read_text(path, folder=f"is a directory, expected NxD Inference's {CONFIG_FILE}")
    data = load_object(text, src)
    config = data.get("neuron_config", data)
    if not isinstance(config, dict):
        raise InputError(src, key_line(text, ("neuron_config",)), "neuron_config", "expected an object")

    def get(key: str, default: int | None = None) -> int:
        if config.get(key) is None:
            if default is None:
                raise InputError(src, None, key, f"missing: the run's {key} is needed to place the benchmark's "
                                 "latencies")
            return default
        return _count(config[key], src, key_line(text, (key,)), key)

    batch = get("batch_size")
    seq_len = get("seq_len")
    context = get("max_context_length", seq_len)
    if context > seq_len:
        raise InputError(src, key_line(text, ("max_context_length",)), "max_context_length",
                         f"is {context}, above seq_len {seq_len}")
    return RunSettings(batch, get("ctx_batch_size", batch), get("tkg_batch_size", batch), context, seq_len, src)


def settings_from_flags(batch_size: int | None, context_length: int | None, seq_len: int | None,
                        report: str) -> RunSettings:
    """Run settings from ``--batch-size``, ``--context-length`` and ``--seq-len`` (no config beside the report)."""
    missing = [flag for flag, value in (("--batch-size", batch_size), ("--seq-len", seq_len)) if value is None]
    if missing:
        raise InputError(report, None, None, f"the report does not say its batch size and lengths: put the "
                         f"compiled model's {CONFIG_FILE} beside it, or give {' and '.join(missing)}"
                         f"{'' if context_length is not None else ' (and --context-length, default seq-len)'}")
    assert batch_size is not None and seq_len is not None
    context = seq_len if context_length is None else context_length
    if context > seq_len:
        raise InputError("--context-length", None, None, f"is {context}, above --seq-len {seq_len}")
    return RunSettings(batch_size, batch_size, batch_size, context, seq_len, "flags")


def _latency(section: dict, key: str, text: str, source: str, name: str) -> tuple[float, int | None]:
    line = key_line(text, (name, key))
    value = finite_number(section.get(key))
    if key not in section:
        raise InputError(source, key_line(text, (name,)), f"{name}.{key}", "missing")
    if value is None or not MIN_MS <= value <= MAX_MS:
        raise InputError(source, line, f"{name}.{key}", f"must be a time in ms from {MIN_MS:g} to {MAX_MS:g}, "
                         f"got {section.get(key)!r}")
    return value, line


def _check_throughput(section: dict, text: str, source: str, name: str, settings: RunSettings) -> None:
    """throughput x mean latency = seq_len x batch in NxD Inference's report: the settings must agree."""
    if "throughput" not in section:
        return
    line = key_line(text, (name, "throughput"))
    throughput = finite_number(section["throughput"])
    if throughput is None or throughput <= 0:
        raise InputError(source, line, f"{name}.throughput", f"must be a positive number, got "
                         f"{section['throughput']!r}")
    mean_ms, _ = _latency(section, DECODE_STAT, text, source, name)
    implied = throughput * mean_ms / 1000.0
    expected = settings.seq_len * max(settings.batch_size, settings.ctx_batch_size, settings.tkg_batch_size)
    if abs(implied / expected - 1.0) > THROUGHPUT_TOLERANCE:
        raise InputError(source, line, f"{name}.throughput",
                         f"x latency_ms_avg gives seq_len x batch = {implied:.6g}, but the run settings "
                         f"({settings.origin}) give {settings.seq_len} x {expected // settings.seq_len} = "
                         f"{expected}: are they this run's?")


def report_rows(path: Path, text: str, data: dict, settings: RunSettings
                ) -> list[tuple[str, int, int, float, float, int]]:
    """The prefill and decode rows of one report (phase, batch, length, ms, weight, line)."""
    src = str(path)
    rows = []
    for name, phase in ((PREFILL_SECTION, "prefill"), (DECODE_SECTION, "decode")):
        if name not in data:
            continue
        section = data[name]
        _check_throughput(section, text, src, name, settings)
        if phase == "prefill":
            ms, line = _latency(section, PREFILL_STAT, text, src, name)
            rows.append(("prefill", settings.ctx_batch_size, settings.max_context_length, ms, 1.0, line or 1))
        else:
            ms, line = _latency(section, DECODE_STAT, text, src, name)
            context = (settings.max_context_length + settings.seq_len + 1) // 2
            rows.append(("decode", settings.tkg_batch_size, context, ms, 1.0, line or 1))
    if not rows:
        raise InputError(src, 1, None, f"holds only {', '.join(sorted(data))}: no {PREFILL_SECTION} or "
                         f"{DECODE_SECTION} step times (benchmark with the sub-model latencies, target all)")
    return rows


def read_reports(paths: list[Path], texts: list[str], datas: list[dict], flags: tuple[int | None, ...],
                 source: str) -> Measurements:
    """Rows of several benchmark reports, each placed by the neuron_config.json beside it or by the flags."""
    rows: list[tuple[str, int, int, float, float, int]] = []
    for path, text, data in zip(paths, texts, datas, strict=True):
        config = path.parent / CONFIG_FILE
        settings = settings_from_config(config) if config.is_file() else settings_from_flags(*flags, str(path))
        rows += report_rows(path, text, data, settings)
    phase, n, s, ms, w, line = zip(*rows, strict=True)
    return Measurements(source, np.array(phase, dtype=object), np.array(n, dtype=np.int64),
                        np.array(s, dtype=np.int64), np.array(ms, dtype=np.float64),
                        np.array(w, dtype=np.float64), np.array(line, dtype=np.int64))
