"""OR-Tools CP-SAT: strong incumbents on large instances; needs integer coefficients.

Fractional rows are scaled so that their coefficient sums stay far below 2**31 and
rounded to the nearest integer (rounding every coefficient up instead rejected plans
lying exactly on a limit); the rare plan a rounding lets past a limit by a hair is
caught by the planner's exact re-evaluation and repaired.  The objective is the raw
integer cost divided by a power-of-ten quantum chosen the same way.  No LP relaxation
and no duals: column generation always runs on HiGHS.
"""

from __future__ import annotations

import time

import numpy as np
from ortools.sat.python import cp_model

from model.formulation.arrays import MipArrays
from solvers.backends.result import BackendResult, SolveOptions

NAME = "cpsat"
FEATURES = frozenset({"mip", "bound", "warm_start", "time_limit", "progress"})
SUM_LIMIT = 2 ** 27  # keep |coefficient| * (sum of upper bounds) below this, far below 2**31


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
    """Row coefficients and bounds as integers: exact where already integral, else scaled and rounded."""
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
    big = np.abs(vals) > SUM_LIMIT
    for r in np.unique(model.rows[big]):  # raw-cost rows (the cost limit): divide down, stay conservative
        sel = model.rows == r
        q = _quantum(vals[sel], float(ub[model.cols[sel]].sum()))
        vals[sel] = np.round(vals[sel] / q)
        if np.isfinite(hi[r]):
            hi[r] = np.floor(hi[r] / q + 1e-9)
    return np.round(vals).astype(np.int64), lo, hi, bad_rows


def solve(model: MipArrays, options: SolveOptions) -> BackendResult:
    """Solve the integer model with CP-SAT (LP relaxations are not supported: see FEATURES)."""
    t0 = time.perf_counter()
    if options.relax or not model.integer.all():
        return BackendResult("error", None, None, None, None, 0.0, NAME, version())
    cp = cp_model.CpModel()
    ub = np.where(np.isfinite(model.ub), model.ub, 2 ** 31 - 1).astype(np.int64)
    xs = [cp.NewIntVar(int(lo_), int(up), f"v{i}")
          for i, (lo_, up) in enumerate(zip(model.lb.astype(np.int64), ub, strict=True))]
    vals, lo, hi, _ = integer_rows(model)
    order = np.argsort(model.rows, kind="stable")
    rows, cols, vals = model.rows[order], model.cols[order], vals[order]
    bounds = np.searchsorted(rows, np.arange(model.n_rows + 1))
    for r in range(model.n_rows):
        s, e = bounds[r], bounds[r + 1]
        expr = sum(int(v) * xs[int(c)] for c, v in zip(cols[s:e], vals[s:e], strict=True))
        if np.isfinite(lo[r]) and np.isfinite(hi[r]) and lo[r] == hi[r]:
            cp.Add(expr == int(hi[r]))
            continue
        if np.isfinite(hi[r]):
            cp.Add(expr <= int(np.floor(hi[r])))
        if np.isfinite(lo[r]):
            cp.Add(expr >= int(np.ceil(lo[r])))
    raw = model.c * model.scale  # integer-valued costs (the arrays hold them divided by scale)
    q = _quantum(raw, float(ub.sum()))
    obj = np.round(raw / q).astype(np.int64)
    cp.Minimize(sum(int(o) * xs[i] for i, o in enumerate(obj) if o))
    if options.warm_start is not None:
        for i, v in enumerate(np.rint(options.warm_start).astype(np.int64)):
            cp.AddHint(xs[i], int(v))
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = float(options.time_limit)
    solver.parameters.num_workers = int(options.threads)
    solver.parameters.random_seed = int(options.seed)
    solver.parameters.relative_gap_limit = float(options.mip_gap)
    callback = _Progress(xs, q, model.offset * model.scale, options.on_progress) \
        if options.on_progress else None
    status = solver.Solve(cp, callback) if callback else solver.Solve(cp)
    label = {cp_model.OPTIMAL: "optimal", cp_model.FEASIBLE: "time_limit", cp_model.INFEASIBLE: "infeasible"}.get(
        status, "error")
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        x = np.array([solver.Value(v) for v in xs], dtype=np.float64)
        objective = float(model.c @ x + model.offset) * model.scale  # exact objective of the returned point
        bound = float(solver.BestObjectiveBound()) * q + model.offset * model.scale
        bound = min(bound, objective)
    else:
        x, objective, bound = None, None, None
    return BackendResult(label, x, None, objective, bound, time.perf_counter() - t0, NAME, version())


class _Progress(cp_model.CpSolverSolutionCallback):
    """Forward each improving solution's objective and the bound to the caller (from the API)."""

    def __init__(self, xs, factor: float, offset: float, report):
        super().__init__()
        self._factor, self._offset, self._report = factor, offset, report

    def on_solution_callback(self) -> None:
        self._report(self.ObjectiveValue() * self._factor + self._offset,
                     self.BestObjectiveBound() * self._factor + self._offset)
