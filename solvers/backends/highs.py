"""HiGHS through highspy, fed the model's arrays directly (the main backend).

Reads status, objective, dual bound and duals through the API; accepts a warm start;
single random seed, so runs repeat.  A run happens in a helper thread so a signal
reaches the main thread at once, which then stops HiGHS through its interrupt
callbacks; a big MIP runs in a child process instead, which can be killed (HiGHS's
root analytic centre polls no interrupt).
"""

from __future__ import annotations

import functools
import logging
import os
import pickle
import queue
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace

import highspy
import numpy as np

from model.base.runtime import die_with_parent, interrupt_signal, run_native, shielded, still_running
from solvers.backends.milp import MipArrays
from solvers.backends.result import BackendResult, Feature, SolveOptions, Status, mapped

log = logging.getLogger("shapeplan")
# HiGHS's MIP presolve cannot be interrupted: on an 80k-column box model it ran 58 s
# past a 3 s limit (with it off the limit held to 1 s), so large MIPs skip it
PRESOLVE_MAX_COLS = 20_000
STOP_GRACE_S = 0.5  # a run still going this long after its time limit is left behind (see run_native)
CHILD_MIN_COLS = PRESOLVE_MAX_COLS  # MIPs above this run in a child process (see solve_in_child) ...
KILL_GRACE_S = 0.25  # ... their HiGHS limit this much (and their start) short of the call's, killed at the call's
STALL_REL = 1e-9  # an incumbent counts as better (restarting the stall clock) by at least this share
# Starting a child costs about half a second (interpreter, numpy, highspy) plus sending the model through a
# pipe (about 50 MB/s measured: 0.75 s for a 415k-column flow model).  With less time than that the call
# could only overrun its deadline, so it returns the warm start (or nothing) instead.
CHILD_START_S = 0.5
CHILD_PIPE_BYTES_PER_S = 50e6
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
                          Feature.TIME_LIMIT, Feature.INTERRUPT, Feature.PROGRESS, Feature.STALL})

    def version(self) -> str:
        return version()

    def solve(self, model: MipArrays, options: SolveOptions) -> BackendResult:
        """Solve the model (or its LP relaxation) and report what HiGHS says through its API.

        A MIP above CHILD_MIN_COLS columns runs in a child process (see ``solve_in_child``),
        anything smaller in a helper thread of this one.
        """
        if not options.relax and model.n_cols > CHILD_MIN_COLS:
            if float(options.time_limit) < child_start_s(model):
                return _incumbent_result(model, options.warm_start, time.perf_counter(),
                                         "too little time to start a HiGHS process")
            return solve_in_child(model, options)
        t0 = time.perf_counter()
        h = configured(model, options)
        if time.perf_counter() - t0 >= float(options.time_limit):  # passing a huge model spent the time
            return BackendResult(Status.TIME_LIMIT_NO_SOLUTION, None, None, None, None, time.perf_counter() - t0,
                                 self.name, version(), "time limit reached while passing the model")
        incumbent = [options.warm_start] if options.warm_start is not None and not options.relax else [None]
        stall = None if options.relax or options.stall_s is None else Stall(float(options.stall_s), t0)
        if not options.relax:
            _subscribe_progress(h, model, options.on_progress, incumbent, stall)
        stop = threading.Event()
        _subscribe_interrupt(h, t0 + float(options.time_limit), stop, stall)
        # HiGHS counts its limit from run(): give it what passing the model left
        h.setOptionValue("time_limit", max(0.01, float(options.time_limit) - (time.perf_counter() - t0)))
        run = run_native(h.run, stop.set, until=t0 + float(options.time_limit), grace_s=STOP_GRACE_S,
                         what=f"HiGHS {'LP' if options.relax else 'MIP'}")
        if run.interrupted:
            return BackendResult(Status.INTERRUPTED, None, None, None, None, time.perf_counter() - t0, self.name,
                                 version(), "interrupted")
        if run.abandoned:  # it polled no interrupt in time: what it had found (or the start) is the answer
            return _incumbent_result(model, incumbent[0], t0, "did not stop at its time limit; left behind")
        if stall is not None and stall.hit:
            return stalled_result(model, incumbent[0], t0, stall.seconds)
        return read_result(h, model, options.relax, t0)


BACKEND = Highs()


def configured(model: MipArrays, options: SolveOptions) -> highspy.Highs:
    """A Highs instance holding the model (and the warm start), with the options set."""
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
    return h


def read_result(h: highspy.Highs, model: MipArrays, relax: bool, t0: float) -> BackendResult:
    """What HiGHS says after a run: its status through HIGHS_STATUS, values, duals, objective and bound."""
    native = h.getModelStatus()
    info = h.getInfo()
    sol = h.getSolution()
    x = np.asarray(sol.col_value) if sol.value_valid else None
    status = mapped(HIGHS_STATUS, native, x is not None)
    if x is not None and not relax and status is Status.TIME_LIMIT_FEASIBLE and not satisfies(model, x):
        # stopped before any solution of its own, HiGHS hands back the start it was given even where the start
        # breaks a row: that is no solution
        x = None
        status = mapped(HIGHS_STATUS, native, False)
    if x is not None and status in (Status.ERROR, Status.INFEASIBLE, Status.TIME_LIMIT_NO_SOLUTION):
        x = None  # values that come with no usable status (an LP's, a failed run's) are no plan
    duals = np.asarray(sol.row_dual) * model.scale if (relax and sol.dual_valid) else None
    objective = float(info.objective_function_value) * model.scale if x is not None else None
    if relax:
        bound = objective if status is Status.OPTIMAL else None
    else:
        bound = float(info.mip_dual_bound) * model.scale if np.isfinite(info.mip_dual_bound) else None
    return BackendResult(status, x, duals, objective, bound, time.perf_counter() - t0, "highs", version(),
                         h.modelStatusToString(native))


def _incumbent_result(model: MipArrays, x, t0: float, native: str) -> BackendResult:
    """A run we stopped waiting for: its last incumbent (or the warm start), if it is a solution of the model."""
    x = None if x is None else np.asarray(x, dtype=np.float64)
    if x is not None and not satisfies(model, x):
        x = None
    status = Status.TIME_LIMIT_NO_SOLUTION if x is None else Status.TIME_LIMIT_FEASIBLE
    objective = None if x is None else float(model.c @ x + model.offset) * model.scale
    return BackendResult(status, x, None, objective, None, time.perf_counter() - t0, "highs", version(), native)


def stalled_result(model: MipArrays, x, t0: float, stall_s: float) -> BackendResult:
    """A MIP we ended because it found no better incumbent for ``stall_s`` seconds: its best (or the start) as a
    FEASIBLE result -- it stopped by its own rule, not the clock -- and no solution where it has none."""
    got = _incumbent_result(model, x, t0, f"stalled: no better incumbent in {stall_s:.1f} s; time given back")
    return replace(got, status=Status.FEASIBLE if got.x is not None else got.status, stalled=True)


def child_start_s(model: MipArrays) -> float:
    """Seconds a child process needs before HiGHS even starts on ``model`` (see CHILD_START_S)."""
    size = sum(a.nbytes for a in (model.c, model.lb, model.ub, model.rows, model.cols, model.vals, model.row_lo,
                                  model.row_hi))
    return CHILD_START_S + size / CHILD_PIPE_BYTES_PER_S


def solve_in_child(model: MipArrays, options: SolveOptions) -> BackendResult:
    """A big MIP in a child process, killed at the call's time limit or on a signal; HiGHS in it gets the
    limit less its start (``child_start_s``) and KILL_GRACE_S, so it normally stops and reports first.

    At the root of a big MIP HiGHS computes an analytic centre in a task it waits for
    and cannot interrupt: on twin-1's 80k-column polish MIP that ran 20-45 s past the
    limit, and a thread left running blocked the next solve just as long.  A process
    can be killed.  Incumbents come back as they are found, so a killed run still
    returns its best (or the warm start).  The child is a plain ``python -c`` (not
    multiprocessing, which re-imports the parent's main script) in its own session,
    talking pickles over its stdin and stdout.
    """
    t0 = time.perf_counter()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    # the child's own limit leaves room for its start and for stopping it, so the call ends by its limit
    own = max(0.05, float(options.time_limit) - child_start_s(model) - KILL_GRACE_S)
    plain = SolveOptions(time_limit=own, relax=False, mip_gap=options.mip_gap,
                         warm_start=options.warm_start, threads=options.threads, seed=options.seed)
    with shielded():
        child = subprocess.Popen([sys.executable, "-c",
                                  f"from solvers.backends.highs import child_main; child_main({os.getpid()})"],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, start_new_session=True)
    log.info("HiGHS MIP in its own process (pid %d)", child.pid)
    messages: queue.Queue = queue.Queue()
    reader = threading.Thread(target=_read_messages, args=(child.stdout, messages), daemon=True)
    reader.start()
    incumbent = options.warm_start
    until = t0 + max(float(options.time_limit), own + KILL_GRACE_S)
    best, improved = np.inf, t0  # the stall clock runs from the call's start (a start it never beats counts)
    try:
        with shielded():
            try:
                pickle.dump((model, plain), child.stdin, protocol=pickle.HIGHEST_PROTOCOL)
                child.stdin.close()
            except OSError:
                return _incumbent_result(model, incumbent, t0, "the HiGHS process did not start")
            while True:
                try:
                    kind, *data = messages.get(timeout=0.05)
                except queue.Empty:
                    kind = None
                if kind == "done":
                    return replace(data[0], time_s=time.perf_counter() - t0)
                if kind == "incumbent":
                    incumbent = data[2]
                    if data[0] < best * (1 - STALL_REL):
                        best, improved = data[0], time.perf_counter()
                    if options.on_progress is not None:
                        options.on_progress(data[0], data[1])
                    continue
                if kind == "end":
                    return _incumbent_result(model, incumbent, t0, f"the HiGHS process died ({child.poll()})")
                still_running("HiGHS MIP (its own process)", t0)
                if interrupt_signal() is not None:
                    return BackendResult(Status.INTERRUPTED, None, None, None, None, time.perf_counter() - t0,
                                         "highs", version(), "interrupted")
                if time.perf_counter() > until:
                    return _incumbent_result(model, incumbent, t0, "did not stop at its time limit; stopped")
                if options.stall_s is not None and time.perf_counter() - improved > options.stall_s:
                    return stalled_result(model, incumbent, t0, options.stall_s)
    finally:
        with shielded():
            if child.poll() is None:
                child.kill()
            child.wait()
            reader.join(1.0)
            child.stdout.close()


def _read_messages(stream, messages: queue.Queue) -> None:
    """The child's pickled messages into a queue, then ("end",) when its stdout closes."""
    try:
        while True:
            messages.put(pickle.load(stream))
    except Exception:  # EOF or a torn message: the child is gone
        messages.put(("end",))


def child_main(parent: int | None = None) -> None:
    """The child process: read (model, options), solve, send each incumbent and then the result; killed with
    ``parent`` (the planner's pid) if that dies first (a SIGKILLed planner left it running to its own limit)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when this process ends
    if parent is not None:
        die_with_parent(parent)
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything HiGHS prints goes to stderr, not into the messages
    model, options = pickle.load(sys.stdin.buffer)
    t0 = time.perf_counter()
    h = configured(model, options)

    def send(message) -> None:
        pickle.dump(message, out, protocol=pickle.HIGHEST_PROTOCOL)
        out.flush()

    def on_improve(event) -> None:
        data = event.data_out
        send(("incumbent", float(data.objective_function_value) * model.scale, float(data.mip_dual_bound) * model.scale,
              np.array(data.mip_solution, dtype=np.float64)))

    h.cbMipImprovingSolution.subscribe(on_improve)
    h.setOptionValue("time_limit", max(0.01, float(options.time_limit) - (time.perf_counter() - t0)))
    h.run()
    send(("done", read_result(h, model, False, t0)))
    out.close()


def satisfies(model: MipArrays, x: np.ndarray, tol: float = 1e-6) -> bool:
    """x meets the model's bounds, rows and integrality (a start HiGHS was given is not checked for us)."""
    if len(x) != model.n_cols or (x < model.lb - tol).any() or (x > model.ub + tol).any():
        return False
    if (np.abs(x[model.integer] - np.round(x[model.integer])) > tol).any():
        return False
    act = np.bincount(model.rows, weights=model.vals * x[model.cols], minlength=model.n_rows)
    scale = np.maximum(1.0, np.abs(act))
    return bool(((act >= model.row_lo - tol * scale) & (act <= model.row_hi + tol * scale)).all())


class Stall:
    """The stall clock of one MIP run in this process: when it last found a better incumbent (from the call's
    start), and whether it was stopped for finding none for ``seconds``."""

    def __init__(self, seconds: float, t0: float):
        self.seconds, self.improved, self.best, self.hit = seconds, t0, np.inf, False

    def found(self, objective: float) -> None:
        """An incumbent of this objective came: a better one restarts the clock."""
        if objective < self.best * (1 - STALL_REL):
            self.best, self.improved = objective, time.perf_counter()

    def due(self) -> bool:
        """Whether the run has gone ``seconds`` without a better incumbent (then it is marked as stalled)."""
        self.hit = self.hit or time.perf_counter() - self.improved > self.seconds
        return self.hit


def _subscribe_interrupt(h, until: float, stop: threading.Event, stall: Stall | None = None) -> None:
    """Interrupt HiGHS from its own callbacks once the wall-clock budget is spent or ``stop`` is set.

    HiGHS's time_limit option is not honoured everywhere: proving a large MIP
    infeasible ran for minutes past it here.  The interrupt callbacks fire inside
    simplex, IPM and branch-and-bound, so the budget holds; ``stop`` is set by the
    main thread on a signal (see ``model.base.runtime.run_native``).
    """
    def check(event) -> None:
        if stop.is_set() or time.perf_counter() > until or (stall is not None and stall.due()):
            event.interrupt()

    for name in ("cbMipInterrupt", "cbSimplexInterrupt", "cbIpmInterrupt"):
        hook = getattr(h, name, None)
        if hook is not None:
            hook.subscribe(check)


def _subscribe_progress(h, model: MipArrays, report, incumbent: list, stall: Stall | None = None) -> None:
    """Keep each improved incumbent in ``incumbent[0]`` and forward it (with the bound) to ``report`` (and to the
    stall clock)."""
    def on_improve(event):
        data = event.data_out
        incumbent[0] = np.array(data.mip_solution, dtype=np.float64)
        if stall is not None:
            stall.found(float(data.objective_function_value) * model.scale)
        if report is not None:
            report(float(data.objective_function_value) * model.scale, float(data.mip_dual_bound) * model.scale)

    try:
        h.cbMipImprovingSolution.subscribe(on_improve)
    except AttributeError:  # older highspy: no callbacks, progress is only reported at the end
        pass
