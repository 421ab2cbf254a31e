"""HiGHS through highspy, fed the model's arrays directly (the main backend).

Reads status, objective, dual bound and duals through the API; accepts a warm start;
single random seed, so runs repeat.
"""

from __future__ import annotations

import os
import sys
import time

import highspy
import numpy as np

from model.formulation.arrays import MipArrays
from solvers.backends.result import BackendResult, SolveOptions

NAME = "highs"
# HiGHS's MIP presolve cannot be interrupted: on an 80k-column box model it ran 58 s
# past a 3 s limit (with it off the limit held to 1 s), so large MIPs skip it
PRESOLVE_MAX_COLS = 20_000
FEATURES = frozenset({"lp", "mip", "duals", "bound", "warm_start", "time_limit", "progress"})


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
        lp.integrality_ = [highspy.HighsVarType.kInteger if i else highspy.HighsVarType.kContinuous
                           for i in model.integer]
    return lp


def solve(model: MipArrays, options: SolveOptions) -> BackendResult:
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
    h.passModel(_lp(model, options.relax))
    if options.warm_start is not None and not options.relax:
        sol = highspy.HighsSolution()
        sol.col_value = list(np.asarray(options.warm_start, dtype=np.float64))
        sol.value_valid = True
        h.setSolution(sol)
    if options.on_progress is not None and not options.relax:
        _subscribe_progress(h, model, options.on_progress)
    _enforce_time_limit(h, t0 + float(options.time_limit))
    h.run()
    status = h.getModelStatus()
    info = h.getInfo()
    ms = highspy.HighsModelStatus
    if status == ms.kOptimal:
        label = "optimal"
    elif status in (ms.kInfeasible,):
        label = "infeasible"
    elif status in (ms.kTimeLimit, ms.kInterrupt, ms.kIterationLimit, ms.kSolutionLimit):
        label = "time_limit"
    elif status == ms.kUnboundedOrInfeasible or status == ms.kUnbounded:
        label = "infeasible"
    else:
        label = "error"
    sol = h.getSolution()
    x = np.asarray(sol.col_value) if sol.value_valid else None
    duals = np.asarray(sol.row_dual) * model.scale if (options.relax and sol.dual_valid) else None
    objective = float(info.objective_function_value) * model.scale if x is not None else None
    if options.relax:
        bound = objective if label == "optimal" else None
    else:
        bound = float(info.mip_dual_bound) * model.scale if np.isfinite(info.mip_dual_bound) else None
    if label == "time_limit" and x is not None:
        label = "time_limit"
    return BackendResult(label, x, duals, objective, bound, time.perf_counter() - t0, NAME, version())


def _enforce_time_limit(h, until: float) -> None:
    """Interrupt HiGHS from its own callbacks once the wall-clock budget is spent.

    HiGHS's time_limit option is not honoured everywhere: proving a large MIP
    infeasible ran for minutes past it here.  The interrupt callbacks fire inside
    simplex, IPM and branch-and-bound, so the budget holds.
    """
    def check(event) -> None:
        if time.perf_counter() > until:
            event.interrupt()

    for name in ("cbMipInterrupt", "cbSimplexInterrupt", "cbIpmInterrupt"):
        hook = getattr(h, name, None)
        if hook is not None:
            hook.subscribe(check)


def _subscribe_progress(h, model: MipArrays, report) -> None:
    """Forward each improved incumbent (and the bound at that moment) to the caller."""
    def on_improve(event):
        data = event.data_out
        report(float(data.objective_function_value) * model.scale, float(data.mip_dual_bound) * model.scale)

    try:
        h.cbMipImprovingSolution.subscribe(on_improve)
    except AttributeError:  # older highspy: no callbacks, progress is only reported at the end
        pass
