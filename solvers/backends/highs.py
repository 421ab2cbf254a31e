"""HiGHS through highspy, fed the model's arrays directly (the main backend).

Reads status, objective, dual bound and duals through the API; accepts a warm start;
single random seed, so runs repeat.  The run happens in a helper thread so a signal
reaches the main thread at once, which then stops HiGHS through its interrupt callbacks.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time

import highspy
import numpy as np

from model.formulation.arrays import MipArrays
from model.runtime import run_native
from solvers.backends.result import BackendResult, Feature, SolveOptions, Status, mapped

# HiGHS's MIP presolve cannot be interrupted: on an 80k-column box model it ran 58 s
# past a 3 s limit (with it off the limit held to 1 s), so large MIPs skip it
PRESOLVE_MAX_COLS = 20_000
STOP_GRACE_S = 0.5  # a run still going this long after its time limit is left behind (see run_native)
# HighsModelStatus -> (Status with a solution, Status without one).  A user's interrupt is told
# apart before this table (the planner's signal flag); kInterrupt here is our own callbacks
# stopping at the deadline.  Our models have costs >= 0 over columns >= 0, so they cannot be
# unbounded: "unbounded or infeasible" is infeasible.
_ms = highspy.HighsModelStatus
HIGHS_STATUS: dict[highspy.HighsModelStatus, tuple[Status, Status]] = {
    _ms.kOptimal: (Status.OPTIMAL, Status.ERROR),
    _ms.kModelEmpty: (Status.OPTIMAL, Status.OPTIMAL),
    _ms.kInfeasible: (Status.INFEASIBLE, Status.INFEASIBLE),
    _ms.kUnboundedOrInfeasible: (Status.INFEASIBLE, Status.INFEASIBLE),
    _ms.kTimeLimit: (Status.TIME_LIMIT_FEASIBLE, Status.TIME_LIMIT_NO_SOLUTION),
    _ms.kInterrupt: (Status.TIME_LIMIT_FEASIBLE, Status.TIME_LIMIT_NO_SOLUTION),
    _ms.kHighsInterrupt: (Status.TIME_LIMIT_FEASIBLE, Status.TIME_LIMIT_NO_SOLUTION),
    _ms.kIterationLimit: (Status.FEASIBLE, Status.ERROR),
    _ms.kSolutionLimit: (Status.FEASIBLE, Status.ERROR),
    _ms.kObjectiveBound: (Status.FEASIBLE, Status.ERROR),
    _ms.kObjectiveTarget: (Status.FEASIBLE, Status.ERROR),
    _ms.kMemoryLimit: (Status.FEASIBLE, Status.ERROR),
    _ms.kUnknown: (Status.FEASIBLE, Status.ERROR),
    _ms.kUnbounded: (Status.ERROR, Status.ERROR),
    _ms.kNotset: (Status.ERROR, Status.ERROR),
    _ms.kLoadError: (Status.ERROR, Status.ERROR),
    _ms.kModelError: (Status.ERROR, Status.ERROR),
    _ms.kPresolveError: (Status.ERROR, Status.ERROR),
    _ms.kSolveError: (Status.ERROR, Status.ERROR),
    _ms.kPostsolveError: (Status.ERROR, Status.ERROR),
}


def new_highs() -> highspy.Highs:
    """A Highs instance without the banner it prints to stdout on creation (before any option applies).

    The banner would land in the middle of our tables and progress bars; stdout is
    pointed at /dev/null for the constructor only.
    """
    sys.stdout.flush()
    saved, sink = os.dup(1), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(sink, 1)
        return highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(sink)


@functools.cache
def version() -> str:
    h = new_highs()
    return f"{h.version()}" if hasattr(h, "version") else highspy.__version__


def to_csc(model: MipArrays) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Column-wise sparse arrays (start, index, value) from the model's coordinates."""
    order = np.lexsort((model.rows, model.cols))
    cols = model.cols[order]
    start = np.searchsorted(cols, np.arange(model.n_cols + 1)).astype(np.int32)
    return start, model.rows[order].astype(np.int32), model.vals[order]


def _lp(model: MipArrays, relax: bool) -> highspy.HighsLp:
    lp = highspy.HighsLp()
    lp.num_col_ = model.n_cols
    lp.num_row_ = model.n_rows
    lp.col_cost_ = model.c
    lp.col_lower_ = model.lb
    lp.col_upper_ = np.where(np.isinf(model.ub), highspy.kHighsInf, model.ub)
    lp.row_lower_ = np.where(np.isinf(model.row_lo), -highspy.kHighsInf, model.row_lo)
    lp.row_upper_ = np.where(np.isinf(model.row_hi), highspy.kHighsInf, model.row_hi)
    lp.offset_ = model.offset
    start, index, value = to_csc(model)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = start
    lp.a_matrix_.index_ = index
    lp.a_matrix_.value_ = value
    if not relax and model.integer.any():
        kinds = (highspy.HighsVarType.kContinuous, highspy.HighsVarType.kInteger)
        lp.integrality_ = [kinds[i] for i in model.integer.tolist()]
    return lp


class Highs:
    """The HiGHS backend (LP with duals, MIP with a dual bound, warm starts, interruptible)."""

    name = "highs"
    features = frozenset({Feature.LP, Feature.MIP, Feature.LP_DUALS, Feature.LOWER_BOUND, Feature.WARM_START,
                          Feature.TIME_LIMIT, Feature.INTERRUPT, Feature.PROGRESS})

    def version(self) -> str:
        return version()

    def solve(self, model: MipArrays, options: SolveOptions) -> BackendResult:
        """Solve the model (or its LP relaxation) and report what HiGHS says through its API."""
        t0 = time.perf_counter()
        h = new_highs()
        h.setOptionValue("output_flag", False)
        h.setOptionValue("time_limit", float(options.time_limit))
        h.setOptionValue("threads", int(options.threads))
        h.setOptionValue("random_seed", int(options.seed))
        h.setOptionValue("mip_rel_gap", float(options.mip_gap))
        if not options.relax and model.n_cols > PRESOLVE_MAX_COLS:
            h.setOptionValue("presolve", "off")
            # feasibility jump polls no interrupt either (1.4 s on an 80k-column model); a warm start is there
            h.setOptionValue("mip_heuristic_run_feasibility_jump", False)
        h.passModel(_lp(model, options.relax))
        if options.warm_start is not None and not options.relax:
            sol = highspy.HighsSolution()
            sol.col_value = np.asarray(options.warm_start, dtype=np.float64).tolist()
            sol.value_valid = True
            h.setSolution(sol)
        if time.perf_counter() - t0 >= float(options.time_limit):  # passing a huge model spent the time
            return BackendResult(Status.TIME_LIMIT_NO_SOLUTION, None, None, None, None, time.perf_counter() - t0,
                                 self.name, version(), "time limit reached while passing the model")
        incumbent = [options.warm_start] if options.warm_start is not None and not options.relax else [None]
        if not options.relax:
            _subscribe_progress(h, model, options.on_progress, incumbent)
        stop = threading.Event()
        _subscribe_interrupt(h, t0 + float(options.time_limit), stop)
        # HiGHS counts its limit from run(): give it what passing the model left
        h.setOptionValue("time_limit", max(0.01, float(options.time_limit) - (time.perf_counter() - t0)))
        run = run_native(h.run, stop.set, until=t0 + float(options.time_limit), grace_s=STOP_GRACE_S,
                         what=f"HiGHS {'LP' if options.relax else 'MIP'}")
        spent = time.perf_counter() - t0
        if run.interrupted:
            return BackendResult(Status.INTERRUPTED, None, None, None, None, spent, self.name, version(),
                                 "interrupted")
        if run.abandoned:  # it polled no interrupt in time: what it had found (or the start) is the answer
            x = None if incumbent[0] is None else np.asarray(incumbent[0], dtype=np.float64)
            if x is not None and not satisfies(model, x):
                x = None
            status = Status.TIME_LIMIT_NO_SOLUTION if x is None else Status.TIME_LIMIT_FEASIBLE
            objective = None if x is None else float(model.c @ x + model.offset) * model.scale
            return BackendResult(status, x, None, objective, None, spent, self.name, version(),
                                 "did not stop at its time limit; left behind")
        native = h.getModelStatus()
        info = h.getInfo()
        sol = h.getSolution()
        x = np.asarray(sol.col_value) if sol.value_valid else None
        status = mapped(HIGHS_STATUS, native, x is not None)
        if x is not None and status in (Status.ERROR, Status.INFEASIBLE, Status.TIME_LIMIT_NO_SOLUTION):
            x = None  # values that come with no usable status (an LP's, a failed run's) are no plan
        duals = np.asarray(sol.row_dual) * model.scale if (options.relax and sol.dual_valid) else None
        objective = float(info.objective_function_value) * model.scale if x is not None else None
        if options.relax:
            bound = objective if status is Status.OPTIMAL else None
        else:
            bound = float(info.mip_dual_bound) * model.scale if np.isfinite(info.mip_dual_bound) else None
        return BackendResult(status, x, duals, objective, bound, time.perf_counter() - t0, self.name, version(),
                             h.modelStatusToString(native))


BACKEND = Highs()


def satisfies(model: MipArrays, x: np.ndarray, tol: float = 1e-6) -> bool:
    """x meets the model's bounds, rows and integrality (a start HiGHS was given is not checked for us)."""
    if len(x) != model.n_cols or (x < model.lb - tol).any() or (x > model.ub + tol).any():
        return False
    if (np.abs(x[model.integer] - np.round(x[model.integer])) > tol).any():
        return False
    act = np.bincount(model.rows, weights=model.vals * x[model.cols], minlength=model.n_rows)
    scale = np.maximum(1.0, np.abs(act))
    return bool(((act >= model.row_lo - tol * scale) & (act <= model.row_hi + tol * scale)).all())


def _subscribe_interrupt(h, until: float, stop: threading.Event) -> None:
    """Interrupt HiGHS from its own callbacks once the wall-clock budget is spent or ``stop`` is set.

    HiGHS's time_limit option is not honoured everywhere: proving a large MIP
    infeasible ran for minutes past it here.  The interrupt callbacks fire inside
    simplex, IPM and branch-and-bound, so the budget holds; ``stop`` is set by the
    main thread on a signal (see ``model.runtime.run_native``).
    """
    def check(event) -> None:
        if stop.is_set() or time.perf_counter() > until:
            event.interrupt()

    for name in ("cbMipInterrupt", "cbSimplexInterrupt", "cbIpmInterrupt"):
        hook = getattr(h, name, None)
        if hook is not None:
            hook.subscribe(check)


def _subscribe_progress(h, model: MipArrays, report, incumbent: list) -> None:
    """Keep each improved incumbent in ``incumbent[0]`` and forward it (with the bound) to ``report``."""
    def on_improve(event):
        data = event.data_out
        incumbent[0] = np.array(data.mip_solution, dtype=np.float64)
        if report is not None:
            report(float(data.objective_function_value) * model.scale, float(data.mip_dual_bound) * model.scale)

    try:
        h.cbMipImprovingSolution.subscribe(on_improve)
    except AttributeError:  # older highspy: no callbacks, progress is only reported at the end
        pass
