"""What every cost mode answers, and the plan rules they share: the ``CostModel`` protocol.

A problem carries one ``CostModel`` (``model.cost.model`` builds it); the planner, the
expansion, the packers and the evaluator ask it, so no module outside ``model.cost``
tests a mode by name or by type.  ``PlanRules`` binds the plan arithmetic of
``model.cost.metrics`` (held there once, for every mode) to one model's coefficients;
``AtDeclaredShape`` is what strict and device mode share.

Size classes.  Where a batch's time depends on its size (device mode), the planner
models a box (shape t, longest gen g) in a few size classes, each a range of batch
sizes on which the batch time is ``fixed + n * per_member`` (``linear_parts``): the
profile's decode regimes, or with batch buckets one class per bucket (constant time
T(B) on the sizes that bucket holds).  ``size_classes``, ``size_class``,
``regime_range``, ``linear_parts`` and ``box_pad`` are that question and its answers;
``compile_class`` says what a class compiles (nothing of its own where the compile
is per shape, its graph where it is per graph).
"""

from __future__ import annotations

from typing import ClassVar, Protocol

import numpy as np

from model.cost.analytic import CostParams
from model.cost.common import Mode
from model.cost.device import DeviceProfile
from model.cost.metrics import (
    Metrics,
    batch_buckets_of,
    batch_costs,
    batch_kv_tokens,
    batch_latencies,
    compile_keys,
    compiled_batch,
    counted_metrics,
    fastest_latency,
    graphs_of,
    key_shapes,
    latencies_given,
    member_latencies,
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
    compiles_graphs: ClassVar[bool]  # what is compiled (charged, spiked) is the graph (B, s), not the shape
    objective_scale: ClassVar[float]
    slack_penalty: ClassVar[dict[str, float]]

    @property
    def params(self) -> CostParams | DeviceProfile: ...
    @property
    def batch_buckets(self) -> tuple[int, ...] | None: ...
    @property
    def n_compile_classes(self) -> int: ...
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
    def batch_cap(self, s, g, max_batch: int | None) -> np.ndarray: ...
    def batch_kv_tokens(self, batch_ids, gen_len, seq_align) -> tuple[np.ndarray, np.ndarray]: ...
    def graph_batch(self, n) -> np.ndarray: ...
    def compile_keys(self, n_b, batch_shape) -> np.ndarray: ...
    def key_shapes(self, keys) -> np.ndarray: ...
    def graphs_of(self, n_b, batch_shape) -> tuple[tuple[int, int], ...]: ...
    def warmup_ms(self, n_graphs: int) -> float: ...
    def without_compile(self) -> CostModel: ...
    def decode_regimes(self) -> list[bool]: ...
    def size_classes(self) -> list: ...
    def size_class(self, n) -> np.ndarray: ...
    def compile_class(self, cls) -> np.ndarray: ...
    def regime_range(self, t, g, large, max_batch: int | None) -> tuple[np.ndarray, np.ndarray]: ...
    def linear_parts(self, t, g, large) -> tuple[np.ndarray, np.ndarray]: ...
    def run_parts(self, t, g, large) -> tuple[np.ndarray, np.ndarray]: ...
    def box_fixed(self, t, g, large) -> tuple[np.ndarray, np.ndarray]: ...
    def box_unit_cost(self, t, g, large) -> np.ndarray: ...
    def box_unit_seq(self, t, g, large) -> np.ndarray: ...
    def box_pad(self, t, g, large) -> tuple[np.ndarray, np.ndarray]: ...
    def member_latency(self, s_member, t, g) -> np.ndarray: ...
    def prefill_latency(self, S) -> np.ndarray: ...
    def request_floor(self, t, G, max_batch: int | None) -> np.ndarray: ...
    def arc_member_length(self, S, t): ...
    def is_large(self, n) -> np.ndarray: ...
    def prompt_pad(self, S, t) -> np.ndarray: ...
    def constant_cost(self, S, count) -> float: ...


class PlanRules:
    """The plan rules of ``model.cost.metrics`` bound to one model's coefficients (shared by every mode: the
    functions there hold the arithmetic once and take the mode's name)."""

    params: CostParams | DeviceProfile
    name: ClassVar[str]
    compiles_graphs: ClassVar[bool] = False

    @property
    def batch_buckets(self) -> tuple[int, ...] | None:
        """The compiled batch sizes (None: the batch dimension is free, B = n)."""
        return batch_buckets_of(self.params)

    def graph_batch(self, n) -> np.ndarray:
        """The batch dimension a batch of n members runs at (its graph's bucket, or n)."""
        return compiled_batch(n, self.params)

    def compile_keys(self, n_b, batch_shape) -> np.ndarray:
        """Per batch, the unit its compile (charge and spike) is for: its shape, or its graph."""
        return compile_keys(n_b, batch_shape, self.params)

    def key_shapes(self, keys) -> np.ndarray:
        """The declared shape of each compile key."""
        return key_shapes(keys, self.params)

    def graphs_of(self, n_b, batch_shape) -> tuple[tuple[int, int], ...]:
        """The distinct graphs (B, s) a bucket's batches run (with the batch free: one per (size, shape))."""
        return graphs_of(n_b, batch_shape, self.params)

    def warmup_ms(self, n_graphs: int) -> float:
        """What warming up n graphs takes: the compile time of each (compile_ms, or Tshape_compile_ms)."""
        return float(n_graphs) * self.spike_ms

    def batch_kv_tokens(self, batch_ids, gen_len, seq_align) -> tuple[np.ndarray, np.ndarray]:
        """KV tokens each batch of a plan holds at its last step, and the batch ids."""
        return batch_kv_tokens(batch_ids, gen_len, seq_align, self.params)

    def size_classes(self) -> list:
        """The size classes a box comes in: the decode regimes (``decode_regimes``) unless a mode says more."""
        return self.decode_regimes()  # type: ignore[attr-defined]

    def size_class(self, n) -> np.ndarray:
        """The size class a batch of n members belongs to."""
        return self.is_large(n)  # type: ignore[attr-defined]

    @property
    def n_compile_classes(self) -> int:
        """How many compile units one shape splits into: 1 where the compile is per shape."""
        return 1

    def compile_class(self, cls) -> np.ndarray:
        """The compile unit of a size class within its shape: 0 where the compile is per shape."""
        return np.zeros(np.shape(cls), dtype=np.int64)

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


class AtDeclaredShape:
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


