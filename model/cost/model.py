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
- ``GraphCost``: device mode with compiled batch sizes (``batch_buckets``): a batch of n
  members runs in graph (B, s), B the smallest bucket >= n, and the compile is per graph
  (``model.cost.device_cost``).

Two structural facts decide which planner strategy fits (chosen once, by the planner):
``pads_to_shape`` (every member's prompt is processed at the declared shape) and
``shared_batch_time`` (a batch's members share one time that grows with their number,
so a batch's size, not only its box, sets its price).  Everything else is a method.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

import numpy as np

from model.base.errors import InputError
from model.cost.analytic import CostParams, decode_cost, member_latency, prefill_cost, prefill_latency
from model.cost.common import MODES, Mode, align
from model.cost.device import AUTO_BUCKETS, DeviceProfile
from model.cost.device_cost import DeviceCost, GraphCost
from model.cost.metrics import member_prefill_cost, segment_max
from model.cost.rules import (
    ANALYTIC_SLACK_PENALTY,
    DEVICE_SLACK_PENALTY,
    NO_CAP,
    AtDeclaredShape,
    CostModel,
    PlanRules,
)

__all__ = ["ANALYTIC_SLACK_PENALTY", "DEVICE_SLACK_PENALTY", "NO_CAP", "CostModel", "DeviceCost", "GraphCost",
           "ReferenceCost", "StrictCost", "cost_model", "cost_from_flags", "flag_coefficients", "is_analytic_params",
           "needs_profile", "with_batch_buckets"]


@dataclass(frozen=True)
class _Analytic(PlanRules):
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

    def batch_cap(self, s, g, max_batch: int | None) -> np.ndarray:
        """Most members a batch may hold: the batch-size cap (no KV cap in the analytic modes)."""
        return np.full(np.broadcast_shapes(np.shape(s), np.shape(g)), NO_CAP if max_batch is None else max_batch,
                       dtype=np.int64)

    def box_pad(self, t, g, large) -> tuple[np.ndarray, np.ndarray]:
        """Not used: the analytic modes count pad per arc (``model.formulation.boxes.arc_pad``)."""
        raise TypeError(f"{self.name} mode counts pad per member and arc, not per box")

    def without_compile(self) -> CostModel:
        """The same model with compiles free and instant: no compile cost and no compile spike, as in device
        mode (the windowed planner prices the shared compiles once, itself; a window that kept the spike
        charged one per window and shape, where the whole plan takes one per shape and bucket)."""
        return replace(self, params=replace(self.params, Kshape_attn=0.0, Kshape_mlp=0.0, Tshape_compile_ms=0.0))

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

    def run_parts(self, t, g, large) -> tuple[np.ndarray, np.ndarray]:
        """Not defined: a reference-mode batch decodes at its members' longest prompt, not its declared shape,
        so its cost is no function of (declared shape, longest gen, size) alone."""
        raise TypeError("reference mode: a batch's cost depends on its members' own prompts")

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
class StrictCost(AtDeclaredShape, _Analytic):
    """The declared shape is paid for: prefill and decode at it."""

    name: ClassVar[str] = "strict"

    def box_unit_cost(self, t, g, large) -> np.ndarray:
        """Cost per member of box (t, g): decode plus prefill at the declared shape."""
        return decode_cost(t, g, self.params) + prefill_cost(t, self.params)

    def run_parts(self, t, g, large) -> tuple[np.ndarray, np.ndarray]:
        """(fixed, per_member) with a batch's cost = fixed + n * per_member at declared shape t and longest gen g
        (one regime): the batch overhead, and each member's prefill and decode at (t, g).  Broadcasts t, g and
        large, so the windowed planner's runs DP prices a whole matrix of (window, position) at once."""
        per = self.box_unit_cost(t, g, large)
        return np.full(np.shape(per), float(self.params.Kbatch_overhead_cost)), per


def cost_model(mode: Mode, params: CostParams | DeviceProfile | None = None) -> CostModel:
    """The cost model of a mode named on a command line or in a scenario (the one place a name becomes a
    model); ``params`` defaults to the reference coefficients in the analytic modes."""
    if mode not in MODES:
        raise ValueError(f"unknown cost mode {mode!r}")
    if mode == "device":
        if not isinstance(params, DeviceProfile):
            raise ValueError(f"cost mode 'device' needs a DeviceProfile, got {type(params).__name__}")
        return GraphCost(params) if params.batch_buckets is not None else DeviceCost(params)
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


def with_batch_buckets(cost: CostModel, buckets: tuple[int, ...] | str | None) -> CostModel:
    """The same cost model on a stack that compiles these batch sizes (None: keep the model's own; ``"auto"``:
    the planner chooses them, the profile marked ``auto_buckets``).  Only device mode has a batch dimension to
    compile: ValueError in the analytic modes (the caller names where it came from); bad buckets are a
    ValueError too (``model.cost.device.checked_buckets``)."""
    if buckets is None:
        return cost
    if not cost.device_time:
        raise ValueError(f"batch buckets are compiled batch sizes of device mode (a device profile); in {cost.name} "
                         "mode a batch's size is free")
    if buckets == AUTO_BUCKETS:
        return cost_model("device", replace(cost.params, batch_buckets=None, auto_buckets=True))
    return cost_model("device", replace(cost.params, batch_buckets=tuple(buckets), auto_buckets=False))


def needs_profile(mode: str) -> bool:
    """Whether a mode named in a scenario or on a command line prices with a measured device profile."""
    return mode == DeviceCost.name
