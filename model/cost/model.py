"""The cost model as one object: what every consumer asks of a mode, answered by the mode itself.

A problem carries one ``CostModel``; the planner (box and run pricing, bounds), the
expansion (spike placement), the packers and the evaluator (plan metrics) all ask it,
so no module outside ``model.cost`` tests a mode by name or by type, and each formula
exists once.  The implementations:

- ``ReferenceCost`` (the seed's contract): a member is prefilled at its own aligned
  prompt and decodes at its batch's (S_max, G_max); the declared shape only moves the
  compile cost.
- ``StrictCost``: the declared shape is paid for, prefill and decode at it.
- ``DeviceCost``: measured step times (``model.cost.device``): one time per batch that
  depends on its size, in device milliseconds; the KV cache caps a batch.

Two structural facts decide which planner strategy fits (chosen once, by the planner):
``pads_to_shape`` (every member's prompt is processed at the declared shape) and
``shared_batch_time`` (a batch's members share one time that grows with their number,
so a batch's size, not only its box, sets its price).  Everything else is a method.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar, Protocol

import numpy as np

from model.base.errors import InputError
from model.cost.analytic import CostParams, decode_cost, member_latency, prefill_cost, prefill_latency
from model.cost.common import MODES, Mode, align
from model.cost.device import (
    DeviceProfile,
    batch_time,
    is_large,
    kv_fits,
    kv_tokens,
    linear_parts,
    max_members,
)
from model.cost.metrics import (
    Metrics,
    batch_costs,
    batch_latencies,
    counted_metrics,
    fastest_latency,
    latencies_given,
    member_latencies,
    member_prefill_cost,
    plan_metrics,
    segment_max,
    shape_charge,
    spike_ms,
)

NO_CAP = np.iinfo(np.int64).max // 4  # "no batch-size cap" as an integer that survives arithmetic

# Cost per unit of violation of each limit while columns are generated, in the model's cost unit: far above
# what any decision saves per unit.  Analytic cost: a pad token costs ~1e7 of decode at most, a ms of latency
# ~1e3 of cost, a request over the P95 limit at most one batch ~1e10.  Device ms: a pad token costs well
# under 1 ms, a ms of sequential time is a ms of cost, a member over the P95 limit at most one batch.
ANALYTIC_SLACK_PENALTY = {"cost": 10.0, "pad": 1e9, "seq": 1e6, "p95": 1e12}
DEVICE_SLACK_PENALTY = {"cost": 10.0, "pad": 1e3, "seq": 10.0, "p95": 1e7}


class CostModel(Protocol):
    """What the planner, the expansion, the packers and the evaluator ask of a cost mode."""

    name: ClassVar[str]
    pads_to_shape: ClassVar[bool]
    shared_batch_time: ClassVar[bool]
    device_time: ClassVar[bool]  # costs are device milliseconds (device-hours and money are worth showing)
    objective_scale: ClassVar[float]
    slack_penalty: ClassVar[dict[str, float]]

    @property
    def params(self) -> CostParams | DeviceProfile: ...
    @property
    def spike_ms(self) -> float: ...
    @property
    def kv_capacity(self) -> int | None: ...
    @property
    def batch_floor(self) -> float: ...

    def member_lengths(self, prompt_len: np.ndarray, declared: np.ndarray) -> np.ndarray: ...
    def batch_contexts(self, S: np.ndarray, codes: np.ndarray, shape_of: np.ndarray) -> np.ndarray: ...
    def latencies_given(self, S, codes, n_b, s_max, g_max) -> np.ndarray: ...
    def batch_latencies(self, prompt_len, gen_len, codes, shape_of): ...
    def batch_extents(self, prompt_len, gen_len, batch_of, shape_of) -> tuple[np.ndarray, np.ndarray, np.ndarray]: ...
    def prefill_total(self, S: np.ndarray, weight: np.ndarray | None = None) -> float | None: ...
    def batch_costs(self, n_b, batch_shape, s_max, g_max, prefill_total) -> tuple[float, float, float, float]: ...
    def shape_charge(self, s) -> np.ndarray: ...
    def fastest_latency(self, S, G) -> np.ndarray: ...
    def plan_metrics(self, prompt_len, gen_len, batch_ids, seq_align, wait_ms=None) -> Metrics: ...
    def member_latencies(self, prompt_len, gen_len, batch_ids, seq_align, wait_ms=None) -> np.ndarray: ...
    def counted_metrics(self, latency, counts, worst, n_b, batch_shape, s_max, g_max, prefill_total, pad,
                        real) -> Metrics: ...
    def member_cost(self, s, g) -> np.ndarray: ...
    def batch_total(self, n, s, g) -> np.ndarray: ...
    def batch_fits(self, n, s, g) -> np.ndarray: ...
    def without_compile(self) -> CostModel: ...
    def decode_regimes(self) -> list[bool]: ...
    def regime_range(self, t, g, large, max_batch: int | None) -> tuple[np.ndarray, np.ndarray]: ...
    def linear_parts(self, t, g, large) -> tuple[np.ndarray, np.ndarray]: ...
    def box_fixed(self, t, g, large) -> tuple[np.ndarray, np.ndarray]: ...
    def box_unit_cost(self, t, g, large) -> np.ndarray: ...
    def box_unit_seq(self, t, g, large) -> np.ndarray: ...
    def member_latency(self, s_member, t, g) -> np.ndarray: ...
    def prefill_latency(self, S) -> np.ndarray: ...
    def request_floor(self, t, G, max_batch: int | None) -> np.ndarray: ...
    def arc_member_length(self, S, t): ...
    def is_large(self, n) -> np.ndarray: ...
    def prompt_pad(self, S, t) -> np.ndarray: ...
    def constant_cost(self, S, count) -> float: ...


class _Rules:
    """The plan rules of ``model.cost.metrics`` bound to one model's coefficients (shared by every mode: the
    functions there hold the arithmetic once and take the mode's name)."""

    params: CostParams | DeviceProfile
    name: ClassVar[str]

    @property
    def mode(self) -> Mode:
        """The mode's name, for the arithmetic functions of ``model.cost`` that take it."""
        return self.name  # type: ignore[return-value]

    @property
    def spike_ms(self) -> float:
        """The compile spike a shape's first member takes (Tshape_compile_ms, or the profile's compile_ms)."""
        return spike_ms(self.params)

    def shape_charge(self, s) -> np.ndarray:
        """What compiling one distinct shape of length s costs a bucket."""
        return shape_charge(s, self.params)

    def fastest_latency(self, S, G) -> np.ndarray:
        """The least latency a request of aligned prompt S and gen G can have."""
        return fastest_latency(S, G, self.params, self.mode)

    def latencies_given(self, S, codes, n_b, s_max, g_max) -> np.ndarray:
        """Each member's latency before any compile spike (``model.cost.metrics.latencies_given``)."""
        return latencies_given(S, codes, n_b, s_max, g_max, self.params, self.mode)

    def batch_latencies(self, prompt_len, gen_len, codes, shape_of):
        """(latency per record, S per record, s_max and g_max per batch) before any spike
        (``model.cost.metrics.batch_latencies``)."""
        return batch_latencies(prompt_len, gen_len, codes, shape_of, self.params, self.mode)

    def batch_extents(self, prompt_len, gen_len, batch_of, shape_of) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per record the length its prompt is processed at, per batch (S_max, G_max)."""
        batch_of = np.asarray(batch_of, dtype=np.int64)
        shape_of = np.asarray(shape_of, dtype=np.int64)
        nb = len(shape_of)
        S = self.member_lengths(prompt_len, shape_of[batch_of])  # type: ignore[attr-defined]
        return S, segment_max(S, batch_of, nb), segment_max(np.asarray(gen_len, dtype=np.int64), batch_of, nb)

    def batch_costs(self, n_b, batch_shape, s_max, g_max, prefill_total) -> tuple[float, float, float, float]:
        """(prefill, decode, overhead, compile) totals from the batches' extents."""
        return batch_costs(n_b, batch_shape, s_max, g_max, prefill_total, self.params, self.mode)

    def plan_metrics(self, prompt_len, gen_len, batch_ids, seq_align, wait_ms=None) -> Metrics:
        """Metrics of one bucket's plan (``model.cost.metrics.plan_metrics``)."""
        return plan_metrics(prompt_len, gen_len, batch_ids, seq_align, self.params, self.mode, wait_ms)

    def member_latencies(self, prompt_len, gen_len, batch_ids, seq_align, wait_ms=None) -> np.ndarray:
        """Each record's latency, compile spike included (``model.cost.metrics.member_latencies``)."""
        return member_latencies(prompt_len, gen_len, batch_ids, seq_align, self.params, self.mode, wait_ms)

    def counted_metrics(self, latency, counts, worst, n_b, batch_shape, s_max, g_max, prefill_total, pad,
                        real) -> Metrics:
        """Metrics from latencies given as counts (``model.cost.metrics.counted_metrics``)."""
        return counted_metrics(latency, counts, worst, n_b, batch_shape, s_max, g_max, prefill_total, pad, real,
                               self.params, self.mode)


class _AtDeclaredShape:
    """What strict and device mode share: every member's prompt is processed, and padded, at its batch's declared
    shape, so nothing is fixed before the shapes are chosen."""

    pads_to_shape: ClassVar[bool] = True

    def member_lengths(self, prompt_len: np.ndarray, declared: np.ndarray) -> np.ndarray:
        """The length each member's prompt is processed (and padded) at: the declared shape."""
        return np.asarray(declared, dtype=np.int64)

    def prompt_pad(self, S, t) -> np.ndarray:
        """Prompt pad per member beyond its own alignment: up to the declared shape."""
        return t - S

    def constant_cost(self, S, count) -> float:
        """Nothing is fixed: a member's prefill is at the shape chosen for it (per batch in device mode)."""
        return 0.0

    def arc_member_length(self, S, t):
        """The length a member in a box of shape t is processed at: t."""
        return t


@dataclass(frozen=True)
class _Analytic(_Rules):
    """What reference and strict mode share: the seed's coefficients, every member priced on its own."""

    params: CostParams = CostParams()

    shared_batch_time: ClassVar[bool] = False
    device_time: ClassVar[bool] = False
    objective_scale: ClassVar[float] = 1e7  # objective divided by this (numerics)
    slack_penalty: ClassVar[dict[str, float]] = ANALYTIC_SLACK_PENALTY

    @property
    def kv_capacity(self) -> int | None:
        """No KV-cache cap in the analytic modes."""
        return None

    @property
    def batch_floor(self) -> float:
        """The least a bucket pays for using a shape at all beyond its members' floors: one batch overhead."""
        return float(self.params.Kbatch_overhead_cost)

    def batch_contexts(self, S: np.ndarray, codes: np.ndarray, shape_of: np.ndarray) -> np.ndarray:
        """Each batch's decode context start: the declared shape (strict) or the longest member (reference)."""
        return shape_of if self.pads_to_shape else segment_max(S, codes, len(shape_of))

    def prefill_total(self, S: np.ndarray, weight: np.ndarray | None = None) -> float | None:
        """The prefill cost of members processed at S (charged per member in the analytic modes)."""
        return member_prefill_cost(S, self.params, weight)

    def member_cost(self, s, g) -> np.ndarray:
        """What one member processed at s with gen g costs on its own: its prefill and its decode."""
        return prefill_cost(s, self.params) + decode_cost(s, g, self.params)

    def batch_total(self, n, s, g) -> np.ndarray:
        """The one batch total: n members all processed at s, longest gen g, plus the batch overhead."""
        return n * self.member_cost(s, g) + self.params.Kbatch_overhead_cost

    def batch_fits(self, n, s, g) -> np.ndarray:
        """Every batch fits: the analytic modes have no KV cap."""
        return np.ones(np.broadcast_shapes(np.shape(n), np.shape(s), np.shape(g)), dtype=bool)

    def without_compile(self) -> CostModel:
        """The same model with compiles free of cost (the windowed planner prices the shared compiles once,
        itself); the spike's latency stays, since Tshape_compile_ms is time, not cost."""
        return replace(self, params=replace(self.params, Kshape_attn=0.0, Kshape_mlp=0.0))

    def decode_regimes(self) -> list[bool]:
        """One decode regime."""
        return [False]

    def is_large(self, n) -> np.ndarray:
        """Never: one decode regime."""
        return np.zeros(np.shape(n), dtype=bool)

    def regime_range(self, t, g, large, max_batch: int | None) -> tuple[np.ndarray, np.ndarray]:
        """Batch sizes [lo, hi] a box may hold: 1 to the batch-size cap."""
        t = np.asarray(t, dtype=np.int64)
        hi = np.full(t.shape, NO_CAP if max_batch is None else max_batch, dtype=np.int64)
        return np.ones(t.shape, dtype=np.int64), hi

    def linear_parts(self, t, g, large) -> tuple[np.ndarray, np.ndarray]:
        """Not defined: an analytic batch's latency is its largest member's, not affine in its size."""
        raise TypeError(f"{self.name} mode has no batch-size-dependent batch time")

    def box_fixed(self, t, g, large) -> tuple[np.ndarray, np.ndarray]:
        """Per batch of box (t, g): the batch overhead, and the batch's largest member latency (the member
        prefilled at t: prefill grows with S)."""
        t = np.asarray(t)
        return np.full(len(t), self.params.Kbatch_overhead_cost), member_latency(t, t, g, self.params)

    def box_unit_seq(self, t, g, large) -> np.ndarray:
        """Sequential time per member: 0 (a batch counts its largest member once, in ``box_fixed``)."""
        return np.zeros(np.broadcast_shapes(np.shape(t), np.shape(g)))

    def member_latency(self, s_member, t, g) -> np.ndarray:
        """Latency (ms, spike excluded) of a member prefilled at s_member in a batch decoding box (t, g)."""
        return member_latency(s_member, t, g, self.params)

    def prefill_latency(self, S) -> np.ndarray:
        """Prefill latency (ms) of one member processed at length S (the part of its latency its own prompt
        sets: members of one reference-mode batch differ by this only)."""
        return prefill_latency(S, self.params)

    def request_floor(self, t, G, max_batch: int | None) -> np.ndarray:
        """A lower bound on what one request of gen G costs at shape t, whatever its batch: its own per-member
        cost in box (t, G) (its batch's overhead is charged apart, ``batch_floor``)."""
        return self.box_unit_cost(t, G, False)


@dataclass(frozen=True)
class ReferenceCost(_Analytic):
    """The seed's contract: a member prefills at its own aligned prompt; the declared shape moves only compile."""

    name: ClassVar[str] = "reference"
    pads_to_shape: ClassVar[bool] = False

    def member_lengths(self, prompt_len: np.ndarray, declared: np.ndarray) -> np.ndarray:
        """The length each member's prompt is processed (and padded) at: its own aligned prompt."""
        return align(np.asarray(prompt_len, dtype=np.int64))

    def box_unit_cost(self, t, g, large) -> np.ndarray:
        """Cost per member of box (t, g): its decode (its prefill is fixed: ``constant_cost``)."""
        return decode_cost(t, g, self.params)

    def prompt_pad(self, S, t) -> np.ndarray:
        """Prompt pad per member beyond its own alignment: none (it prefills at its own S)."""
        return np.zeros(np.broadcast_shapes(np.shape(S), np.shape(t)), dtype=np.int64)

    def constant_cost(self, S, count) -> float:
        """Cost no decision changes: every member's prefill at its own aligned prompt."""
        return float((count * prefill_cost(S, self.params)).sum())

    def arc_member_length(self, S, t):
        """The length a member of aligned prompt S in a box of shape t prefills at: its own."""
        return S


@dataclass(frozen=True)
class StrictCost(_AtDeclaredShape, _Analytic):
    """The declared shape is paid for: prefill and decode at it."""

    name: ClassVar[str] = "strict"

    def box_unit_cost(self, t, g, large) -> np.ndarray:
        """Cost per member of box (t, g): decode plus prefill at the declared shape."""
        return decode_cost(t, g, self.params) + prefill_cost(t, self.params)


@dataclass(frozen=True)
class DeviceCost(_AtDeclaredShape, _Rules):
    """Measured step times: one time per batch, growing with its size, in device milliseconds."""

    params: DeviceProfile

    name: ClassVar[str] = "device"
    shared_batch_time: ClassVar[bool] = True
    device_time: ClassVar[bool] = True
    objective_scale: ClassVar[float] = 1.0
    slack_penalty: ClassVar[dict[str, float]] = DEVICE_SLACK_PENALTY

    @property
    def kv_capacity(self) -> int | None:
        """The profile's KV-cache capacity in tokens (None: no cap)."""
        return self.params.kv_capacity_tokens

    @property
    def batch_floor(self) -> float:
        """0: the per-request floor already spreads a batch's fixed time over its members."""
        return 0.0

    def batch_contexts(self, S: np.ndarray, codes: np.ndarray, shape_of: np.ndarray) -> np.ndarray:
        """Each batch decodes from its declared shape."""
        return shape_of

    def prefill_total(self, S: np.ndarray, weight: np.ndarray | None = None) -> float | None:
        """None: prefill is priced per batch (``batch_costs``), not per member."""
        return None

    def member_cost(self, s, g) -> np.ndarray:
        """Not defined: a member's share depends on its batch's size (``batch_total``)."""
        raise TypeError("device mode prices batches, not members on their own")

    def batch_total(self, n, s, g) -> np.ndarray:
        """The one batch total: the device time T of n members at shape s, longest gen g."""
        return batch_time(n, s, g, self.params)

    def batch_fits(self, n, s, g) -> np.ndarray:
        """True where the batch's KV cache fits the profile's capacity."""
        return kv_fits(n, s, g, self.params)

    def kv_tokens(self, n, s, g) -> np.ndarray:
        """KV-cache tokens a batch holds at its last step."""
        return kv_tokens(n, s, g)

    def without_compile(self) -> CostModel:
        """The same model with compiles free: compile_ms is both the charge and the spike, so both go."""
        return replace(self, params=replace(self.params, compile_ms=0.0))

    def decode_regimes(self) -> list[bool]:
        """The decode regimes the profile has: small batches, and large ones where it has ``decode_large``."""
        return [False, True] if self.params.decode_large is not None else [False]

    def is_large(self, n) -> np.ndarray:
        """True where a batch of n members runs the ``decode_large`` coefficients."""
        return is_large(n, self.params)

    def regime_range(self, t, g, large, max_batch: int | None) -> tuple[np.ndarray, np.ndarray]:
        """Batch sizes [lo, hi] a box may hold in a decode regime: the regime's own range, the batch-size cap
        and the KV capacity n * (t + g) <= capacity."""
        t = np.asarray(t, dtype=np.int64)
        hi = np.full(t.shape, NO_CAP if max_batch is None else max_batch, dtype=np.int64)
        lo = np.ones(t.shape, dtype=np.int64)
        kv = max_members(t, g, self.params)
        if kv is not None:
            hi = np.minimum(hi, kv)
        switch = self.params.decode_large_from
        if switch is not None:
            hi = np.where(large, hi, np.minimum(hi, switch - 1))
            lo = np.where(large, switch, lo)
        return lo, hi

    def linear_parts(self, t, g, large) -> tuple[np.ndarray, np.ndarray]:
        """(fixed, per_member) with ``T = fixed + n * per_member`` within the regime ``large``."""
        return linear_parts(t, g, large, self.params)

    def box_fixed(self, t, g, large) -> tuple[np.ndarray, np.ndarray]:
        """Per batch of box (t, g, regime): T's per-batch part F, which is both its fixed cost and its fixed
        part of sequential time (a batch's time is its cost and its sequential-time contribution)."""
        fixed, _ = linear_parts(t, g, large, self.params)
        return fixed, fixed

    def box_unit_cost(self, t, g, large) -> np.ndarray:
        """Cost per member of box (t, g, regime): T's per-member part."""
        return linear_parts(t, g, large, self.params)[1]

    def box_unit_seq(self, t, g, large) -> np.ndarray:
        """Sequential time per member: T's per-member part (a batch counts its whole time)."""
        return self.box_unit_cost(t, g, large)

    def member_latency(self, s_member, t, g) -> np.ndarray:
        """Not defined: a member's latency is its batch's time, which depends on the batch's size."""
        raise TypeError("device mode: a member's latency depends on its batch's size")

    def prefill_latency(self, S) -> np.ndarray:
        """Not defined: prefill runs once for the whole batch (``batch_total``)."""
        raise TypeError("device mode: prefill is timed per batch, not per member")


    def request_floor(self, t, G, max_batch: int | None) -> np.ndarray:
        """A lower bound on what one request of gen G costs at shape t, whatever its batch: the cheapest decode
        regime's per-member part plus the batch's fixed part shared by as many members as the box can hold --
        a batch decodes at least G steps, F and u grow with the batch's gen and the KV cap shrinks with it, so
        no batch does better."""
        t = np.broadcast_to(np.asarray(t, dtype=np.int64), np.shape(G))
        best = np.full(np.shape(G), np.inf)
        for large in self.decode_regimes():
            mask = np.full(np.shape(G), large)
            lo, hi = self.regime_range(t, G, mask, max_batch)
            fixed, per = linear_parts(t, G, mask, self.params)
            share = per + fixed / np.maximum(np.minimum(hi, 1 << 40), 1)
            best = np.where(lo <= hi, np.minimum(best, share), best)
        return best


def cost_model(mode: Mode, params: CostParams | DeviceProfile | None = None) -> CostModel:
    """The cost model of a mode named on a command line or in a scenario (the one place a name becomes a
    model); ``params`` defaults to the reference coefficients in the analytic modes."""
    if mode not in MODES:
        raise ValueError(f"unknown cost mode {mode!r}")
    if mode == "device":
        if not isinstance(params, DeviceProfile):
            raise ValueError(f"cost mode 'device' needs a DeviceProfile, got {type(params).__name__}")
        return DeviceCost(params)
    if params is not None and not isinstance(params, CostParams):
        raise ValueError(f"cost mode {mode!r} needs CostParams, got {type(params).__name__}")
    return (ReferenceCost if mode == "reference" else StrictCost)(params or CostParams())


def is_analytic_params(params: object) -> bool:
    """True for the analytic modes' coefficients (what ``--cost-params`` and ``[cost_model]`` give)."""
    return isinstance(params, CostParams)


def flag_coefficients(mode: str | None, params: CostParams | None, device: DeviceProfile | None
                      ) -> tuple[str | None, CostParams | DeviceProfile | None]:
    """The mode and coefficients the flags ask for (None: keep the scenario's or the default).

    A device profile selects device mode; beside ``--cost-model reference|strict`` or
    ``--cost-params`` it is a contradiction, and so are cost params in device mode.
    """
    if device is not None:
        if mode not in (None, "device"):
            raise InputError("--device-profile", None, None,
                             f"a device profile prices plans in device mode, not --cost-model {mode}")
        if params is not None:
            raise InputError("--cost-params", None, None, "cost params do not apply in device mode")
        return "device", device
    if mode == "device" and params is not None:
        raise InputError("--cost-params", None, None, "cost params do not apply in device mode")
    return mode, params


def cost_from_flags(mode: str | None, params: CostParams | DeviceProfile | None,
                    base: CostModel | None = None) -> CostModel:
    """The cost model of ``flag_coefficients``' answer, over a scenario's model ``base`` (None: no scenario,
    so the default is reference mode with the seed's coefficients)."""
    if base is None:
        if mode == "device" and params is None:
            raise InputError("--cost-model", None, None, "--cost-model device needs --device-profile FILE.toml")
        return cost_model(mode or "reference", params)
    if mode is not None and params is None and (mode == "device") != (base.name == "device"):
        raise InputError("--cost-model", None, None,
                         "--cost-model device needs --device-profile FILE.toml" if mode == "device" else
                         f"the scenario prices plans in device mode; --cost-model {mode} needs --cost-params "
                         "or no scenario device profile")
    mode, params = mode or base.name, params if params is not None else base.params
    if (mode == "device") != isinstance(params, DeviceProfile):
        raise InputError("--cost-params", None, None, "cost params do not apply in device mode")
    return cost_model(mode, params)


def needs_profile(mode: str) -> bool:
    """Whether a mode named in a scenario or on a command line prices with a measured device profile."""
    return mode == DeviceCost.name
