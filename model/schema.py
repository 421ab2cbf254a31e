"""Frozen records that flow through the pipeline: load -> histogram -> model -> solve -> expand -> evaluate -> report."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from model.cost.analytic import CostParams
from model.cost.common import Mode


@dataclass(frozen=True, eq=False)
class Bucket:
    """One request file: ids and lengths as parallel arrays, in file order.

    ``lines`` holds each request's line (or row) number in its source, so every later
    error can still point at the line a user must fix.
    """

    name: str
    source: str
    request_ids: np.ndarray  # str objects
    prompt_len: np.ndarray  # int64, >= 1
    gen_len: np.ndarray  # int64, >= 1
    lines: np.ndarray  # int64 line numbers in the source

    def __len__(self) -> int:
        return int(self.prompt_len.shape[0])


@dataclass(frozen=True)
class Limits:
    """Per-bucket limits, all "<=", each optional (None = unconstrained)."""

    max_cost: float | None = None
    max_pad_ratio: float | None = None
    max_p95_latency_ms: float | None = None
    max_sequential_ms: float | None = None

    def items(self) -> list[tuple[str, float]]:
        """The limits that are set, as (metric name, bound) pairs."""
        pairs = [
            ("cost", self.max_cost),
            ("pad_ratio", self.max_pad_ratio),
            ("p95_latency_ms", self.max_p95_latency_ms),
            ("sequential_ms", self.max_sequential_ms),
        ]
        return [(k, v) for k, v in pairs if v is not None]


@dataclass(frozen=True, eq=False)
class Problem:
    """Everything a planner needs: the buckets, their limits and the global settings."""

    buckets: tuple[Bucket, ...]
    limits: tuple[Limits, ...]
    max_shapes: int = 8
    params: CostParams = field(default_factory=CostParams)
    mode: Mode = "reference"
    max_batch_size: int | None = None
    max_seq_len: int | None = None

    def with_shapes(self, k: int) -> "Problem":
        """The same problem under another shape cap (sweeps reuse loaded buckets)."""
        return Problem(self.buckets, self.limits, k, self.params, self.mode,
                       self.max_batch_size, self.max_seq_len)


@dataclass(frozen=True, eq=False)
class Batching:
    """A planner's answer for one bucket before ids are chosen.

    ``batch_of[i]`` is the batch index of request i (file order); ``shape_of[b]`` is
    the declared seq_align of batch b.  Batch indices are 0..nb-1, each non-empty.
    """

    batch_of: np.ndarray
    shape_of: np.ndarray


@dataclass(frozen=True, eq=False)
class Plan:
    """One bucket's plan as written to disk, in plan-file order."""

    request_ids: np.ndarray
    batch_ids: np.ndarray
    seq_align: np.ndarray
    source: str = "<plan>"
    lines: np.ndarray | None = None
    rows: np.ndarray | None = None  # bucket row of each record, when the plan was built in memory

    def __len__(self) -> int:
        return int(self.seq_align.shape[0])


@dataclass(frozen=True, eq=False)
class Scenario:
    """A parsed scenario.toml: buckets with their limits and the shared shape cap."""

    path: Path
    max_shapes: int
    names: tuple[str, ...]
    buckets: tuple[Bucket, ...]
    limits: tuple[Limits, ...]
    params: CostParams = field(default_factory=CostParams)
    mode: Mode = "reference"
    max_seq_len: int | None = None
    max_batch_size: int | None = None

    def problem(self, **overrides) -> Problem:
        """The planning problem this scenario describes, with CLI overrides applied."""
        kw = dict(buckets=self.buckets, limits=self.limits, max_shapes=self.max_shapes,
                  params=self.params, mode=self.mode, max_batch_size=self.max_batch_size,
                  max_seq_len=self.max_seq_len)
        kw.update({k: v for k, v in overrides.items() if v is not None})
        return Problem(**kw)


@dataclass(frozen=True)
class SolveReport:
    """What a planner says about its run, read from the solver's API (never its log).

    ``bound`` is a valid lower bound on the optimal total cost over all buckets (None
    for heuristics); ``gap`` = (objective - bound) / objective.
    """

    status: str  # "optimal" | "feasible" | "time_limit" | "heuristic" | "infeasible"
    objective: float | None
    bound: float | None
    gap: float | None
    time_s: float
    backend: str
    version: str
    bucket_bounds: tuple[float, ...] | None = None
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, eq=False)
class Planned:
    """A planner's output: one batching per bucket plus its report."""

    batchings: tuple[Batching, ...]
    report: SolveReport
