"""PuLP with its bundled CBC: the design card's reference modeller.

PuLP labels a run cut by its time limit "Optimal" and exposes no dual bound, so this
backend reports status "feasible" for any MIP run that returned values (the planner
validates every solution and certifies the gap with its own bound) and ``bound=None``.
LP relaxations return duals (CBC's ``pi``), so column generation can run on PuLP too.
"""

from __future__ import annotations

import time

import numpy as np
import pulp

from model.formulation.arrays import MipArrays
from solvers.backends.result import BackendResult, SolveOptions

NAME = "pulp"
FEATURES = frozenset({"lp", "mip", "duals", "time_limit", "warm_start"})


def version() -> str:
    return pulp.__version__ if hasattr(pulp, "__version__") else "unknown"


def solve(model: MipArrays, options: SolveOptions) -> BackendResult:
    """Translate the arrays into a PuLP problem, solve with CBC, read values (and LP duals)."""
    t0 = time.perf_counter()
    prob = pulp.LpProblem("shapeplan", pulp.LpMinimize)
    cat = lambda i: pulp.LpInteger if (model.integer[i] and not options.relax) else pulp.LpContinuous  # noqa: E731
    xs = [pulp.LpVariable(f"v{i}", lowBound=float(model.lb[i]),
                          upBound=None if np.isinf(model.ub[i]) else float(model.ub[i]), cat=cat(i))
          for i in range(model.n_cols)]
    prob += pulp.LpAffineExpression([(xs[i], float(model.c[i])) for i in np.flatnonzero(model.c)]) + model.offset
    order = np.argsort(model.rows, kind="stable")
    rows, cols, vals = model.rows[order], model.cols[order], model.vals[order]
    bounds = np.searchsorted(rows, np.arange(model.n_rows + 1))
    cons = []
    for r in range(model.n_rows):
        s, e = bounds[r], bounds[r + 1]
        expr = pulp.LpAffineExpression([(xs[int(c)], float(v)) for c, v in zip(cols[s:e], vals[s:e], strict=True)])
        lo, hi = model.row_lo[r], model.row_hi[r]
        if np.isfinite(lo) and lo == hi:
            con = expr == float(hi)
        elif np.isfinite(hi):
            con = expr <= float(hi)
        else:
            con = expr >= float(lo)
        name = f"r{r}"
        prob += con, name
        cons.append(name)
    if options.warm_start is not None and not options.relax:
        for v, val in zip(xs, options.warm_start, strict=True):
            v.setInitialValue(float(round(val)))
    solver = pulp.PULP_CBC_CMD(msg=False, timeLimit=float(options.time_limit), threads=int(options.threads),
                               warmStart=options.warm_start is not None and not options.relax,
                               gapRel=float(options.mip_gap))
    prob.solve(solver)
    values = [v.varValue for v in xs]
    if any(v is None for v in values) or pulp.LpStatus[prob.status] in ("Infeasible", "Unbounded", "Not Solved"):
        label = "infeasible" if pulp.LpStatus[prob.status] == "Infeasible" else "error"
        return BackendResult(label, None, None, None, None, time.perf_counter() - t0, NAME, version())
    x = np.asarray(values, dtype=np.float64)
    objective = float(model.c @ x + model.offset) * model.scale
    duals = None
    if options.relax:
        duals = np.array([prob.constraints[n].pi or 0.0 for n in cons]) * model.scale
    label = "optimal" if options.relax else "feasible"
    return BackendResult(label, x, duals, objective, objective if options.relax else None,
                         time.perf_counter() - t0, NAME, version())
