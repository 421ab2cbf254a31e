"""The windowed planner with compiled batch sizes (batch buckets): candidates judged exactly, a bound priced at graphs.

The windowed planner's own bound (``model.planning.window_bound``) prices a batch of n by
the free batch's T(n) -- its LP prices and its floors -- which is no bound where a batch of
n runs in its graph's T(B(n)) (the ``decode_large`` regime can make the larger graph
cheaper), and its exact enumeration and runs plan charge a compile per shape, not per
graph, nor know the graph cap.  So with batch buckets the windowed problem is planned here:

- Bound: the shape relaxation priced at graphs of the trace without windows
  (``device_search.shape_relaxation``: every request pays at least its share of a full
  graph of its size class, a compile per shape, the best K shapes).  Windows only forbid
  batches, and their waits only add latency, so every windowed plan is a plan of that
  relaxation: the bound holds for the windowed problem.
- Candidates: the MIP planner's plan of the trace without windows (graphs, graph cap and
  all), its batches cut at the window ends; every packer's windowed plan (they keep to
  windows and buckets); dpfill under the MIP plan's shapes.  Each is judged exactly --
  waits, spikes, limits, the graph cap -- and the cheapest that meets every limit is
  returned; with none, the packers are judged past the deadline until one does, and only
  then is it NoPlanFound (never a proof: the candidates are not every plan).

With ``--batch-buckets auto`` this runs over the candidate buckets and ``pipeline``
reports the bound over every bucket list (``model.planning.bucket_choice``).
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from model.base.errors import NoPlanFound
from model.base.runtime import Deadline
from model.domain.schema import Planned, Problem
from model.histogram.cells import build_histogram
from model.packers import PACKERS
from model.planning.contract import Candidates, Judge, select
from model.planning.device_search import shape_relaxation
from model.planning.options import PlannerOptions
from model.planning.windowed import PACKER_ORDER, acceptable, late_packers, packer_candidates, plain_plan
from solvers.backends import get_backend

PLAIN_SHARE = 0.6  # of the time limit: the MIP planner on the trace without windows
BOUND_SHARE = 0.15  # of the time limit: the shape relaxation


def plan_windowed_graphs(problem: Problem, backend: str = "highs", time_limit: float = 60.0, *,
                         judge: Judge) -> Planned:
    """Plan a windowed problem with batch buckets (see module docstring); the bound covers the windowed problem."""
    t0 = time.perf_counter()
    deadline = Deadline.after(time_limit)
    solver = get_backend(backend)
    plain = replace(problem, windowing=None)
    bound = float(shape_relaxation(plain, [build_histogram(b) for b in plain.buckets],
                                   deadline.share(BOUND_SHARE)).bound)
    found = []
    cut = plain_plan(problem, backend, judge, deadline.share(PLAIN_SHARE))
    first = acceptable(problem, judge, "mip", cut, ("the MIP's plan of the trace without windows, its batches cut "
                                                     "at the window ends",))
    found += [first] if first is not None else []
    if cut is not None:
        shapes = tuple(sorted({int(s) for bt in cut for s in np.unique(bt.shape_of)}))
        same = replace(problem, allowed_shapes=shapes)
        try:
            dp = acceptable(problem, judge, "dpfill", PACKERS["dpfill"](same),
                            ("dpfill under the shapes of the MIP's plan without windows",))
        except NoPlanFound:
            dp = None
        found += [dp] if dp is not None else []
    packers = [j for j in packer_candidates(problem, judge, deadline, 0.0, PlannerOptions()) if j.acceptable]
    found += packers
    if not found:
        late = [j for j in late_packers(problem, judge, set()) if j.acceptable]
        found += late
    if not found:
        raise NoPlanFound("windows with batch buckets: no candidate plan (the MIP's without windows cut at the "
                          f"window ends, the packers {', '.join(PACKER_ORDER)}) meets every limit; not proven "
                          "infeasible")
    notes = ("windows with batch buckets: candidates judged exactly (the MIP's plan without windows cut at the "
             "window ends, dpfill under its shapes, every packer); the bound is the shape relaxation priced at "
             "graphs of the trace without windows, which every windowed plan satisfies",)
    chosen, report = select(Candidates(tuple(found), bound if np.isfinite(bound) else None, solver.name,
                                       solver.version(), t0, deadline, lead=notes))
    return Planned(chosen.batchings, report, chosen.plans, chosen.evaluation)

