"""What ``model.calibrate FILE...`` was given, told by each file's content (never by its name).

- a CSV: our measurements (``phase,batch_size,seq_len,ms[,weight]``), or with a column map
  (``--columns``) a per-step timing log with its own column names;
- a JSON object with ``context_encoding_model`` / ``token_generation_model`` sections: an
  NxD Inference ``benchmark_report.json`` (one per run; several make a fit);
- a JSON object model -> tensor-parallel degree -> ``prefill``, ``decoding_smallbs``, ...:
  DistServe's profile, already fitted, so it is taken as the profile (one file, alone).

Measurement files of either kind may be mixed; their rows are fitted together.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from model.base.errors import InputError
from model.calibration import distserve, nxdi_report
from model.calibration.json_text import load_object
from model.calibration.measurements import Measurements, concatenated, parse_measurements
from model.load.files import read_text

FOLDER = "is a directory, expected a measurements CSV, an NxD Inference benchmark_report.json or a DistServe profile"


@dataclass(frozen=True)
class Options:
    """The flags that say how to read the files: column map, NxDI run settings, DistServe's choice."""

    columns: dict[str, str] | None = None
    batch_size: int | None = None
    context_length: int | None = None
    seq_len: int | None = None
    model: str | None = None
    tp: str | None = None


@dataclass(frozen=True)
class Read:
    """Rows to fit, or a DistServe entry taken as the profile (exactly one is set); kinds = one per file."""

    measurements: Measurements | None
    distserve_text: tuple[str, dict, str] | None  # (text, object, source) of the DistServe file
    kinds: tuple[str, ...]


def kind_of(text: str, source: str) -> tuple[str, dict | None]:
    """("csv", None), ("nxdi", obj) or ("distserve", obj): JSON by its first character, then by its keys."""
    if not text.lstrip().startswith("{"):
        return "csv", None
    data = load_object(text, source)
    if nxdi_report.looks_like_report(data):
        return "nxdi", data
    if distserve.looks_like_profile(data):
        return "distserve", data
    keys = ", ".join(list(data)[:6]) or "none"
    hint = (f" (the compiled model's {nxdi_report.CONFIG_FILE}? give the benchmark_report.json beside it: the "
            "config is read from there)" if "neuron_config" in data else "")
    raise InputError(source, 1, None, f"a JSON object that is neither an NxD Inference benchmark report (sections "
                     f"{nxdi_report.PREFILL_SECTION}, {nxdi_report.DECODE_SECTION}) nor a DistServe profile (model "
                     f"-> TP -> prefill, decoding_smallbs, ...); its keys: {keys}{hint}")


def read_inputs(paths: list[Path], options: Options) -> Read:
    """Every file read and told apart; mixing DistServe's profile with anything is refused."""
    texts = [read_text(p, bom=True, folder=FOLDER) for p in paths]
    kinds = [kind_of(t, str(p)) for p, t in zip(paths, texts, strict=True)]
    names = tuple(k for k, _ in kinds)
    source = ", ".join(str(p) for p in paths)
    if "distserve" in names:
        if len(paths) > 1:
            at = names.index("distserve")
            raise InputError(str(paths[at]), None, None, "is a DistServe profile (fitted coefficients): give it "
                             "alone, not with other files")
        return Read(None, (texts[0], kinds[0][1] or {}, str(paths[0])), names)
    for flag, value in (("--model", options.model), ("--tp", options.tp)):
        if value is not None:
            raise InputError(flag, None, None, "chooses in a DistServe profile, and no file given is one")
    if options.columns is not None and "csv" not in names:
        raise InputError("--columns", None, None, "maps a CSV's columns, and no file given is a CSV")
    parts = [parse_measurements(t, str(p), options.columns) for p, t, k in zip(paths, texts, names, strict=True)
             if k == "csv"]
    nxdi = [(p, t, d) for p, t, (k, d) in zip(paths, texts, kinds, strict=True) if k == "nxdi"]
    if nxdi:
        flags = (options.batch_size, options.context_length, options.seq_len)
        parts.append(nxdi_report.read_reports([p for p, _, _ in nxdi], [t for _, t, _ in nxdi],
                                              [d or {} for _, _, d in nxdi], flags, source))
    elif any(v is not None for v in (options.batch_size, options.context_length, options.seq_len)):
        raise InputError("--batch-size", None, None, "--batch-size, --context-length and --seq-len place an NxD "
                         "Inference benchmark report, and no file given is one")
    return Read(concatenated(parts, source), None, names)
