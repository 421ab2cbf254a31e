"""OR-Tools CP-SAT: strong incumbents on large instances; needs integer coefficients.

Fractional rows are scaled so that their coefficient sums stay far inside int64 and
rounded to the nearest integer (rounding every coefficient up instead rejected plans
lying exactly on a limit); the rare plan a rounding lets past a limit by a hair is
caught by the planner's exact re-evaluation and repaired.  The objective is the raw
integer cost divided by a power-of-ten quantum chosen the same way.  Because of that
rounding, CP-SAT's "infeasible" is a proof only when no row was rounded.  No LP
relaxation and no duals: column generation runs its LPs on HiGHS.  Built through the
snake_case API with one weighted sum per row; solved in a helper thread so a signal
reaches the main thread, which stops the search.
"""

from __future__ import annotations

import functools
import math
import time

import numpy as np
import pandas as pd
from ortools.sat.python import cp_model, cp_model_helper

from model.base.runtime import BuildClock, DeadlineExceeded, run_native
from solvers.backends.milp import MipArrays
from solvers.backends.result import BackendResult, Feature, SolveOptions, Status, mapped

STOP_GRACE_S = 0.5  # a run still going this long after its time limit is left behind (see run_native)
# CpSolverStatus -> (Status with a solution, Status without one).  FEASIBLE: a solution, stopped by
# the time limit (a gap limit reached counts as OPTIMAL in CP-SAT); UNKNOWN: stopped before any
# solution.  A user's interrupt is told apart before this table.
CPSAT_STATUS: dict[cp_model_helper.CpSolverStatus, tuple[Status, Status]] = {
    cp_model.OPTIMAL: (Status.OPTIMAL, Status.ERROR),
    cp_model.FEASIBLE: (Status.TIME_LIMIT_FEASIBLE, Status.ERROR),
    cp_model.INFEASIBLE: (Status.INFEASIBLE, Status.INFEASIBLE),
    cp_model.UNKNOWN: (Status.TIME_LIMIT_FEASIBLE, Status.TIME_LIMIT_NO_SOLUTION),
    cp_model.MODEL_INVALID: (Status.ERROR, Status.ERROR),
}
# |coefficient| * (sum of upper bounds) stays below this: far inside CP-SAT's int64 arithmetic
# and exact in a double.  (2**27 made the objective's quantum 1e8 -- 0.03% of a twin workload's
# cost -- and rounded limit rows to 1e-3 of their largest coefficient, letting plans past limits.)
SUM_LIMIT = 2 ** 50
PRESOLVE_MAX_COLS = 20_000  # CP-SAT's presolve alone ran > 30 s on an 80k-column box model


@functools.cache
def version() -> str:
    import ortools

    return ortools.__version__


def _quantum(coefs: np.ndarray, ub_sum: float) -> float:
    """Smallest power of ten q with max|coef|/q * ub_sum <= SUM_LIMIT (q >= 1 only when needed)."""
    peak = float(np.abs(coefs).max(initial=0.0)) * max(ub_sum, 1.0)
    if peak <= SUM_LIMIT:
        return 1.0
    return float(10 ** np.ceil(np.log10(peak / SUM_LIMIT)))


def integer_rows(model: MipArrays) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Row coefficients and bounds as integers: exact where already integral, else scaled and rounded.

    Returns (coefficients, row_lo, row_hi, the rows that were rounded).
    """
    vals = model.vals.copy()
    lo = model.row_lo.copy()
    hi = model.row_hi.copy()
    frac = np.abs(vals - np.round(vals)) > 1e-9
    bad_rows = np.unique(model.rows[frac])
    ub = np.where(np.isfinite(model.ub), model.ub, 1e6)
    for r in bad_rows:
        sel = model.rows == r
        scale = 1e6 / _quantum(vals[sel] * 1e6, float(ub[model.cols[sel]].sum()))
        vals[sel] = np.round(vals[sel] * scale)
        if np.isfinite(hi[r]):
            hi[r] = np.floor(hi[r] * scale + 1e-9)
        if np.isfinite(lo[r]):
            lo[r] = np.ceil(lo[r] * scale - 1e-9)
    big_rows = np.unique(model.rows[np.abs(vals) > SUM_LIMIT])
    for r in big_rows:  # raw-cost rows (the cost limit): divide down, stay conservative
        sel = model.rows == r
        q = _quantum(vals[sel], float(ub[model.cols[sel]].sum()))
        vals[sel] = np.round(vals[sel] / q)
        if np.isfinite(hi[r]):
            hi[r] = np.floor(hi[r] / q + 1e-9)
        if np.isfinite(lo[r]):
            lo[r] = np.ceil(lo[r] / q - 1e-9)
    return np.round(vals).astype(np.int64), lo, hi, np.union1d(bad_rows, big_rows)


class CpSat:
    """The CP-SAT backend: integer models only (no LP, so no duals); a dual bound; hints; interruptible."""

    name = "cpsat"
    features = frozenset({Feature.MIP, Feature.LOWER_BOUND, Feature.WARM_START, Feature.TIME_LIMIT,
                          Feature.INTERRUPT, Feature.PROGRESS})

    def version(self) -> str:
        return version()

    def solve(self, model: MipArrays, options: SolveOptions) -> BackendResult:
        """Solve the integer model with CP-SAT (LP relaxations are not supported: see features)."""
        t0 = time.perf_counter()
        if options.relax or not model.integer.all():
            return BackendResult(Status.ERROR, None, None, None, None, 0.0, self.name, version(),
                                 "CP-SAT solves integer models only")
        try:
            cp, xs, q, rounded = build(model, options.warm_start, t0 + float(options.time_limit))
        except DeadlineExceeded:
            return BackendResult(Status.TIME_LIMIT_NO_SOLUTION, None, None, None, None, time.perf_counter() - t0,
                                 self.name, version(), "time limit reached while building the model")
        solver = cp_model.CpSolver()
        solver.parameters.max_time_in_seconds = max(0.01, float(options.time_limit) - (time.perf_counter() - t0))
        solver.parameters.num_workers = int(options.threads)
        solver.parameters.random_seed = int(options.seed)
        solver.parameters.relative_gap_limit = float(options.mip_gap)
        if model.n_cols > PRESOLVE_MAX_COLS:
            solver.parameters.cp_model_presolve = False  # the (complete, feasible) hint is the first solution
        callback = _Progress(q, model.offset * model.scale, options.on_progress) if options.on_progress else None
        run = run_native(lambda: solver.solve(cp, callback), solver.stop_search, until=t0 + float(options.time_limit),
                         grace_s=STOP_GRACE_S, what="CP-SAT")
        if run.interrupted or run.abandoned:
            status = Status.INTERRUPTED if run.interrupted else Status.TIME_LIMIT_NO_SOLUTION
            return BackendResult(status, None, None, None, None, time.perf_counter() - t0, self.name, version(),
                                 "interrupted" if run.interrupted else "did not stop at its time limit; left behind")
        native = run.result
        has = native in (cp_model.OPTIMAL, cp_model.FEASIBLE)
        status = mapped(CPSAT_STATUS, native, has)
        label = solver.status_name(native)
        if status is Status.INFEASIBLE and rounded:
            # the rows CP-SAT saw were rounded to integers: its proof is for that model, not ours
            status, label = Status.ERROR, f"{label} with rounded coefficients (not a proof for the exact model)"
        x, objective, bound = None, None, None
        if has:
            x = solver.values(pd.Index(xs)).to_numpy(dtype=np.float64)
            objective = float(model.c @ x + model.offset) * model.scale  # exact objective of the returned point
            bound = min(float(solver.best_objective_bound) * q + model.offset * model.scale, objective)
        return BackendResult(status, x, None, objective, bound, time.perf_counter() - t0, self.name, version(),
                             label)


BACKEND = CpSat()


def build(model: MipArrays, warm_start: np.ndarray | None,
          until: float = math.inf) -> tuple[cp_model.CpModel, list, float, bool]:
    """The CP-SAT model of the arrays: (model, variables, objective quantum, whether rows were rounded).

    Every row and the objective are one weighted sum over the variables (one C++ call
    each, not a Python sum of terms); the loop touches only Python lists, since numpy
    scalars cost more per row than the call itself.  A warm start becomes the model's
    solution hint, written into the proto in one go (``add_hint`` per variable took
    half a second on an 80k-column model).  Stops with DeadlineExceeded once ``until``
    passes (an 80k-row model takes seconds).
    """
    cp = cp_model.CpModel()
    ub = np.where(np.isfinite(model.ub), model.ub, 2 ** 31 - 1).astype(np.int64)
    lb = model.lb.astype(np.int64)
    new = cp.new_int_var
    xs = [new(lo_, up, "") for lo_, up in zip(lb.tolist(), ub.tolist(), strict=True)]
    vals, lo, hi, rounded = integer_rows(model)
    order = np.argsort(model.rows, kind="stable")
    cols, vals = model.cols[order].tolist(), vals[order].tolist()
    bounds = np.searchsorted(model.rows[order], np.arange(model.n_rows + 1)).tolist()
    keep = np.isfinite(lo) | np.isfinite(hi)  # a row free on both sides constrains nothing
    lo_i = [math.ceil(v) if math.isfinite(v) else cp_model.INT_MIN for v in lo[keep].tolist()]
    hi_i = [math.floor(v) if math.isfinite(v) else cp_model.INT_MAX for v in hi[keep].tolist()]
    weighted_sum, add = cp_model.LinearExpr.weighted_sum, cp.add_linear_constraint
    clock = BuildClock("CP-SAT model building", len(lo_i), until)
    for k, (r, lo_r, hi_r) in enumerate(zip(np.flatnonzero(keep).tolist(), lo_i, hi_i, strict=True)):
        if k % 1024 == 0:
            clock.row(k)
        s, e = bounds[r], bounds[r + 1]
        add(weighted_sum([xs[c] for c in cols[s:e]], vals[s:e]), lo_r, hi_r)
    raw = model.c * model.scale  # integer-valued costs (the arrays hold them divided by scale)
    q = _quantum(raw, float(ub.sum()))
    obj = np.round(raw / q).astype(np.int64)
    nz = np.flatnonzero(obj)
    cp.minimize(weighted_sum([xs[i] for i in nz.tolist()], obj[nz].tolist()))
    if warm_start is not None:
        hint = cp.proto.solution_hint
        hint.vars.extend(range(len(xs)))
        hint.values.extend(np.clip(np.rint(warm_start), lb, ub).astype(np.int64).tolist())
    return cp, xs, q, len(rounded) > 0


class _Progress(cp_model.CpSolverSolutionCallback):
    """Forward each improving solution's objective and the bound to the caller (from the API)."""

    def __init__(self, factor: float, offset: float, report):
        super().__init__()
        self._factor, self._offset, self._report = factor, offset, report

    def on_solution_callback(self) -> None:
        self._report(self.objective_value * self._factor + self._offset,
                     self.best_objective_bound * self._factor + self._offset)
