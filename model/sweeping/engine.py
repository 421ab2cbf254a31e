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

Every number comes from ``run_solver`` -> ``plans_of`` -> ``evaluate_plans``, the path
``model.solve`` and ``model.compare`` use, so a sweep row and a solve run agree.
"""

from __future__ import annotations

import csv
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path

from model.errors import InfeasibleError, InputError
from model.evaluation.validate import BucketResult, Violation, evaluate_plans
from model.load.scenario import LIMIT_KEYS
from model.report.compare import failures
from model.schema import Batching, Limits, Planned, Problem, SolveReport
from model.solve import plans_of, run_solver

MIP = "mip"


@dataclass(frozen=True, order=True)
class SweepPoint:
    """One grid point: a shape cap and a scale factor on one limit (1.0 and no limit when not sweeping).

    Ordered by (factor, k) so iterating points in order visits every tighter
    neighbour of a point before the point itself.
    """

    factor: float
    k: int
    limit: str = ""

    def label(self) -> str:
        """Short human label used in notes and tables."""
        return f"K={self.k}" + (f", {self.limit} x{self.factor:g}" if self.limit else "")


@dataclass(frozen=True, eq=False)
class Outcome:
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

    @property
    def point(self) -> SweepPoint:
        """The grid point this row belongs to."""
        return SweepPoint(self.factor, self.k, self.sweep_limit)


@dataclass(frozen=True, eq=False)
class SweepResult:
    """All rows of a sweep plus the MIP's batchings per point (for pictures of the chosen plan)."""

    rows: tuple[SweepRow, ...]
    mip_batchings: dict[SweepPoint, tuple[Batching, ...]]


@dataclass(frozen=True)
class PlannerTotal:
    """A planner's totals over all buckets at one point, read back from its rows."""

    point: SweepPoint
    planner: str
    status: str
    cost: float | None
    bound: float | None
    gap: float | None
    ratio_to_mip: float | None
    limits_met: bool
    prefill_cost: float | None
    decode_cost: float | None
    overhead_cost: float | None
    compile_cost: float | None
    sequential_ms: float | None
    shapes: tuple[int, ...]
    solve_s: float
    wall_s: float


def parse_ks(spec: str) -> tuple[int, ...]:
    """``--k``: "1-16", "2,4,8" or a mix ("1-4,8"), as sorted distinct positive integers."""
    ks: set[int] = set()
    for part in (p.strip() for p in spec.split(",")):
        lo, dash, hi = part.partition("-")
        try:
            a, b = int(lo), int(hi if dash else lo)
        except ValueError:
            raise InputError("--k", None, None, f"expected K values like 1-16 or 2,4,8, got {spec!r}") from None
        if a < 1 or b < a:
            raise InputError("--k", None, None, f"expected positive K values in increasing ranges, got {part!r}")
        ks.update(range(a, b + 1))
    return tuple(sorted(ks))


def parse_factors(spec: str) -> tuple[float, ...]:
    """``--factors``: comma-separated positive scale factors, sorted (tightest first)."""
    try:
        values = {float(p) for p in spec.split(",") if p.strip()}
    except ValueError:
        raise InputError("--factors", None, None, f"expected numbers like 0.8,0.9,1.0, got {spec!r}") from None
    if not values or any(not (v > 0 and math.isfinite(v)) for v in values):
        raise InputError("--factors", None, None, f"expected positive numbers, got {spec!r}")
    return tuple(sorted(values))


def sweep_points(ks: Sequence[int], limit: str = "", factors: Sequence[float] = (1.0,)) -> tuple[SweepPoint, ...]:
    """The grid in solving order: factor ascending, then K ascending (tighter points first)."""
    return tuple(sorted(SweepPoint(float(f), int(k), limit) for f in (factors if limit else (1.0,)) for k in ks))


def check_sweep_limit(problem: Problem, limit: str) -> None:
    """A swept limit must be a known limit set on at least one bucket (scaling "unset" means nothing)."""
    if limit not in LIMIT_KEYS:
        raise InputError("--sweep-limit", None, None, f"expected one of {', '.join(LIMIT_KEYS)}, got {limit!r}")
    if all(getattr(lim, limit) is None for lim in problem.limits):
        raise InputError("--sweep-limit", None, None,
                         f"no bucket sets {limit}; give it in the scenario or as --{limit.replace('_', '-')}")


def scaled_limits(limits: Limits, limit: str, factor: float) -> Limits:
    """A bucket's limits with one of them multiplied by factor (left unset when unset)."""
    value = getattr(limits, limit) if limit else None
    return limits if value is None else replace(limits, **{limit: value * factor})


def point_problem(base: Problem, point: SweepPoint) -> Problem:
    """The loaded problem at a grid point: same buckets, another shape cap, one limit scaled."""
    problem = base.with_shapes(point.k)
    if not point.limit:
        return problem
    return replace(problem, limits=tuple(scaled_limits(lim, point.limit, point.factor) for lim in problem.limits))


def run_planner(problem: Problem, name: str, backend: str = "highs", time_limit: float = 20.0) -> Outcome:
    """Plan, expand and evaluate with one planner; an InfeasibleError becomes an "infeasible" outcome."""
    t0 = time.perf_counter()
    try:
        planned = run_solver(problem, name, backend, time_limit)
    except InfeasibleError as exc:
        return Outcome(name, "infeasible", None, (), None, None, str(exc), time.perf_counter() - t0)
    results, global_problems = evaluate_plans(problem, plans_of(problem, planned))
    return Outcome(name, planned.report.status, tuple(results), tuple(global_problems), planned.report,
                   planned.batchings, "", time.perf_counter() - t0)


def reevaluate(problem: Problem, carried: Outcome, source: SweepPoint) -> Outcome | None:
    """A tighter point's plan judged at this point (re-expanded: spike placement depends on limits)."""
    if carried.batchings is None:
        return None
    t0 = time.perf_counter()
    planned = Planned(carried.batchings, carried.report)
    results, global_problems = evaluate_plans(problem, plans_of(problem, planned))
    return Outcome(carried.planner, carried.status, tuple(results), tuple(global_problems), carried.report,
                   carried.batchings, "", time.perf_counter() - t0, source.label())


def best_outcome(own: Outcome, candidates: Iterable[Outcome]) -> Outcome:
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
    """(cost - bound) / cost, the relative distance to a certified lower bound."""
    if cost is None or bound is None or cost <= 0:
        return None
    return (cost - bound) / cost


def ratio_of(cost: float | None, reference: float | None) -> float | None:
    """cost / reference, or None when either is missing."""
    if cost is None or reference is None or reference <= 0:
        return None
    return cost / reference


def point_rows(point: SweepPoint, problem: Problem, outcomes: Sequence[Outcome]) -> list[SweepRow]:
    """The CSV rows of one point: per planner, per bucket, ratios against the MIP outcome (if run)."""
    mip = next((o for o in outcomes if o.planner == MIP), None)
    mip_costs = [r.metrics.cost if r.metrics else None for r in mip.results] if mip and mip.results else None
    mip_total = mip.total_cost if mip else None
    rows = []
    for out in outcomes:
        rep = out.report
        total = out.total_cost
        total_bound = rep.bound if rep is not None else None
        for b, (bucket, limits) in enumerate(zip(problem.buckets, problem.limits)):
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
                source=out.source, note=out.message))
    return rows


def solve_point(problem: Problem, point: SweepPoint, solvers: Sequence[str], backend: str = "highs",
                time_limit: float = 20.0, carried: Sequence[tuple[SweepPoint, Outcome]] = (),
                progress: Callable[[SweepPoint, str], None] | None = None) -> tuple[list[SweepRow], Outcome | None]:
    """Every planner at one point; returns its rows and the MIP outcome to carry to looser points."""
    outcomes = []
    mip_outcome = None
    for name in solvers:
        out = run_planner(problem, name, backend, time_limit)
        if name == MIP:
            again = (reevaluate(problem, o, src) for src, o in carried)
            out = best_outcome(out, (o for o in again if o is not None))
            mip_outcome = out
        outcomes.append(out)
        if progress is not None:
            progress(point, name)
    return point_rows(point, problem, outcomes), mip_outcome


def tighter_neighbours(point: SweepPoint, ks: Sequence[int], factors: Sequence[float]) -> list[SweepPoint]:
    """The points just below this one on each axis: their plans are valid here."""
    out = []
    i = ks.index(point.k)
    if i > 0:
        out.append(replace(point, k=ks[i - 1]))
    if point.limit:
        j = factors.index(point.factor)
        if j > 0:
            out.append(replace(point, factor=factors[j - 1]))
    return out


def run_sweep(base: Problem, points: Sequence[SweepPoint], solvers: Sequence[str], backend: str = "highs",
              time_limit: float = 20.0, progress: Callable[[SweepPoint, str], None] | None = None) -> SweepResult:
    """Solve every point with every planner, carrying MIP plans from tighter to looser points."""
    ks = sorted({p.k for p in points})
    factors = sorted({p.factor for p in points})
    best: dict[SweepPoint, Outcome] = {}
    rows: list[SweepRow] = []
    for point in sorted(points):
        carried = [(src, best[src]) for src in tighter_neighbours(point, ks, factors) if src in best]
        point_rows_, mip = solve_point(point_problem(base, point), point, solvers, backend, time_limit, carried,
                                       progress)
        rows += point_rows_
        if mip is not None:
            best[point] = mip
    mip_batchings = {p: o.batchings for p, o in best.items() if o.batchings is not None}
    return SweepResult(tuple(rows), mip_batchings)


def csv_value(value) -> str:
    """A cell as text: empty for None, repr for floats (round-trips exactly, deterministic)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def write_csv(rows: Sequence[SweepRow], path: Path) -> None:
    """The tidy CSV, columns in SweepRow field order."""
    names = [f.name for f in fields(SweepRow)]
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh, lineterminator="\n")
        writer.writerow(names)
        for row in rows:
            writer.writerow([csv_value(getattr(row, n)) for n in names])


def csv_cell(text: str, kind: str):
    """Parse one CSV cell back into a SweepRow field of the given annotated type (inverse of csv_value)."""
    if text == "" and "None" in kind:
        return None
    if kind.startswith("bool"):
        return text == "true"
    if kind.startswith("int"):
        return int(text)
    if kind.startswith("float"):
        return float(text)
    return text


def read_csv(path: Path) -> list[SweepRow]:
    """Rows back from a sweep CSV, so a report can be redrawn (or checked) without solving again."""
    kinds = {f.name: str(f.type) for f in fields(SweepRow)}
    with path.open(newline="", encoding="utf-8") as fh:
        return [SweepRow(**{k: csv_cell(v, kinds[k]) for k, v in rec.items()}) for rec in csv.DictReader(fh)]


def planner_totals(rows: Iterable[SweepRow]) -> list[PlannerTotal]:
    """Each (point, planner)'s totals, in first-appearance order, summed from its bucket rows."""
    groups: dict[tuple[SweepPoint, str], list[SweepRow]] = {}
    for row in rows:
        groups.setdefault((row.point, row.planner), []).append(row)
    return [total_of(point, planner, group) for (point, planner), group in groups.items()]


def _sum(values: Iterable[float | None]) -> float | None:
    values = list(values)
    return None if any(v is None for v in values) else float(sum(values))


def total_of(point: SweepPoint, planner: str, group: Sequence[SweepRow]) -> PlannerTotal:
    """A planner's totals at a point from its bucket rows (the cost breakdown summed over buckets)."""
    first = group[0]
    shapes = sorted({int(s) for r in group for s in r.shapes.split()})
    return PlannerTotal(point, planner, first.status, first.total_cost, first.total_bound, first.total_gap,
                        first.total_ratio_to_mip, all(r.limits_met for r in group),
                        _sum(r.prefill_cost for r in group), _sum(r.decode_cost for r in group),
                        _sum(r.overhead_cost for r in group), _sum(r.compile_cost for r in group),
                        _sum(r.sequential_ms for r in group), tuple(shapes), first.solve_s, first.wall_s)


def base_factor(points: Iterable[SweepPoint]) -> float:
    """The factor a recommendation is made at: 1.0 (the limits as given) or the one closest to it."""
    return min({p.factor for p in points}, key=lambda f: (abs(math.log(f)), f))


@dataclass(frozen=True)
class Recommendation:
    """What to compile: the chosen point and planner, its cost, and what it saves over the packers.

    ``k`` is the smallest shape cap whose cost is within ``tolerance`` of the
    cheapest K in the sweep: more shapes than that buy less than the tolerance.
    ``largest_k`` is the largest K the planner met the limits at, so the report can
    say when the answer sits at the edge of the sweep.
    ``rule`` is the cheapest packer meeting every limit at any K of the sweep (the
    best a fixed rule can do if its K is tuned too); ``same_k_rule`` the cheapest at
    the recommended K.
    """

    planner: str | None
    point: SweepPoint | None
    cost: float | None
    bound: float | None
    gap: float | None
    shapes: tuple[int, ...]
    cheapest_k: int | None
    cheapest_cost: float | None
    largest_k: int | None
    tolerance: float
    rule: PlannerTotal | None
    same_k_rule: PlannerTotal | None

    @property
    def savings(self) -> float | None:
        """1 - cost / cost of the best fixed rule at any K."""
        return 1 - self.cost / self.rule.cost if self.rule and self.cost is not None and self.rule.cost else None

    @property
    def same_k_savings(self) -> float | None:
        """1 - cost / cost of the best fixed rule at the same K."""
        r = self.same_k_rule
        return 1 - self.cost / r.cost if r and self.cost is not None and r.cost else None


def recommend(rows: Sequence[SweepRow], tolerance: float = 0.005) -> Recommendation:
    """Pick K at the base limits: the MIP if it ran (else the cheapest planner), smallest K near the cheapest."""
    totals = planner_totals(rows)
    factor = base_factor(t.point for t in totals)
    at_base = [t for t in totals if t.point.factor == factor and t.limits_met and t.cost is not None]
    planners = {t.planner for t in at_base}
    chosen = MIP if MIP in planners else min(at_base, key=lambda t: t.cost).planner if at_base else None
    mine = sorted((t for t in at_base if t.planner == chosen), key=lambda t: t.point.k)
    if not mine:
        return Recommendation(None, None, None, None, None, (), None, None, None, tolerance, None, None)
    cheapest = min(mine, key=lambda t: (t.cost, t.point.k))
    pick = next(t for t in mine if t.cost <= cheapest.cost * (1 + tolerance))
    rules = [t for t in at_base if t.planner != chosen]
    rule = min(rules, key=lambda t: (t.cost, t.point.k), default=None)
    same = min((t for t in rules if t.point.k == pick.point.k), key=lambda t: t.cost, default=None)
    return Recommendation(chosen, pick.point, pick.cost, pick.bound, pick.gap, pick.shapes, cheapest.point.k,
                          cheapest.cost, mine[-1].point.k, tolerance, rule, same)


@dataclass(frozen=True)
class SweepSettings:
    """What a sweep was asked to do, recorded so a report can say how its numbers were made."""

    source: str
    mode: str
    ks: tuple[int, ...]
    sweep_limit: str
    factors: tuple[float, ...]
    solvers: tuple[str, ...]
    backend: str
    time_limit: float
    tolerance: float = 0.005
    bind_threshold: float = 0.01
