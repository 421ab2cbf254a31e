"""The pipeline API: load -> plan -> expand -> evaluate -> write.

Every command line (``model.solve``, ``model.evaluate``, ``model.sweep``), the sweep
engine, the comparison table and the benchmark call these functions; they parse no
arguments and print nothing.  Data flows one way: a ``Problem`` goes in, typed
records (``Planned``, ``Plan``, ``Evaluation``, ``Run``) come out.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from model.cost.analytic import CostParams
from model.cost.common import Mode
from model.errors import InfeasibleError, InputError, NoPlanFound
from model.evaluation.validate import evaluate_plans
from model.expand.assemble import assemble
from model.load.plans import write_plans
from model.load.requests import Columns, load_requests
from model.load.scenario import load_scenario
from model.planning.mip import plan_mip
from model.schema import (
    Bucket,
    Evaluation,
    Limits,
    Plan,
    Planned,
    Problem,
    Scenario,
    SolveReport,
    Status,
)
from solvers.packers import PACKERS

DEFAULT_SCENARIO = Path(__file__).resolve().parent.parent / "data" / "default" / "scenario.toml"
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
    mode: Mode | None = None
    max_batch_size: int | None = None
    max_seq_len: int | None = None


def load_problem(spec: InputSpec, default_scenario: Path | None = None) -> tuple[Problem, Scenario | None]:
    """The Problem a scenario, a list of request files, or the embedded default describes.

    Limits in ``spec`` apply to every bucket; with a scenario they replace its limits
    one by one, so a flag tightens a scenario without silently being ignored.
    """
    scenario = None
    if spec.scenario is not None or (not spec.files and default_scenario is not None):
        scenario = load_scenario(spec.scenario or default_scenario)
        problem = scenario.problem(max_shapes=spec.max_shapes, params=spec.params, mode=spec.mode,
                                   max_batch_size=spec.max_batch_size, max_seq_len=spec.max_seq_len,
                                   limits=tuple(lim.overridden_by(spec.limits) for lim in scenario.limits))
    else:
        if not spec.files:
            raise InputError("<command line>", None, None, "no input: give request files or --scenario")
        columns = Columns.parse(spec.columns) if spec.columns else None
        buckets = tuple(load_requests(f, None, columns, spec.fmt) for f in spec.files)
        check_unique_names(buckets)
        problem = Problem(buckets=buckets, limits=tuple(spec.limits for _ in buckets),
                          max_shapes=spec.max_shapes or 8, params=spec.params or CostParams(),
                          mode=spec.mode or "reference", max_batch_size=spec.max_batch_size,
                          max_seq_len=spec.max_seq_len)
    check_seq_len(problem)
    return problem, scenario


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


def plan(problem: Problem, solver: str = MIP, backend: str = "highs", time_limit: float = 60.0) -> Planned:
    """Run one planner by name: batchings for every bucket with a typed report."""
    if solver == MIP:
        return plan_mip(problem, backend=backend, time_limit=time_limit)
    if solver not in PACKERS:
        raise InputError("--solver", None, None, f"unknown solver {solver!r} ({', '.join(solver_names())})")
    t0 = time.perf_counter()
    batchings = PACKERS[solver](problem)
    return Planned(batchings, SolveReport(Status.HEURISTIC, None, None, None, time.perf_counter() - t0,
                                          f"packer:{solver}", "1"))


def expand(problem: Problem, planned: Planned) -> tuple[Plan, ...]:
    """Every bucket's batching as a concrete plan (batch ids and member order placed for the spikes)."""
    return tuple(assemble(b, bt, problem.params, problem.mode, lim)
                 for b, bt, lim in zip(problem.buckets, planned.batchings, problem.limits, strict=True))


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
    """Where the plan of a bucket lives in an output folder."""
    return out_dir / f"plan_{bucket_name}.jsonl"


def write(out_dir: Path, problem: Problem, plans: tuple[Plan, ...]) -> tuple[Path, ...]:
    """Write every bucket's plan into ``out_dir`` together: all replaced, or none changed."""
    paths = tuple(plan_path(out_dir, b.name) for b in problem.buckets)
    write_plans(dict(zip(paths, plans, strict=True)))
    return paths
