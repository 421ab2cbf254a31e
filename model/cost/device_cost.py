"""Device mode as cost models: measured step times (``DeviceCost``) and compiled batch sizes (``GraphCost``).

``DeviceCost`` prices a batch of n members at shape s by the profile's step times
(``model.cost.device``): T is affine in n within each decode regime, the KV cache caps
n, and the compile is per shape.

``GraphCost`` is device mode on a stack that compiles the batch dimension too
(``shared/cost_model.md``, "Compiled batch sizes (graphs) in device mode"): a batch of
n members runs in graph (B, s), B the smallest of the profile's ``batch_buckets`` >= n,
so its time is T(B) whatever n <= B is, its KV cache holds B rows, and the compile is
per distinct graph.  For the planner each bucket is one size class: the sizes
(B_{i-1}, B_i] at constant time T(B_i) -- affine in n with no per-member part -- so the
same box variants, flows and exact-runs DP model graphs exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

import numpy as np

from model.cost.device import (
    DeviceProfile,
    batch_time,
    graph_batch,
    is_large,
    kv_fits,
    kv_tokens,
    linear_parts,
    max_members,
)
from model.cost.rules import DEVICE_SLACK_PENALTY, NO_CAP, AtDeclaredShape, CostModel, PlanRules


@dataclass(frozen=True)
class DeviceCost(AtDeclaredShape, PlanRules):
    """Measured step times: one time per batch, growing with its size, in device milliseconds."""

    params: DeviceProfile

    name: ClassVar[str] = "device"
    shared_batch_time: ClassVar[bool] = True
    device_time: ClassVar[bool] = True
    objective_scale: ClassVar[float] = 1.0
    slack_penalty: ClassVar[dict[str, float]] = DEVICE_SLACK_PENALTY

    def __post_init__(self) -> None:
        if self.params.batch_buckets is not None and not self.compiles_graphs:
            raise ValueError("a profile with batch_buckets prices graphs: build it with cost_model (GraphCost)")

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

    def batch_cap(self, s, g, max_batch: int | None) -> np.ndarray:
        """Most members a batch at s with longest gen g may hold: n * (s + g) <= capacity, n <= the cap."""
        cap = np.full(np.broadcast_shapes(np.shape(s), np.shape(g)), NO_CAP if max_batch is None else max_batch,
                      dtype=np.int64)
        kv = max_members(s, g, self.params)
        return cap if kv is None else np.minimum(cap, kv)

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

    def run_parts(self, t, g, large) -> tuple[np.ndarray, np.ndarray]:
        """(fixed, per_member) of a batch's cost, which is its device time T (``linear_parts``)."""
        return self.linear_parts(t, g, large)

    def box_fixed(self, t, g, large) -> tuple[np.ndarray, np.ndarray]:
        """Per batch of box (t, g, class): T's per-batch part F, which is both its fixed cost and its fixed
        part of sequential time (a batch's time is its cost and its sequential-time contribution)."""
        fixed, _ = self.linear_parts(t, g, large)
        return fixed, fixed

    def box_unit_cost(self, t, g, large) -> np.ndarray:
        """Cost per member of box (t, g, class): T's per-member part."""
        return self.linear_parts(t, g, large)[1]

    def box_unit_seq(self, t, g, large) -> np.ndarray:
        """Sequential time per member: T's per-member part (a batch counts its whole time)."""
        return self.box_unit_cost(t, g, large)

    def box_pad(self, t, g, large) -> tuple[np.ndarray, np.ndarray]:
        """(per batch, per member) of the tokens a batch of box (t, g, class) holds, padding included: every
        member holds t + g, and no batch pads rows."""
        shape = np.broadcast_shapes(np.shape(t), np.shape(g), np.shape(large))
        return np.zeros(shape), np.broadcast_to(np.asarray(t + g, dtype=np.float64), shape)

    def member_latency(self, s_member, t, g) -> np.ndarray:
        """Not defined: a member's latency is its batch's time, which depends on the batch's size."""
        raise TypeError("device mode: a member's latency depends on its batch's size")

    def prefill_latency(self, S) -> np.ndarray:
        """Not defined: prefill runs once for the whole batch (``batch_total``)."""
        raise TypeError("device mode: prefill is timed per batch, not per member")

    def request_floor(self, t, G, max_batch: int | None) -> np.ndarray:
        """A lower bound on what one request of gen G costs at shape t, whatever its batch: over the size
        classes, the per-member part plus the batch's fixed part shared by as many members as the class holds
        -- a batch decodes at least G steps, F and u grow with the batch's gen and the KV cap shrinks with it,
        so no batch does better."""
        t = np.broadcast_to(np.asarray(t, dtype=np.int64), np.shape(G))
        best = np.full(np.shape(G), np.inf)
        for cls in self.size_classes():
            mask = np.full(np.shape(G), cls)
            lo, hi = self.regime_range(t, G, mask, max_batch)
            fixed, per = self.linear_parts(t, G, mask)
            share = per + fixed / np.maximum(np.minimum(hi, 1 << 40), 1)
            best = np.where(lo <= hi, np.minimum(best, share), best)
        return best


@dataclass(frozen=True)
class GraphCost(DeviceCost):
    """Device mode with compiled batch sizes: a batch of n members runs in graph (B, s), B = the smallest bucket
    >= n; every batch-size term takes B, and the compile (charge and spike) is per distinct graph."""

    compiles_graphs: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if self.params.batch_buckets is None:
            raise ValueError("GraphCost needs a profile with batch_buckets")

    @property
    def sizes(self) -> np.ndarray:
        """The batch buckets as an int64 array (ascending)."""
        return np.asarray(self.params.batch_buckets, dtype=np.int64)

    def batch_total(self, n, s, g) -> np.ndarray:
        """The device time of n members at shape s, longest gen g: T of their graph, B = the smallest bucket >= n."""
        return batch_time(graph_batch(n, self.params.batch_buckets), s, g, self.params)

    def batch_fits(self, n, s, g) -> np.ndarray:
        """True where some bucket holds n members and their graph's KV cache, B * (s + g), fits the capacity."""
        n = np.asarray(n, dtype=np.int64)
        return (n <= self.sizes[-1]) & kv_fits(graph_batch(n, self.params.batch_buckets), s, g, self.params)

    def kv_tokens(self, n, s, g) -> np.ndarray:
        """KV-cache tokens a batch's graph holds at its last step: B rows of s + G_max."""
        return kv_tokens(graph_batch(n, self.params.batch_buckets), s, g)

    def batch_cap(self, s, g, max_batch: int | None) -> np.ndarray:
        """Most members a batch at s with longest gen g may hold: the largest bucket whose graph's KV fits,
        within the batch-size cap (0 where no graph fits)."""
        s, g = np.broadcast_arrays(np.asarray(s, dtype=np.int64), np.asarray(g, dtype=np.int64))
        kv = max_members(s, g, self.params)
        if kv is None:
            top = np.full(s.shape, self.sizes[-1], dtype=np.int64)
        else:
            top = np.where(self.sizes <= kv[..., None], self.sizes, 0).max(axis=-1)
        return top if max_batch is None else np.minimum(top, max_batch)

    def size_classes(self) -> list:
        """One size class per batch bucket (its index)."""
        return list(range(len(self.sizes)))

    def size_class(self, n) -> np.ndarray:
        """The bucket a batch of n members runs in (its index; len(buckets) above the largest)."""
        return np.searchsorted(self.sizes, np.asarray(n, dtype=np.int64), side="left")

    @property
    def n_compile_classes(self) -> int:
        """Every bucket compiles a graph of its own at each shape."""
        return len(self.sizes)

    def compile_class(self, cls) -> np.ndarray:
        """A size class compiles its bucket's graph."""
        return np.asarray(cls, dtype=np.int64)

    def regime_range(self, t, g, large, max_batch: int | None) -> tuple[np.ndarray, np.ndarray]:
        """Batch sizes [lo, hi] of bucket class ``large`` (an index): (B_{i-1}, B_i] within the batch-size cap,
        none where the graph's KV, B_i * (t + g), exceeds the capacity."""
        cls = np.asarray(large, dtype=np.int64)
        t, g, cls = np.broadcast_arrays(np.asarray(t, dtype=np.int64), np.asarray(g, dtype=np.int64), cls)
        size = self.sizes[cls]
        lo = np.where(cls > 0, self.sizes[np.maximum(cls - 1, 0)] + 1, 1)
        hi = size if max_batch is None else np.minimum(size, max_batch)
        hi = np.where(kv_fits(size, t, g, self.params), hi, 0)
        return lo, hi

    def linear_parts(self, t, g, large) -> tuple[np.ndarray, np.ndarray]:
        """(T(B_i, t, g), 0): a graph's time is the same for every member count it holds."""
        cls = np.asarray(large, dtype=np.int64)
        t, g, cls = np.broadcast_arrays(np.asarray(t, dtype=np.int64), np.asarray(g, dtype=np.int64), cls)
        return batch_time(self.sizes[cls], t, g, self.params), np.zeros(t.shape)

    def box_pad(self, t, g, large) -> tuple[np.ndarray, np.ndarray]:
        """(per batch, per member) tokens of a batch of box (t, g, class), padding rows included: the graph
        holds B_i rows of t + g whoever fills them."""
        cls = np.asarray(large, dtype=np.int64)
        t, g, cls = np.broadcast_arrays(np.asarray(t, dtype=np.int64), np.asarray(g, dtype=np.int64), cls)
        return (self.sizes[cls] * (t + g)).astype(np.float64), np.zeros(t.shape)
