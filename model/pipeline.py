"""The pipeline API: load -> plan -> expand -> evaluate -> write.

Every command line (``model.solve``, ``model.evaluate``, ``model.sweep``), the sweep
engine, the comparison table and the benchmark call these functions; they parse no
arguments and print nothing.  Data flows one way: a ``Problem`` goes in, typed
records (``Planned``, ``Plan``, ``Evaluation``, ``Run``) come out.
"""

from __future__ import annotations

import importlib.resources
import importlib.util
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from model.base.errors import InfeasibleError, InputError, NoPlanFound, unknown_name
from model.base.runtime import Deadline
from model.cost.analytic import CostParams
from model.cost.common import Mode, align
from model.cost.device import DeviceProfile
from model.cost.model import CostModel, cost_from_flags, flag_coefficients, with_batch_buckets
from model.domain.schema import (
    Batching,
    Bucket,
    Evaluation,
    Limits,
    Plan,
    Planned,
    Problem,
    Scenario,
)
from model.domain.shapeset import check_fits, check_kv_fits, check_shape_cover
from model.domain.windowing import windowed
from model.evaluation.validate import evaluate_plans
from model.expand.assemble import assemble_all
from model.load.plans import write_plans
from model.load.requests import Columns, load_requests
from model.load.scenario import load_scenario
from model.packers import PACKERS
from model.planning.bucket_choice import (
    auto_bound,
    auto_problem,
    bucket_moves,
    full_batch_sizes,
    used_buckets,
    with_buckets,
)
from model.planning.contract import Candidates, Judged, select
from model.planning.diagnose import unmeetable
from model.planning.mip import plan_mip
from model.planning.window_graphs import plan_windowed_graphs
from model.planning.windowed import plan_windowed

# The embedded default scenario: pyproject.toml installs the repository's data/ as the package model._data (no
# top-level ``data`` in site-packages), found with importlib.resources in a wheel and an editable install; a source
# tree run without installing (python -m from its root) has no model._data and reads the data/ beside model/.
_DATA = (importlib.resources.files("model._data") if importlib.util.find_spec("model._data")
         else Path(str(importlib.resources.files("model"))).parent / "data")
DEFAULT_SCENARIO = Path(str(_DATA / "default" / "scenario.toml"))
MIP = "mip"


def solver_names() -> list[str]:
    """Every planner by name: the MIP first, then the heuristic packers (weakest rule first)."""
    return [MIP, *PACKERS]


@dataclass(frozen=True)
class InputSpec:
    """What to load and the settings that override a scenario's (None = keep the scenario's / default)."""

    files: tuple[Path, ...] = ()
    scenario: Path | None = None
    columns: str | None = None
    fmt: str | None = None
    limits: Limits = Limits()
    max_shapes: int | None = None
    params: CostParams | None = None
    device: DeviceProfile | None = None
    mode: Mode | None = None
    max_batch_size: int | None = None
    max_seq_len: int | None = None
    allowed_shapes: tuple[int, ...] | None = None  # plan only with these shapes (None: free choice)
    time_column: str | None = None  # read each request's arrival time from this column (request files only)
    window_s: float | None = None  # batch only requests arriving in the same window of this many seconds
    params_source: str | None = None  # the file ``params`` came from, named if its costs overflow
    # compiled batch sizes (device mode; None: the scenario's/profile's; "auto": the planner chooses them)
    batch_buckets: tuple[int, ...] | str | None = None
    max_graphs: int | None = None  # at most this many distinct graphs across all buckets (with batch buckets)
    max_warmup_s: float | None = None  # warm-up (compile time x distinct graphs) at most this many seconds


def load_problem(spec: InputSpec, default_scenario: Path | None = None) -> tuple[Problem, Scenario | None]:
    """The Problem a scenario, a list of request files, or the embedded default describes.

    Limits in ``spec`` apply to every bucket; with a scenario they replace its limits
    one by one, so a flag tightens a scenario without silently being ignored.
    """
    scenario = None
    mode, params = flag_coefficients(spec.mode, spec.params, spec.device)
    if spec.scenario is not None or (not spec.files and default_scenario is not None):
        if spec.time_column is not None:
            raise InputError("--time-column", None, None, "applies to request files, not a scenario (a scenario "
                             "bucket with columns = \"azure\" reads TIMESTAMP by itself)")
        scenario = load_scenario(spec.scenario or default_scenario)
        problem = scenario.problem(max_shapes=spec.max_shapes,
                                   cost=flag_buckets(cost_from_flags(mode, params, scenario.cost), spec),
                                   max_batch_size=spec.max_batch_size, max_seq_len=spec.max_seq_len,
                                   allowed_shapes=spec.allowed_shapes,
                                   limits=tuple(lim.overridden_by(spec.limits) for lim in scenario.limits))
    else:
        if not spec.files:
            raise InputError("<command line>", None, None, "no input: give request files or --scenario")
        columns = Columns.parse(spec.columns) if spec.columns else None
        buckets = tuple(load_requests(f, None, columns, spec.fmt, time_column=spec.time_column) for f in spec.files)
        check_unique_names(buckets)
        cost = flag_buckets(cost_from_flags(mode, params), spec)
        problem = Problem(buckets=buckets, limits=tuple(spec.limits for _ in buckets),
                          max_shapes=spec.max_shapes or 8, cost=cost, max_batch_size=spec.max_batch_size,
                          max_seq_len=spec.max_seq_len, allowed_shapes=spec.allowed_shapes)
    problem = with_graph_caps(problem, spec)
    if problem.cost.device_time and problem.cost.params.auto_buckets:
        problem = auto_problem(problem)  # the candidate buckets the planner chooses among
    check_seq_len(problem)
    check_fits(problem)
    if spec.params is not None or scenario is not None:
        check_cost_range(problem, spec.params_source if spec.params is not None else str(scenario.path))
    if spec.window_s is not None:
        problem = windowed(problem, spec.window_s)
    return problem, scenario


def flag_buckets(cost: CostModel, spec: InputSpec) -> CostModel:
    """The cost model with ``--batch-buckets`` (they replace a scenario's or a profile's own)."""
    try:
        return with_batch_buckets(cost, spec.batch_buckets)
    except ValueError as exc:
        raise InputError("--batch-buckets", None, None, str(exc)) from None


def with_graph_caps(problem: Problem, spec: InputSpec) -> Problem:
    """The problem under ``--limit-graphs`` and ``--max-warmup-s``: caps on graphs, which only a stack that
    compiles batch sizes has (with the batch free a cap would have the planner choose the buckets)."""
    for flag, value in (("--limit-graphs", spec.max_graphs), ("--max-warmup-s", spec.max_warmup_s)):
        if value is not None and problem.cost.batch_buckets is None and not (
                problem.cost.device_time and problem.cost.params.auto_buckets):
            raise InputError(flag, None, None, "caps compiled graphs (batch bucket, shape): give --batch-buckets "
                             "(or batch_buckets in the device profile or the scenario)")
    return replace(problem, max_graphs=spec.max_graphs, max_warmup_s=spec.max_warmup_s)


OVERFLOW = "costs overflow float64 with these coefficients"


def check_cost_range(problem: Problem, source: str) -> None:
    """Every plan of these requests must cost (and take) a finite amount under these coefficients.

    Bounds the most expensive plan any planner could return -- every request alone in a batch
    at the largest shape a planner may declare (the max_seq_len, or the largest aligned prompt
    rounded up to a power of two), plus a compile per shape -- and refuses coefficients for
    which that bound is inf or NaN: planning and evaluation would otherwise compare infinities.
    """
    check_cost_extent(problem, sum(len(b) for b in problem.buckets),
                      max(int(align(b.prompt_len).max()) for b in problem.buckets),
                      max(int(b.gen_len.max()) for b in problem.buckets), source)


def check_cost_extent(problem: Problem, n: int, s_top: int, g_hi: int, source: str) -> None:
    """``check_cost_range`` given the requests' extent: how many, the largest aligned prompt and gen (what a
    histogram tells without the requests)."""
    cm = problem.cost
    if cm.device_time:  # device profiles are checked finite by their own loader
        return
    s_hi = max(1 << (s_top - 1).bit_length(), problem.max_seq_len or 0)
    shapes = min(problem.max_shapes, n)
    with np.errstate(over="ignore", invalid="ignore"):
        cost = n * cm.batch_total(1, s_hi, g_hi) + shapes * cm.shape_charge(s_hi)
        time_ms = n * cm.member_latency(s_hi, s_hi, g_hi) + shapes * cm.spike_ms

    for what, value in (("cost", cost), ("latency", time_ms)):
        if not np.isfinite(value):
            raise InputError(source, None, None, f"{OVERFLOW}: a plan of these requests could have {what} {value}")


def check_finite_metrics(evaluation: Evaluation, source: str) -> None:
    """The evaluator's numbers must be finite (a safety net behind ``check_cost_range``)."""
    for r in evaluation.results:
        if r.metrics is None:
            continue
        for name in ("cost", "pad_ratio", "p95_latency_ms", "sequential_ms"):
            value = getattr(r.metrics, name)
            if not np.isfinite(value):
                raise InputError(source, None, None, f"{OVERFLOW}: bucket {r.name} has {name} {value}")


def check_unique_names(buckets: tuple[Bucket, ...]) -> None:
    """Bucket names come from file names and name the plan files, so two must not collide."""
    seen: dict[str, str] = {}
    for b in buckets:
        if b.name in seen:
            raise InputError(b.source, None, None,
                             f"bucket name {b.name!r} is also the name of {seen[b.name]}; "
                             "bucket names come from file names and must differ")
        seen[b.name] = b.source


def check_seq_len(problem: Problem) -> None:
    """A prompt longer than the largest allowed shape can never be planned: name it."""
    if problem.max_seq_len is None:
        return
    for b in problem.buckets:
        over = b.prompt_len > problem.max_seq_len
        if over.any():
            k = int(over.argmax())
            raise InputError(b.source, int(b.lines[k]), "prompt_len",
                             f"{int(b.prompt_len[k])} is longer than the largest allowed shape {problem.max_seq_len}")


def check_graph_cap(problem: Problem) -> None:
    """A graph cap below one graph leaves no plan (every plan runs at least one): InfeasibleError, a proof."""
    cap = problem.graph_cap
    if cap is not None and cap < 1:
        raise InfeasibleError(f"no plan runs fewer than one graph, and --max-warmup-s {problem.max_warmup_s:g} is "
                              f"below one graph's compile time ({problem.cost.spike_ms / 1000.0:g} s)"
                              if problem.max_graphs is None or problem.max_graphs >= 1 else
                              "no plan runs fewer than one graph")


def judge(problem: Problem, name: str, batchings: tuple[Batching, ...]) -> Judged:
    """The judge every planner is given: expand a candidate (spike placement included), then evaluate it with
    the one cost model."""
    plans = assemble_all(problem, batchings)
    results, global_problems = evaluate_plans(problem, plans)
    return Judged(name, batchings, plans, Evaluation(tuple(results), tuple(global_problems)))


def plan(problem: Problem, solver: str = MIP, backend: str = "highs", time_limit: float = 60.0) -> Planned:
    """Run one planner by name: batchings for every bucket with a typed report (``contract.select``'s)."""
    check_kv_fits(problem)
    check_graph_cap(problem)
    check_shape_cover(problem)
    if problem.choose_buckets:
        return plan_choosing(problem, solver, backend, time_limit)
    return plan_fixed(problem, solver, backend, time_limit)


def plan_fixed(problem: Problem, solver: str, backend: str, time_limit: float) -> Planned:
    """``plan`` with the batch buckets (if any) given."""
    if solver == MIP:
        if problem.windowing is not None:
            if problem.cost.batch_buckets is not None:  # candidates judged exactly, a bound priced at graphs
                return plan_windowed_graphs(problem, backend=backend, time_limit=time_limit, judge=judge)
            return plan_windowed(problem, backend=backend, time_limit=time_limit, judge=judge)
        return plan_mip(problem, backend=backend, time_limit=time_limit, judge=judge)
    if solver not in PACKERS:
        raise InputError("--solver", None, None, unknown_name("solver", solver, solver_names()))
    t0 = time.perf_counter()
    try:
        batchings = PACKERS[solver](problem)
    except InfeasibleError as exc:  # the packer's own rule failed: a proof only where no plan could meet a limit
        proofs = unmeetable(problem, Deadline.after(max(0.0, time_limit - (time.perf_counter() - t0))))
        if proofs:
            raise InfeasibleError(f"{exc}; the limits cannot all be met: " + "; ".join(proofs)) from None
        raise NoPlanFound(f"{exc}: the packer {solver}'s rule has no plan, another may (not proven infeasible: "
                          "the mip planner chooses its own shapes and batches)") from None
    chosen, report = select(Candidates((judge(problem, solver, batchings),), None,
                                       f"packer:{solver}", "1", t0, Deadline.never()))
    return Planned(chosen.batchings, report, chosen.plans, chosen.evaluation)


AUTO_BOUND_SHARE = 0.15  # of --time-limit kept for the bucket moves, the bound over every list and the judging


def plan_choosing(problem: Problem, solver: str, backend: str, time_limit: float) -> Planned:
    """``--batch-buckets auto``: plan over the candidate buckets, keep those the plan runs in, and report the
    bound that holds for every choice of buckets (``model.planning.bucket_choice``).

    Beside the planner's plan, dpfill under the same buckets and shapes and dpfill over every candidate are
    judged (with the MIP), then a local search moves the buckets (``refine_buckets``), so the plan returned
    never costs more than dpfill with the same graphs.  A proof of infeasibility over the candidates
    is no proof for every list of buckets: it is reported as no plan found."""
    t0 = time.perf_counter()
    clock = Deadline.after(time_limit)
    fixed = replace(problem, choose_buckets=False)
    try:
        inner = plan_fixed(fixed, solver, backend, time_limit * (1 - AUTO_BOUND_SHARE))
    except InfeasibleError as exc:
        raise NoPlanFound(f"{exc} (with the candidate batch buckets {', '.join(map(str, fixed.cost.batch_buckets))}"
                          "; not proven for every choice of buckets)") from None
    starts = [under_used(problem, fixed, solver, inner.batchings)]
    if solver == MIP:
        shapes = tuple(sorted({int(s) for bt in inner.batchings for s in np.unique(bt.shape_of)}))
        same = replace(with_buckets(problem, starts[0][1]), allowed_shapes=shapes)
        for start in (same, fixed):  # dpfill under the plan's buckets and shapes, and over every candidate
            try:
                starts.append(under_used(problem, start, "dpfill", PACKERS["dpfill"](start)))
            except (InfeasibleError, NoPlanFound):
                continue
    ok = [s for s in starts if s[0].acceptable] or starts[:1]
    best, buckets = min(ok, key=lambda s: s[0].cost)
    if solver == MIP and best.acceptable:
        best, buckets = refine_buckets(problem, best, buckets, clock, time_limit)
    final = judge(with_buckets(problem, buckets), best.name, best.batchings)
    rep = inner.report
    lead = (f"batch buckets chosen by the planner: {', '.join(map(str, buckets))} (among the candidates "
            f"{', '.join(map(str, fixed.cost.batch_buckets))})",)
    if best.name != solver:
        lead += (f"a dpfill plan (under the {solver} plan's buckets and shapes, over every candidate, or after "
                 f"moves of the buckets) is cheaper than the {solver} plan and is returned",)
    bound = None
    if rep.bound is not None:
        bound = auto_bound(problem, clock)
        lead += (f"the bound holds for every list of batch buckets up to {fixed.cost.batch_buckets[-1]}: the "
                 "shape relaxation with the batch free (each member pays at least its full graph's share) under "
                 "min(K, graph cap) shapes; the MIP's own bound holds only for lists of the candidates"
                 + (f" ({fmt_float(rep.bound)})" if np.isfinite(rep.bound) else ""),)
        if not np.isfinite(bound):
            lead += ("the time limit cut the bound over every list of buckets short: no bound is reported",)
            bound = None
    notes = tuple(n for n in rep.notes if not n.startswith("the bound is"))
    picked, report = select(Candidates((final,), bound, rep.backend, rep.version, t0, clock, rep.status, None,
                                       lead + notes))
    return Planned(picked.batchings, report, picked.plans, picked.evaluation, chosen_buckets=buckets)


REFINE_UNTIL = 0.92  # of --time-limit: the bucket moves stop here (the bound and the final judging follow)


def under_used(problem: Problem, planned_under: Problem, name: str, batchings: tuple[Batching, ...]
               ) -> tuple[Judged, tuple[int, ...]]:
    """A plan made under ``planned_under``'s buckets, judged under the ones its batches run in (which price it
    the same, ``bucket_choice.used_buckets``), and those buckets."""
    used = used_buckets(planned_under, batchings)
    return judge(with_buckets(problem, used), name, batchings), used


def refine_buckets(problem: Problem, best: Judged, buckets: tuple[int, ...], clock: Deadline, time_limit: float
                   ) -> tuple[Judged, tuple[int, ...]]:
    """Local search on the chosen bucket list with the plan's shapes fixed: each list one move away (a bucket
    dropped, a full-batch size added or swapped in, ``bucket_choice.bucket_moves``) planned by dpfill and
    judged exactly; the first that is cheaper and meets every limit (the graph cap included) is taken, until
    no move helps or the clock says stop.  Every list tried is within the space the bound covers."""
    shapes = tuple(sorted({int(s) for bt in best.batchings for s in np.unique(bt.shape_of)}))
    top = problem.cost.batch_buckets[-1]
    values = full_batch_sizes(problem, shapes, top)
    stop = Deadline(clock.at - (1 - REFINE_UNTIL) * time_limit)
    improved = True
    while improved and not stop.expired():
        improved = False
        for move in bucket_moves(buckets, values):
            if stop.expired():
                break
            trial = replace(with_buckets(problem, move), allowed_shapes=shapes)
            try:
                cand, used = under_used(problem, trial, "dpfill", PACKERS["dpfill"](trial))
            except (InfeasibleError, NoPlanFound):
                continue
            if cand.acceptable and cand.cost < best.cost * (1 - 1e-12):
                best, buckets, improved = cand, used, True
                break
    return best, buckets


def fmt_float(value: float) -> str:
    """A bound in a note: six significant digits."""
    return f"{value:.6g}"


def planned_problem(problem: Problem, planned: Planned) -> Problem:
    """The problem a planner's plans hold under: with ``--batch-buckets auto`` the buckets it chose."""
    if planned.chosen_buckets is None:
        return problem
    return with_buckets(problem, planned.chosen_buckets)


def expand(problem: Problem, planned: Planned) -> tuple[Plan, ...]:
    """Every bucket's batching as a concrete plan (batch ids and member order placed for the spikes)."""
    return assemble_all(problem, planned.batchings)


def evaluate(problem: Problem, plans: tuple[Plan, ...]) -> Evaluation:
    """Validate and judge every plan with the one cost model."""
    results, global_problems = evaluate_plans(problem, plans)
    return Evaluation(tuple(results), tuple(global_problems))


@dataclass(frozen=True, eq=False)
class Run:
    """One planner run end to end: its batchings and report, the plans, and their evaluation."""

    planner: str
    planned: Planned
    plans: tuple[Plan, ...]
    evaluation: Evaluation
    wall_s: float


def run(problem: Problem, solver: str = MIP, backend: str = "highs", time_limit: float = 60.0) -> Run:
    """Plan, expand and evaluate; plans the planner already judged are used as they are, not rebuilt."""
    t0 = time.perf_counter()
    planned = plan(problem, solver, backend, time_limit)
    return judged(problem, solver, planned, t0)


def judged(problem: Problem, solver: str, planned: Planned, t0: float | None = None) -> Run:
    """A planner's output as a Run: its own judged plans if it carries them, else expanded and evaluated here."""
    t0 = time.perf_counter() if t0 is None else t0
    if planned.plans is not None and planned.evaluation is not None:
        plans, evaluation = planned.plans, planned.evaluation
    else:
        plans = expand(problem, planned)
        evaluation = evaluate(problem, plans)
    return Run(solver, planned, plans, evaluation, time.perf_counter() - t0)


def compare_run(problem: Problem, solver: str) -> Evaluation | str:
    """One more planner's evaluated plans for a comparison table, or the reason it cannot plan."""
    try:
        return run(problem, solver).evaluation
    except (InfeasibleError, NoPlanFound) as exc:
        return str(exc)


def plan_path(out_dir: Path, bucket_name: str) -> Path:
    """Where the plan of a bucket lives in an output folder (names are plain: see ``model.load.names``)."""
    return out_dir / f"plan_{bucket_name}.jsonl"


def write(out_dir: Path, problem: Problem, plans: tuple[Plan, ...],
          also: Mapping[Path, Iterable[bytes]] | None = None) -> tuple[Path, ...]:
    """Write every bucket's plan into ``out_dir`` -- and ``also`` the other files of the result, a report -- together:
    all replaced, or none changed.

    Nothing is ever written outside ``out_dir``: the loaders refuse names that are not plain, and
    ``write_plans`` checks again that every target lies directly inside the folder.
    """
    paths = tuple(plan_path(out_dir, b.name) for b in problem.buckets)
    write_plans(dict(zip(paths, plans, strict=True)), inside=out_dir, also=also)
    return paths
