"""PuLP with its bundled CBC: the design card's reference modeller.

PuLP writes the model as an MPS file and reads CBC's solution file back.  This
backend runs the CBC process itself (PuLP's own runner waits on it blindly):

* in a private temporary folder, deleted whatever happens (a run leaves ~4.5 MB of
  .mps/.sol files otherwise, and every interrupted one did);
* in its own process group, which is killed on a signal and at the end of every
  call, so no CBC outlives the call; and told to stop (SIGINT, then SIGKILL) when
  it runs past its time limit.

Ranged rows (both bounds finite and different) become two PuLP constraints, so
neither side is lost.  CBC exposes no dual bound (no Feature.LOWER_BOUND); LP
relaxations return duals (CBC's row prices), so column generation can run on PuLP.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import shutil
import signal
import subprocess
import tempfile
import time

import numpy as np
import pulp

from model.base.runtime import BuildClock, DeadlineExceeded, interrupt_signal, shielded, still_running
from solvers.backends.milp import MipArrays
from solvers.backends.result import BackendResult, Feature, SolveOptions, Status, mapped

STOP_GRACE_S = 0.25  # this long past its time limit CBC gets SIGINT (it then writes what it has) ...
KILL_GRACE_S = 0.5  # ... and SIGKILL this much later
# PuLP writes the MPS file (uninterruptibly) in about the time it took to build the problem:
# with less than this many build-times left, CBC would start past the limit
WRITE_FACTOR = 1.2
C = pulp.constants
# (LpStatus, LpSolution status) as PuLP reads CBC's solution file -> (Status when values came back,
# when none did).  "Stopped on time - objective value" reads as (Optimal, IntegerFeasible): CBC's
# time limit with an incumbent; "Stopped on ... (no integer solution - continuous used)" as
# (Not Solved, No Solution Found): its values are the LP's, not a plan.  "Integer infeasible"
# reads as (Infeasible, No Solution Found).  Our models cannot be unbounded (costs >= 0, columns >= 0).
PULP_STATUS: dict[tuple[int, int], tuple[Status, Status]] = {
    (C.LpStatusOptimal, C.LpSolutionOptimal): (Status.OPTIMAL, Status.ERROR),
    (C.LpStatusOptimal, C.LpSolutionIntegerFeasible): (Status.TIME_LIMIT_FEASIBLE, Status.ERROR),
    (C.LpStatusNotSolved, C.LpSolutionNoSolutionFound): (Status.TIME_LIMIT_NO_SOLUTION,
                                                         Status.TIME_LIMIT_NO_SOLUTION),
    (C.LpStatusInfeasible, C.LpSolutionInfeasible): (Status.INFEASIBLE, Status.INFEASIBLE),
    (C.LpStatusInfeasible, C.LpSolutionNoSolutionFound): (Status.INFEASIBLE, Status.INFEASIBLE),
    (C.LpStatusUnbounded, C.LpSolutionUnbounded): (Status.ERROR, Status.ERROR),
    (C.LpStatusUndefined, C.LpSolutionNoSolutionFound): (Status.ERROR, Status.ERROR),
}


@functools.cache
def version() -> str:
    return pulp.__version__ if hasattr(pulp, "__version__") else "unknown"


class Pulp:
    """The PuLP/CBC backend: LP with duals, MIP without a dual bound, warm starts, interruptible."""

    name = "pulp"
    features = frozenset({Feature.LP, Feature.MIP, Feature.LP_DUALS, Feature.WARM_START, Feature.TIME_LIMIT,
                          Feature.INTERRUPT})

    def version(self) -> str:
        return version()

    def solve(self, model: MipArrays, options: SolveOptions) -> BackendResult:
        """Translate the arrays into a PuLP problem, solve with CBC, read values (and LP duals)."""
        t0 = time.perf_counter()
        try:
            prob, xs, names = build(model, options.relax, t0 + float(options.time_limit))
        except DeadlineExceeded:
            return BackendResult(Status.TIME_LIMIT_NO_SOLUTION, None, None, None, None, time.perf_counter() - t0,
                                 self.name, version(), "time limit reached while building the model")
        built = time.perf_counter() - t0
        if t0 + float(options.time_limit) - time.perf_counter() < WRITE_FACTOR * built:
            return BackendResult(Status.TIME_LIMIT_NO_SOLUTION, None, None, None, None, time.perf_counter() - t0,
                                 self.name, version(), "no time left to write the model for CBC")
        warm = options.warm_start is not None and not options.relax
        if warm:
            for v, val, lo, up in zip(xs, options.warm_start, model.lb, model.ub, strict=True):
                v.setInitialValue(float(np.clip(round(val), lo, up)))  # CBC rejects a start off its bounds
        folder = tempfile.mkdtemp(prefix="shapeplan-cbc-")
        cbc = _Cbc(mip=not options.relax, msg=False, threads=int(options.threads), warmStart=warm,
                   gapRel=float(options.mip_gap))
        cbc.tmpDir = folder
        cbc.deadline = t0 + float(options.time_limit)
        try:
            prob.solve(cbc)
        finally:
            with shielded():
                shutil.rmtree(folder, ignore_errors=True)
        spent = time.perf_counter() - t0
        if cbc.outcome == "interrupted":
            return BackendResult(Status.INTERRUPTED, None, None, None, None, spent, self.name, version(), "interrupted")
        if cbc.outcome != "done":
            status = Status.TIME_LIMIT_NO_SOLUTION if cbc.outcome == "killed" else Status.ERROR
            return BackendResult(status, None, None, None, None, spent, self.name, version(), cbc.outcome)
        values = [v.varValue for v in xs]
        has = all(v is not None for v in values)
        status = mapped(PULP_STATUS, (prob.status, prob.sol_status), has)
        native = f"{C.LpStatus.get(prob.status, prob.status)} / {C.LpSolution.get(prob.sol_status, prob.sol_status)}"
        if not has or status not in (Status.OPTIMAL, Status.FEASIBLE, Status.TIME_LIMIT_FEASIBLE):
            return BackendResult(status, None, None, None, None, spent, self.name, version(), native)
        x = np.asarray(values, dtype=np.float64)
        objective = float(model.c @ x + model.offset) * model.scale
        duals = None
        if options.relax:
            duals = np.zeros(model.n_rows)
            for r, name in names:
                duals[r] += prob.constraints[name].pi or 0.0
            duals *= model.scale
        return BackendResult(status, x, duals, objective, objective if options.relax else None, spent, self.name,
                             version(), native)


BACKEND = Pulp()


def build(model: MipArrays, relax: bool, until: float = math.inf) -> tuple[pulp.LpProblem, list, list[tuple[int, str]]]:
    """The PuLP problem: (problem, variables, (model row, constraint name) of every constraint).

    A row with both bounds finite and different is two constraints (``r<i>_lo`` and
    ``r<i>``); a row with neither bound is left out.  Building is slow (about 20 us a
    row), so it stops with DeadlineExceeded once ``until`` passes.
    """
    prob = pulp.LpProblem("shapeplan", pulp.LpMinimize)
    integer = (model.integer & (not relax)).tolist()
    ub = [None if math.isinf(u) else u for u in model.ub.tolist()]
    xs = [prob.add_variable(f"v{i}", lo, up, pulp.LpInteger if whole else pulp.LpContinuous)
          for i, (lo, up, whole) in enumerate(zip(model.lb.tolist(), ub, integer, strict=True))]
    nz = np.flatnonzero(model.c).tolist()
    prob += pulp.LpAffineExpression([(xs[i], model.c[i]) for i in nz]) + model.offset
    order = np.argsort(model.rows, kind="stable")
    cols, vals = model.cols[order].tolist(), model.vals[order].tolist()
    bounds = np.searchsorted(model.rows[order], np.arange(model.n_rows + 1)).tolist()
    names: list[tuple[int, str]] = []
    clock = BuildClock("PuLP model building", model.n_rows, until, then=WRITE_FACTOR)
    for r, (lo, hi) in enumerate(zip(model.row_lo.tolist(), model.row_hi.tolist(), strict=True)):
        if r % 1024 == 0:
            clock.row(r)
        s, e = bounds[r], bounds[r + 1]
        terms = list(zip([xs[c] for c in cols[s:e]], vals[s:e], strict=True))
        if lo == hi:
            prob.addConstraint(pulp.LpConstraint(pulp.LpAffineExpression(terms), C.LpConstraintEQ, f"r{r}", hi))
            names.append((r, f"r{r}"))
            continue
        if not math.isinf(hi):
            prob.addConstraint(pulp.LpConstraint(pulp.LpAffineExpression(terms), C.LpConstraintLE, f"r{r}", hi))
            names.append((r, f"r{r}"))
        if not math.isinf(lo):
            prob.addConstraint(pulp.LpConstraint(pulp.LpAffineExpression(terms), C.LpConstraintGE, f"r{r}_lo", lo))
            names.append((r, f"r{r}_lo"))
    return prob, xs, names


class _Cbc(pulp.COIN_CMD):
    """PuLP's bundled CBC, run by us: own process group, killed on a signal, stopped past its time."""

    deadline = float("inf")  # CBC's time limit (-sec) is what is left of this when it starts
    outcome = "not run"  # done | interrupted | killed | failed (exit status n)

    def __init__(self, **kwargs):
        super().__init__(path=pulp.PULP_CBC_CMD.pulp_cbc_path, **kwargs)

    def solve_CBC(self, lp: pulp.LpProblem, use_mps: bool = True) -> int:  # noqa: N802 (PuLP's name)
        tmp_mps, tmp_sol, tmp_mst = self.create_tmp_files(lp.name, "mps", "sol", "mst")
        vs, variable_names, constraint_names, _ = lp.writeMPS(tmp_mps, rename=1)
        args = [self.path, tmp_mps]
        if self.optionsDict.get("warmStart", False):
            self.writesol(tmp_mst, lp, vs, variable_names, constraint_names)
            args += ["-mips", tmp_mst]
        for option in self.options + self.getOptions():
            args += ("-" + option).split()
        left = self.deadline - time.perf_counter()
        if left <= 0:  # writing the files spent the time
            self.outcome = "killed"
            lp.assignStatus(C.LpStatusNotSolved, C.LpSolutionNoSolutionFound)
            return C.LpStatusNotSolved
        args += ["-sec", f"{left:.3f}", "-solve" if self.mip else "-initialSolve", "-printingOptions", "all",
                 "-solution", tmp_sol]
        self.outcome = _run(args, self.deadline + STOP_GRACE_S)
        if self.outcome == "done" and os.path.exists(tmp_sol):
            status, values, reduced, prices, slacks, sol_status = self.readsol_MPS(
                tmp_sol, lp, vs, variable_names, constraint_names)
            lp.assignVarsVals(values)
            lp.assignVarsDj(reduced)
            lp.assignConsPi(prices)
            lp.assignConsSlack(slacks, activity=True)
            lp.assignStatus(status, sol_status)
            return status
        if self.outcome == "done":
            self.outcome = "failed (no solution file)"
        lp.assignStatus(C.LpStatusUndefined, C.LpSolutionNoSolutionFound)
        return C.LpStatusUndefined


def _run(args: list[str], until: float) -> str:
    """Run CBC in its own process group; the group never outlives this call.

    Returns "done" (it exited 0), "interrupted" (a signal came: killed at once),
    "killed" (past ``until``: SIGINT, which makes CBC write what it has, then SIGKILL
    if it does not exit) or "failed (exit status n)".
    """
    with shielded():
        proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
    told = None
    started = time.perf_counter()
    try:
        with shielded():
            while True:
                try:
                    code = proc.wait(0.05)
                    break
                except subprocess.TimeoutExpired:
                    pass
                still_running("CBC", started)
                if interrupt_signal() is not None:
                    _kill(proc, signal.SIGKILL)
                    proc.wait()
                    return "interrupted"
                now = time.perf_counter()
                if told is None and now > until:
                    told = now
                    _kill(proc, signal.SIGINT)
                elif told is not None and now > told + KILL_GRACE_S:
                    _kill(proc, signal.SIGKILL)
                    proc.wait()
                    return "killed"
    finally:
        if proc.poll() is None:
            _kill(proc, signal.SIGKILL)
            proc.wait()
    if interrupt_signal() is not None:
        return "interrupted"
    if code != 0:
        return "killed" if told is not None else f"failed (exit status {code})"
    return "done"


def _kill(proc: subprocess.Popen, sig: int) -> None:
    """Send a signal to the solver's whole process group (it may already be gone)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)
