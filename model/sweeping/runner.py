"""Capacity-planning sweeps: one loaded problem solved over a grid of shape caps and limit scales.

A person choosing how many shapes to compile needs the whole curve, not one point:
cost against K, every packer beside the MIP, and how the answer moves when a limit
is tightened or relaxed.  This module is the engine behind ``python -m model.sweep``
and ``scripts/bench.py``; it has no I/O beyond the CSV writer and no plotting.

Work is shared between points wherever the planner API allows it:
- the requests are loaded and aggregated once; each point's Problem is the loaded
  one with another shape cap (``Problem.with_shapes``) and scaled limits
  (``dataclasses.replace``), so no point re-reads or re-validates input;
- a MIP plan found at a tighter point (fewer shapes, or a smaller limit factor) is
  valid at every looser point, so each point also re-evaluates the best plans of
  its two tighter neighbours and keeps the cheapest valid one.  This is a warm
  start done from outside the planner: it never makes a row worse, and it repairs
  points where the MIP stopped at its time limit.

Every number comes from ``pipeline.run``, the path ``model.solve`` uses, so a sweep row and a
solve run agree.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

from model import pipeline
from model.base.errors import InfeasibleError, NoPlanFound
from model.base.runtime import RunBudget
from model.domain.schema import Batching, BucketResult, Planned, Problem, SolveReport, Violation
from model.report.compare import failures
from model.report.devices import DeviceUse, device_use
from model.sweeping.grid import SweepPoint, point_problem, tighter_neighbours

MIP = pipeline.MIP


@dataclass(frozen=True, eq=False)
class PlannerOutcome:
    """One planner at one point: its evaluated plans, or why it has none.

    ``batchings`` are kept so a later, looser point can re-evaluate them;
    ``source`` names the point a carried plan came from ("" for the point's own solve).
    """

    planner: str
    status: str
    results: tuple[BucketResult, ...] | None
    global_problems: tuple[Violation, ...]
    report: SolveReport | None
    batchings: tuple[Batching, ...] | None
    message: str
    wall_s: float
    source: str = ""
    devices: DeviceUse | None = None  # windowed device mode: devices needed per window

    @property
    def total_cost(self) -> float | None:
        """Sum of bucket costs, or None when some bucket has no evaluated plan."""
        if self.results is None or any(r.metrics is None for r in self.results):
            return None
        return sum(r.metrics.cost for r in self.results)

    @property
    def limits_met(self) -> bool:
        """Every bucket valid and within its limits, and the cross-bucket shape cap held."""
        return self.results is not None and not self.global_problems and all(r.ok for r in self.results)


@dataclass(frozen=True)
class SweepRow:
    """One CSV row: a point x bucket x planner, tidy (every column one variable).

    ``limit_value`` is this bucket's value of the swept limit at this point; the
    ``max_*`` columns are all of the bucket's limits at this point (empty = not set).
    ``total_*`` columns repeat the planner's totals over all buckets at the point, so
    a reader never has to re-aggregate to compare planners.
    """

    k: int
    sweep_limit: str
    factor: float
    limit_value: float | None
    bucket: str
    planner: str
    status: str
    cost: float | None
    prefill_cost: float | None
    decode_cost: float | None
    overhead_cost: float | None
    compile_cost: float | None
    pad_ratio: float | None
    p95_latency_ms: float | None
    sequential_ms: float | None
    n_batches: int | None
    shapes: str
    max_cost: float | None
    max_pad_ratio: float | None
    max_p95_latency_ms: float | None
    max_sequential_ms: float | None
    limits_met: bool
    broken: str
    bound: float | None
    gap: float | None
    ratio_to_mip: float | None
    total_cost: float | None
    total_bound: float | None
    total_gap: float | None
    total_ratio_to_mip: float | None
    solve_s: float
    wall_s: float
    source: str
    note: str
    window_s: float | None = None  # arrival windows of this many seconds (empty: none)
    peak_devices: int | None = None  # windowed device mode: this bucket's most devices needed in a window
    mean_devices: float | None = None  # and its mean over the windows
    total_peak_devices: int | None = None  # the same with every bucket's work pooled
    total_mean_devices: float | None = None
    n_graphs: int | None = None  # distinct graphs (batch size or bucket, shape) this bucket's plan runs
    warmup_s: float | None = None  # their warm-up: compile time x graphs
    graphs: str = ""  # the graphs, "BxS" each (with the batch free: one per distinct batch size and shape)
    total_graphs: int | None = None  # distinct graphs across all buckets
    total_warmup_s: float | None = None

    @property
    def point(self) -> SweepPoint:
        """The grid point this row belongs to."""
        return SweepPoint(self.factor, self.k, self.sweep_limit)


@dataclass(frozen=True, eq=False)
class SweepResult:
    """All rows of a sweep plus the MIP's batchings per point (for pictures of the chosen plan)."""

    rows: tuple[SweepRow, ...]
    mip_batchings: dict[SweepPoint, tuple[Batching, ...]]


def run_planner(problem: Problem, name: str, backend: str = "highs", time_limit: float = 20.0) -> PlannerOutcome:
    """Plan, expand and evaluate with one planner; no plan becomes an "infeasible" (proven) or "no_plan" outcome."""
    t0 = time.perf_counter()
    try:
        run = pipeline.run(problem, name, backend, time_limit)
    except InfeasibleError as exc:
        return PlannerOutcome(name, "infeasible", None, (), None, None, str(exc), time.perf_counter() - t0)
    except NoPlanFound as exc:
        return PlannerOutcome(name, "no_plan", None, (), None, None, str(exc), time.perf_counter() - t0)
    ev = run.evaluation
    return PlannerOutcome(name, run.planned.report.status.value, ev.results, ev.global_problems, run.planned.report,
                          run.planned.batchings, "", time.perf_counter() - t0,
                          devices=devices_of(problem, run.planned.batchings, name))


def devices_of(problem: Problem, batchings: tuple[Batching, ...], name: str) -> DeviceUse | None:
    """Devices needed per window (windowed device mode only)."""
    if problem.windowing is None or not problem.cost.shared_batch_time:
        return None
    return device_use(problem, batchings, name)


def reevaluate(problem: Problem, carried: PlannerOutcome, source: SweepPoint) -> PlannerOutcome | None:
    """A tighter point's plan judged at this point (re-expanded: spike placement depends on limits)."""
    if carried.batchings is None:
        return None
    t0 = time.perf_counter()
    ev = pipeline.evaluate(problem, pipeline.expand(problem, Planned(carried.batchings, carried.report)))
    return PlannerOutcome(carried.planner, carried.status, ev.results, ev.global_problems, carried.report,
                          carried.batchings, "", time.perf_counter() - t0, source.label(),
                          devices_of(problem, carried.batchings, carried.planner))


def best_outcome(own: PlannerOutcome, candidates: Iterable[PlannerOutcome]) -> PlannerOutcome:
    """The point's own MIP outcome, unless a carried plan meets every limit and is cheaper.

    The carried outcome keeps the point's own report (its bound and status, or
    "carried" when the own solve found nothing), since the bound belongs to this
    point's problem, not to the one the plan came from.
    """
    best = own
    for cand in candidates:
        cost, best_cost = cand.total_cost, best.total_cost
        if not cand.limits_met or cost is None:
            continue
        if best_cost is None or not best.limits_met or cost < best_cost * (1 - 1e-9):
            note = (f"plan carried from {cand.source}: cheaper than this point's own solve"
                    if own.results is not None else f"plan carried from {cand.source}; own solve: {own.message}")
            best = replace(cand, status=own.status if own.results is not None else "carried", report=own.report,
                           wall_s=own.wall_s + cand.wall_s, message=note)
    return best


def gap_of(cost: float | None, bound: float | None) -> float | None:
    """(cost - bound) / cost, the relative distance to a certified lower bound (0 when both are 0)."""
    if cost is None or bound is None:
        return None
    if cost <= 0:  # all-zero cost coefficients: every plan costs 0 and is optimal
        return 0.0 if bound >= cost else None
    return (cost - bound) / cost


def ratio_of(cost: float | None, reference: float | None) -> float | None:
    """cost / reference, or None when either is missing."""
    if cost is None or reference is None or reference <= 0:
        return None
    return cost / reference


def point_rows(point: SweepPoint, problem: Problem, outcomes: Sequence[PlannerOutcome]) -> list[SweepRow]:
    """The CSV rows of one point: per planner, per bucket, ratios against the MIP outcome (if run)."""
    mip = next((o for o in outcomes if o.planner == MIP), None)
    mip_costs = [r.metrics.cost if r.metrics else None for r in mip.results] if mip and mip.results else None
    mip_total = mip.total_cost if mip else None
    rows = []
    for out in outcomes:
        rep = out.report
        total = out.total_cost
        total_bound = rep.bound if rep is not None else None
        all_graphs = None if out.results is None or any(r.metrics is None for r in out.results) else \
            set().union(*(set(r.metrics.graphs) for r in out.results))
        for b, (bucket, limits) in enumerate(zip(problem.buckets, problem.limits, strict=True)):
            res = out.results[b] if out.results is not None else None
            m = res.metrics if res is not None else None
            bound = rep.bucket_bounds[b] if rep is not None and rep.bucket_bounds is not None else None
            broken = failures(res, list(out.global_problems)) if res is not None else []
            rows.append(SweepRow(
                k=point.k, sweep_limit=point.limit, factor=point.factor,
                limit_value=getattr(limits, point.limit) if point.limit else None,
                bucket=bucket.name, planner=out.planner, status=out.status,
                cost=m.cost if m else None, prefill_cost=m.prefill_cost if m else None,
                decode_cost=m.decode_cost if m else None, overhead_cost=m.overhead_cost if m else None,
                compile_cost=m.compile_cost if m else None, pad_ratio=m.pad_ratio if m else None,
                p95_latency_ms=m.p95_latency_ms if m else None, sequential_ms=m.sequential_ms if m else None,
                n_batches=m.n_batches if m else None, shapes=" ".join(map(str, m.shapes)) if m else "",
                max_cost=limits.max_cost, max_pad_ratio=limits.max_pad_ratio,
                max_p95_latency_ms=limits.max_p95_latency_ms, max_sequential_ms=limits.max_sequential_ms,
                limits_met=res is not None and res.ok and not out.global_problems, broken=";".join(broken),
                bound=bound, gap=gap_of(m.cost if m else None, bound),
                ratio_to_mip=ratio_of(m.cost if m else None, mip_costs[b] if mip_costs else None),
                total_cost=total, total_bound=total_bound, total_gap=gap_of(total, total_bound),
                total_ratio_to_mip=ratio_of(total, mip_total),
                solve_s=rep.time_s if rep is not None else out.wall_s, wall_s=out.wall_s,
                source=out.source, note=out.message,
                window_s=problem.windowing.seconds if problem.windowing is not None else None,
                peak_devices=out.devices.peak(b) if out.devices else None,
                mean_devices=out.devices.mean(b) if out.devices else None,
                total_peak_devices=out.devices.peak() if out.devices else None,
                total_mean_devices=out.devices.mean() if out.devices else None,
                n_graphs=len(m.graphs) if m else None,
                warmup_s=problem.cost.warmup_ms(len(m.graphs)) / 1000.0 if m else None,
                graphs=" ".join(f"{g}x{s}" for g, s in m.graphs) if m else "",
                total_graphs=len(all_graphs) if all_graphs is not None else None,
                total_warmup_s=problem.cost.warmup_ms(len(all_graphs)) / 1000.0 if all_graphs is not None else None))
    return rows


def solve_point(problem: Problem, point: SweepPoint, solvers: Sequence[str], backend: str = "highs",
                time_limit: float = 20.0, carried: Sequence[tuple[SweepPoint, PlannerOutcome]] = (),
                progress: Callable[[SweepPoint, str], None] | None = None, budget: RunBudget | None = None
                ) -> tuple[list[SweepRow], PlannerOutcome | None]:
    """Every planner at one point; returns its rows and the MIP outcome to carry to looser points.

    With ``budget`` (the sweep's one deadline) each planner's limit is its share of the time left; without,
    each gets ``time_limit``."""
    outcomes = []
    mip_outcome = None
    for name in solvers:
        limit = time_limit if budget is None else budget.next_limit(name == MIP)
        out = run_planner(problem, name, backend, limit)
        if name == MIP:
            again = (reevaluate(problem, o, src) for src, o in carried)
            out = best_outcome(out, (o for o in again if o is not None))
            mip_outcome = out
        outcomes.append(out)
        if progress is not None:
            progress(point, name)
    return point_rows(point, problem, outcomes), mip_outcome


def run_sweep(base: Problem, points: Sequence[SweepPoint], solvers: Sequence[str], backend: str = "highs",
              time_limit: float = 20.0, progress: Callable[[SweepPoint, str], None] | None = None,
              budget: RunBudget | None = None) -> SweepResult:
    """Solve every point with every planner, carrying MIP plans from tighter to looser points.

    ``budget`` shares one deadline among every MIP run of the sweep (``RunBudget``); without it each MIP run
    gets ``time_limit`` (library use: ``scripts/bench.py``)."""
    ks = sorted({p.k for p in points})
    factors = sorted({p.factor for p in points})
    best: dict[SweepPoint, PlannerOutcome] = {}
    rows: list[SweepRow] = []
    for point in sorted(points):
        carried = [(src, best[src]) for src in tighter_neighbours(point, ks, factors) if src in best]
        point_rows_, mip = solve_point(point_problem(base, point), point, solvers, backend, time_limit, carried,
                                       progress, budget)
        rows += point_rows_
        if mip is not None:
            best[point] = mip
    mip_batchings = {p: o.batchings for p, o in best.items() if o.batchings is not None}
    return SweepResult(tuple(rows), mip_batchings)
