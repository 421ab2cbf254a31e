"""scenario.toml: the contract of ``shared/workloads`` (extended, never broken).

Known keys -- top level: ``max_shapes`` (required), optional ``mode``
(reference|strict|device), ``max_seq_len`` (largest shape the accelerator allows),
``max_batch_size``, ``cost_model`` (a table of coefficient overrides, or a path to
a TOML file of them), ``device`` (device mode: a profile TOML path relative to the
scenario, or an inline ``[device]`` table; implies ``mode = "device"``),
``batch_buckets`` (device mode: the compiled batch sizes, replacing the profile's).  Each
``[[bucket]]``: ``name``, ``requests`` (path relative to the scenario), optional limits ``max_cost``, ``max_pad_ratio``,
``max_p95_latency_ms``, ``max_sequential_ms``, and for CSV/Parquet sources
``format``, ``prompt_column``, ``gen_column``, ``id_column`` (or ``columns`` preset).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from model.base.errors import InputError
from model.base.numbers import Where, read_count, read_number
from model.cost.analytic import CostParams
from model.cost.common import GRANULARITY, MODES
from model.cost.device import AUTO_BUCKETS
from model.cost.metrics import Coefficients
from model.cost.model import CostModel, cost_model, needs_profile, with_batch_buckets
from model.domain.schema import Limits, Scenario
from model.load.names import check_name
from model.load.params import cost_params_from_mapping, cost_params_from_toml
from model.load.profile import buckets_value, load_profile, profile_from_table
from model.load.requests import MAX_LEN, PRESETS, Columns, load_requests
from model.load.toml_lines import key_line, read_toml, table_line

TOP_KEYS = {"max_shapes", "mode", "max_seq_len", "max_batch_size", "cost_model", "device", "bucket", "name",
            "description", "batch_buckets"}
LIMIT_KEYS = ("max_cost", "max_pad_ratio", "max_p95_latency_ms", "max_sequential_ms")
# Settings above these are absurd, not generous: a shape is at most the longest request
# (MAX_LEN tokens), so there are at most MAX_LEN / 64 distinct shapes; a batch size beyond
# int32 is rejected before it reaches an array or a solver.
MAX_SEQ_LEN = MAX_LEN
MAX_SHAPES = MAX_LEN // GRANULARITY
MAX_BATCH = 2**31 - 1
BUCKET_KEYS = {"name", "requests", "format", "prompt_column", "gen_column", "id_column", "columns", *LIMIT_KEYS}


def _positive_int(path: str, text: str, key: str, value, most: int) -> int:
    """A top-level count such as max_shapes: an integer from 1 to ``most`` (booleans are not counts)."""
    return read_count(value, Where(path, key_line(text, key), key), 1, most,
                      too_big="must be at most {high}, got {got}")


def load_scenario(path: str | Path, load: bool = True) -> Scenario:
    """Parse a scenario and (by default) load and validate every bucket's requests."""
    path = Path(path)
    text, data = read_toml(path)
    src = str(path)
    for key in data:
        if key not in TOP_KEYS:
            raise InputError(src, key_line(text, key), key, "unknown scenario key")
    if "max_shapes" not in data:
        raise InputError(src, None, "max_shapes", "missing")
    max_shapes = _positive_int(src, text, "max_shapes", data["max_shapes"], MAX_SHAPES)
    mode = data.get("mode", "reference")
    if mode not in MODES:
        raise InputError(src, key_line(text, "mode"), "mode", f"must be one of {', '.join(MODES)}, got {mode!r}")
    max_seq_len = data.get("max_seq_len")
    if max_seq_len is not None:
        max_seq_len = _positive_int(src, text, "max_seq_len", max_seq_len, MAX_SEQ_LEN)
        if max_seq_len % GRANULARITY:
            raise InputError(src, key_line(text, "max_seq_len"), "max_seq_len",
                             f"must be a multiple of {GRANULARITY}, got {max_seq_len}")
    max_batch = data.get("max_batch_size")
    if max_batch is not None:
        max_batch = _positive_int(src, text, "max_batch_size", max_batch, MAX_BATCH)
    params, mode = _coefficients(path, text, data, mode)
    buckets_raw = data.get("bucket")
    if not isinstance(buckets_raw, list) or not buckets_raw or not all(isinstance(b, dict) for b in buckets_raw):
        raise InputError(src, key_line(text, "bucket"), "bucket", "at least one [[bucket]] table is required")
    names, buckets, limits = [], [], []
    for i, raw in enumerate(buckets_raw):
        line = table_line(text, i)
        for key in raw:
            if key not in BUCKET_KEYS:
                raise InputError(src, key_line(text, key, i) or line, f"bucket.{key}", "unknown bucket key")
        for key in ("name", "requests"):
            if not isinstance(raw.get(key), str) or not raw.get(key):
                raise InputError(src, line, f"bucket.{key}", "missing (a non-empty string is required)")
        check_name(raw["name"], src, key_line(text, "name", i) or line, "bucket.name")
        if raw["name"] in names:
            raise InputError(src, line, "bucket.name", f"duplicate bucket name {raw['name']!r}")
        names.append(raw["name"])
        limits.append(_limits(src, text, i, raw))
        if load:
            columns = _columns(src, lambda key, i=i: key_line(text, key, i) or line, raw)
            buckets.append(load_requests(path.parent / raw["requests"], raw["name"], columns, raw.get("format")))
    return Scenario(path=path, max_shapes=max_shapes, names=tuple(names), buckets=tuple(buckets),
                    limits=tuple(limits), cost=_with_buckets(src, text, data, cost_model(mode, params)),
                    max_seq_len=max_seq_len,
                    max_batch_size=max_batch)


def _with_buckets(src: str, text: str, data: dict, cost: CostModel) -> CostModel:
    """The scenario's cost model with its top-level ``batch_buckets`` (device mode only), if it gives them."""
    if "batch_buckets" not in data:
        return cost

    def fail(message: str) -> InputError:
        return InputError(src, key_line(text, "batch_buckets"), "batch_buckets", message)

    buckets = AUTO_BUCKETS if data["batch_buckets"] == AUTO_BUCKETS else buckets_value(data["batch_buckets"], fail)
    try:
        return with_batch_buckets(cost, buckets)
    except ValueError as exc:
        raise fail(str(exc)) from None


def _limits(src: str, text: str, index: int, raw: dict) -> Limits:
    """Limits of the index-th bucket; each must be a finite non-negative number (not NaN, not inf).

    A negative limit can never be met (every metric is >= 0), so it is bad input
    rather than an infeasible problem.
    """
    values = {}
    for key in LIMIT_KEYS:
        if key in raw:
            values[key] = read_number(raw[key], Where(src, key_line(text, key, index) or table_line(text, index),
                                                      f"bucket.{key}"))
    return Limits(**values)


def _columns(src: str, line_of: Callable[[str], int | None], raw: dict) -> Columns | None:
    """Column mapping from ``columns = "azure"`` or explicit ``*_column`` keys (None: auto)."""
    for key in ("format", "columns", "prompt_column", "gen_column", "id_column"):
        if key in raw and (not isinstance(raw[key], str) or not raw[key]):
            raise InputError(src, line_of(key), f"bucket.{key}", f"expected a non-empty string, got {raw[key]!r}")
    if "columns" in raw:
        if raw["columns"] not in PRESETS:
            raise InputError(src, line_of("columns"), "bucket.columns",
                             f"unknown preset {raw['columns']!r} ({', '.join(PRESETS)})")
        return PRESETS[raw["columns"]]
    if not any(k in raw for k in ("prompt_column", "gen_column", "id_column")):
        return None
    base = Columns()
    return Columns(raw.get("prompt_column", base.prompt_len), raw.get("gen_column", base.gen_len),
                   raw.get("id_column"))


def _coefficients(path: Path, text: str, data: dict, mode: str) -> tuple[Coefficients, str]:
    """The coefficients the scenario prices with, and its mode.

    ``device = "FILE.toml"`` (relative to the scenario) or an inline ``[device]``
    table selects device mode; ``mode = "device"`` without one, or a device profile
    beside ``mode = "reference"``/``"strict"`` or a ``cost_model`` table, is a
    contradiction the user must resolve.
    """
    src = str(path)
    spec = data.get("device")
    if spec is None:
        if needs_profile(mode):
            raise InputError(src, key_line(text, "mode"), "mode",
                             'mode = "device" needs a device profile: device = "FILE.toml" or a [device] table')
        return _cost_params(path, text, data.get("cost_model")), mode
    where = key_line(text, "device")
    if "mode" in data and not needs_profile(mode):
        raise InputError(src, where, "device", f'a device profile prices plans in device mode, but mode = "{mode}"')
    if "cost_model" in data:
        raise InputError(src, key_line(text, "cost_model"), "cost_model",
                         "cost_model coefficients do not apply in device mode (the [device] profile prices plans)")
    if isinstance(spec, str):
        if not spec:
            raise InputError(src, where, "device", "must name a device-profile TOML file")
        return load_profile(path.parent / spec), "device"
    if isinstance(spec, dict):
        return profile_from_table(spec, src, text), "device"
    raise InputError(src, where, "device", "must be a path to a profile TOML file or a [device] table")


def _cost_params(path: Path, text: str, spec) -> CostParams:
    """The scenario's ``cost_model``: a path to a TOML file of coefficients, or a table of them."""
    if spec is None:
        return CostParams()
    if isinstance(spec, str):
        return cost_params_from_toml(path.parent / spec)
    if isinstance(spec, dict):
        return cost_params_from_mapping(spec, str(path), lambda key: key_line(text, key, "cost_model")
                                       or key_line(text, "cost_model"), prefix="cost_model.")
    raise InputError(str(path), key_line(text, "cost_model"), "cost_model", "must be a table or a path to a TOML file")
