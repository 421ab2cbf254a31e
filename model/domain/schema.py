"""Frozen records that flow through the pipeline: load -> histogram -> model -> solve -> expand -> evaluate."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from model.cost.metrics import Metrics
from model.cost.model import CostModel, ReferenceCost
from solvers.backends.result import Status

# A --max-warmup-s budget worth this many graphs or more caps nothing (2**52: float64 counts exactly below it)
WARMUP_CAP_MOST = 1 << 52


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
    arrival_s: np.ndarray | None = None  # float64 arrival time in seconds, when the input has a time column

    def __len__(self) -> int:
        return int(self.prompt_len.shape[0])


# The one map between a limited metric and its limit's field name (scenario keys, flags, tables).
LIMIT_FIELDS: dict[str, str] = {
    "cost": "max_cost",
    "pad_ratio": "max_pad_ratio",
    "p95_latency_ms": "max_p95_latency_ms",
    "sequential_ms": "max_sequential_ms",
}
LIMIT_KEYS: tuple[str, ...] = tuple(LIMIT_FIELDS.values())


@dataclass(frozen=True)
class Limits:
    """Per-bucket limits, all "<=", each optional (None = unconstrained).

    Owns the naming: a metric (``cost``) is limited by the field ``max_cost``; every
    module that maps one to the other goes through ``field_of`` / ``metric_of``.
    """

    max_cost: float | None = None
    max_pad_ratio: float | None = None
    max_p95_latency_ms: float | None = None
    max_sequential_ms: float | None = None

    @staticmethod
    def field_of(metric: str) -> str:
        """The limit field that bounds a metric (``cost`` -> ``max_cost``)."""
        return LIMIT_FIELDS[metric]

    @staticmethod
    def metric_of(field_name: str) -> str:
        """The metric a limit field bounds (``max_cost`` -> ``cost``)."""
        return next(m for m, f in LIMIT_FIELDS.items() if f == field_name)

    @classmethod
    def of_metrics(cls, values: dict[str, float]) -> Limits:
        """Limits given by metric name ({"cost": 1e9} -> Limits(max_cost=1e9))."""
        return cls(**{LIMIT_FIELDS[m]: v for m, v in values.items()})

    def get(self, metric: str) -> float | None:
        """The limit on a metric, or None."""
        return getattr(self, LIMIT_FIELDS[metric])

    def with_limit(self, metric: str, value: float | None) -> Limits:
        """The same limits with one metric's limit replaced."""
        return replace(self, **{LIMIT_FIELDS[metric]: value})

    def items(self) -> list[tuple[str, float]]:
        """The limits that are set, as (metric name, bound) pairs."""
        return [(m, getattr(self, f)) for m, f in LIMIT_FIELDS.items() if getattr(self, f) is not None]

    def overridden_by(self, flags: Limits) -> Limits:
        """These limits with every limit that ``flags`` sets replaced by the flag's value."""
        return replace(self, **{f: getattr(flags, f) for f in LIMIT_FIELDS.values() if getattr(flags, f) is not None})


@dataclass(frozen=True)
class Windowing:
    """Arrival windows: requests are batched only with requests of the same window.

    Window k of a request arriving at t (seconds) is ``floor((t - origin_s) / seconds)``;
    ``origin_s`` is the earliest arrival over every bucket, so windows line up across
    buckets (and a sub-problem of some windows keeps the same numbering).  The rules
    that follow from it (window index, wait to the window's end) live in
    ``model.cost.metrics``.
    """

    seconds: float
    origin_s: float


@dataclass(frozen=True, eq=False)
class Problem:
    """Everything a planner needs: the buckets, their limits and the global settings."""

    buckets: tuple[Bucket, ...]
    limits: tuple[Limits, ...]
    max_shapes: int = 8
    cost: CostModel = ReferenceCost()  # the one cost model every stage asks (model.cost.model)
    max_batch_size: int | None = None
    max_seq_len: int | None = None
    # the only shapes a plan may declare (sorted positive multiples of 64), None = free choice;
    # the shape cap K still applies, so a plan uses at most K of them
    allowed_shapes: tuple[int, ...] | None = None
    # arrival windows (None: one offline batch pool); every bucket then has arrival_s
    windowing: Windowing | None = None
    # caps on what the plans compile across all buckets (with batch buckets): distinct graphs, warm-up seconds
    max_graphs: int | None = None
    max_warmup_s: float | None = None
    # ``--batch-buckets auto``: the planner chooses the batch buckets; ``cost`` then prices graphs over the
    # candidate buckets (``model.planning.bucket_choice``) and a plan is judged under the ones it uses
    choose_buckets: bool = False

    def with_shapes(self, k: int) -> Problem:
        """The same problem under another shape cap (sweeps reuse loaded buckets)."""
        return replace(self, max_shapes=k)

    @property
    def graph_cap(self) -> int | None:
        """The most distinct graphs the plans may run across all buckets (None: no cap): ``max_graphs``, and
        the most whose warm-up (the cost model's compile time each) fits ``max_warmup_s``."""
        caps = [] if self.max_graphs is None else [self.max_graphs]
        if self.max_warmup_s is not None and self.cost.spike_ms > 0:
            budget = self.max_warmup_s * 1000.0
            n = budget // self.cost.spike_ms
            if not n < WARMUP_CAP_MOST:  # float(n + 1) == float(n) up there (the loop below never ended); inf // x: nan
                caps.append(WARMUP_CAP_MOST)  # more graphs than any plan can run (--limit-graphs takes <= 2**45)
                return min(caps)
            n = int(n)
            while n > 0 and self.cost.warmup_ms(n) > budget:  # the judge's own product decides, not the division
                n -= 1
            while self.cost.warmup_ms(n + 1) <= budget:
                n += 1
            caps.append(n)
        return min(caps) if caps else None


@dataclass(frozen=True, eq=False)
class Batching:
    """A planner's answer for one bucket before ids are chosen.

    ``batch_of[i]`` is the batch index of request i (file order); ``shape_of[b]`` is
    the declared seq_align of batch b.  Batch indices are 0..nb-1, each non-empty.
    """

    batch_of: np.ndarray
    shape_of: np.ndarray


@dataclass(frozen=True, eq=False)
class CellRuns:
    """A planner's answer for one bucket by cells, before any request is named: run r puts ``count[r]``
    requests of histogram cell ``cell[r]`` into batch ``batch[r]``; ``shape_of[b]`` is batch b's declared
    seq_align.  Runs are sorted by (cell, batch): a cell's requests, taken in file order, fill its runs in
    that order (``model.planning.cell_runs.batching_of_runs``).  Its size grows with cells and batches, never with
    requests, so it is what a plan of 10^8 requests is made of before the partitions are written.
    """

    cell: np.ndarray
    batch: np.ndarray
    count: np.ndarray
    shape_of: np.ndarray

    @property
    def n_batches(self) -> int:
        return int(self.shape_of.shape[0])


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
    cost: CostModel = ReferenceCost()
    max_seq_len: int | None = None
    max_batch_size: int | None = None

    def problem(self, **overrides) -> Problem:
        """The planning problem this scenario describes, with CLI overrides applied (None = keep)."""
        kw = dict(buckets=self.buckets, limits=self.limits, max_shapes=self.max_shapes,
                  cost=self.cost, max_batch_size=self.max_batch_size,
                  max_seq_len=self.max_seq_len)
        kw.update({k: v for k, v in overrides.items() if v is not None})
        return Problem(**kw)


# "optimal" only at gap 0: this tolerance absorbs float rounding between a plan's exact cost and its bound,
# never a solver's relative MIP gap
OPTIMAL_GAP = 1e-9


def relative_gap(cost: float, bound: float) -> float:
    """``SolveReport.gap``: (cost - bound) / cost, 0 for a plan that costs nothing."""
    return (cost - bound) / cost if cost > 0 else 0.0


@dataclass(frozen=True)
class SolveReport:
    """What a planner says about its run, read from the solver's API (never its log).

    ``bound`` is a valid lower bound on the optimal total cost over all buckets (None
    for heuristics); ``gap`` = (objective - bound) / objective.
    """

    status: Status  # tables show status.value
    objective: float | None
    bound: float | None
    gap: float | None
    time_s: float
    backend: str
    version: str
    bucket_bounds: tuple[float, ...] | None = None
    notes: tuple[str, ...] = ()
    # how the run went, kept apart from ``status`` (what is proven about the plan): which method found the plan,
    # which gave the bound, why the run ended and whether more time could help ("" where a planner says nothing)
    plan_by: str = ""
    bound_by: str = ""
    termination: str = ""
    more_time: str = ""
    # device mode: a certified lower bound on every plan that compiles the same shapes in every bucket (None: not
    # priced), so (objective - on_shapes) / objective bounds what better batching on the plan's shapes could save
    # (where it is above ``bound``: else the bound, which holds for those plans too, says more)
    on_shapes: float | None = None


@dataclass(frozen=True)
class Violation:
    """One broken rule, with enough detail to find it."""

    bucket: str
    rule: str
    message: str

    def __str__(self) -> str:
        return f"{self.bucket}: {self.rule}: {self.message}"


@dataclass(frozen=True)
class LimitCheck:
    """A metric against its limit; margin > 0 means room to spare, < 0 means broken."""

    metric: str
    value: float
    limit: float

    @property
    def margin(self) -> float:
        return self.limit - self.value

    @property
    def ok(self) -> bool:
        return self.value <= self.limit


@dataclass(frozen=True)
class BucketResult:
    """A validated and evaluated plan of one bucket."""

    name: str
    metrics: Metrics | None
    checks: tuple[LimitCheck, ...]
    violations: tuple[Violation, ...]

    @property
    def ok(self) -> bool:
        return not self.violations and all(c.ok for c in self.checks)


@dataclass(frozen=True, eq=False)
class Evaluation:
    """Every bucket's plan validated and judged, plus the rules that span buckets (the joint shape cap)."""

    results: tuple[BucketResult, ...]
    global_problems: tuple[Violation, ...]

    @property
    def ok(self) -> bool:
        """Every plan valid and within its limits, and the joint rules held."""
        return not self.global_problems and all(r.ok for r in self.results)

    @property
    def total_cost(self) -> float | None:
        """Sum of bucket costs, or None when some bucket has no evaluated plan."""
        if any(r.metrics is None for r in self.results):
            return None
        return sum(r.metrics.cost for r in self.results)


@dataclass(frozen=True, eq=False)
class Planned:
    """A planner's output: one batching per bucket plus its report.

    A planner that already expanded and judged its answer (the MIP does, to choose
    among candidates) hands over ``plans`` and ``evaluation`` so nothing is built twice.
    """

    batchings: tuple[Batching, ...]
    report: SolveReport
    plans: tuple[Plan, ...] | None = None
    evaluation: Evaluation | None = None
    # with ``Problem.choose_buckets``: the batch buckets the planner chose, under which plans and evaluation hold
    chosen_buckets: tuple[int, ...] | None = None


@dataclass(frozen=True, eq=False)
class RunsJudged:
    """One bucket's runs judged: the result, and per batch the run that leads it and whether it takes its shape's
    compile spike (the first request of that run goes first in the batch)."""

    result: BucketResult
    lead: np.ndarray
    takes: np.ndarray
