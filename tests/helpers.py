"""Small helpers shared by the test modules: in-memory buckets, problems, plan checks, a brute-force optimum.

Imported as ``from helpers import ...`` (pytest puts ``tests/`` on ``sys.path``).
"""

from __future__ import annotations

import contextlib
import functools
import heapq
import importlib
import io
import itertools
import logging
import os
import subprocess
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from model import pipeline
from model.cli_common import run_main
from model.cost.common import align
from model.cost.metrics import Metrics
from model.cost.model import CostModel, cost_model, needs_profile
from model.domain.schema import Batching, Bucket, Limits, Planned, Problem, SolveReport, Status
from model.domain.windowing import waits_of, windows_of
from model.evaluation.validate import BucketResult, evaluate_plans, limit_checks
from model.formulation.arrays import Restriction, build_model, restriction
from model.formulation.boxes import BucketModel, bucket_model, candidate_grid
from model.histogram.cells import build_histogram
from solvers.backends.milp import MipArrays

REPO = Path(__file__).resolve().parents[1]


def cli(module: str, *argv: str, cwd: Path) -> subprocess.CompletedProcess:
    """``python -m module argv`` run in this process, from ``cwd``: exit status, stdout, stderr (log lines included).

    The end-to-end tests of plans, reports and messages use this; the tests of what only a real process
    shows (signals, leftover files and children, a bare environment) keep ``subprocess``.  In process it
    saves the interpreter's start-up and imports (about 0.7 s a run).
    """
    main = importlib.import_module(module).main
    out, err = io.StringIO(), io.StringIO()
    handler = logging.StreamHandler(err)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger = logging.getLogger("shapeplan")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING if "--quiet" in argv else logging.INFO)
    here = os.getcwd()
    code: int | str | None = 0
    try:
        os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                run_main(lambda: main(list(argv)))
            except SystemExit as stop:
                code = stop.code
    finally:
        os.chdir(here)
        logger.removeHandler(handler)
        logger.setLevel(level)
    return subprocess.CompletedProcess([module, *argv], code if isinstance(code, int) else 1, out.getvalue(),
                                       err.getvalue())
class FakeClock:
    """``time.perf_counter`` as the code under test sees it: the real clock plus the jumps a test makes.

    Deadlines (``model.base.runtime.Deadline``) read ``time.perf_counter``, so a test makes the time limit pass
    at an exact point of the work -- "the MIP took all the time" -- by jumping, and then counts what the code
    does after it, instead of sleeping and asserting seconds, which a loaded host breaks.
    """

    def __init__(self, monkeypatch, frozen: bool = False) -> None:
        self.offset = 0.0
        real = time.perf_counter
        start = real()
        # frozen: only the jumps move the clock, so nothing the host does in between counts
        monkeypatch.setattr(time, "perf_counter", (lambda: start + self.offset) if frozen
                            else (lambda: real() + self.offset))

    def jump(self, seconds: float) -> None:
        self.offset += seconds

    def now(self) -> float:
        return time.perf_counter()


DATA = REPO / "data"
WORKLOADS = DATA / "workloads"  # copies of the shared twin workloads (a bare clone tests itself)
TRACES = DATA / "traces"  # the Azure traces (CC-BY-4.0, see data/traces/LICENSE)


def bucket(prompts: list[int], gens: list[int], name: str = "b") -> Bucket:
    """A bucket built in memory, ids <name>-r0, <name>-r1, ... in file order."""
    n = len(prompts)
    return Bucket(name, f"<{name}>", np.array([f"{name}-r{i}" for i in range(n)], dtype=object),
                  np.array(prompts, dtype=np.int64), np.array(gens, dtype=np.int64), np.arange(1, n + 1))


def problem(*buckets: Bucket, k: int = 8, limits: Limits = Limits(), mode: str | None = None, params=None,
            **kw) -> Problem:
    """A problem over the given buckets, every bucket under the same limits; ``mode`` and ``params`` (or
    ``cost`` itself) give its cost model (``cost_model(mode, params)``, reference by default)."""
    if mode is not None or params is not None:
        assert "cost" not in kw, "give mode/params or cost, not both"
        kw["cost"] = cost_model(mode or "reference", params)
    return Problem(buckets, tuple(limits for _ in buckets), k, **kw)


def mode_cost(mode: str, profile=None, params=None) -> CostModel:
    """The cost model of a mode named in a parametrisation: ``profile`` where the mode prices with a device
    profile, else ``params`` (None: the seed's coefficients)."""
    return cost_model(mode, profile if needs_profile(mode) else params)


def planned(batchings: tuple[Batching, ...]) -> Planned:
    """Batchings wrapped as a planner's output, so they go through the real expansion."""
    return Planned(batchings, SolveReport(Status.HEURISTIC, None, None, None, 0.0, "test", "1"))


def evaluated(prob: Problem, plan: Planned) -> list[BucketResult]:
    """The evaluator's verdict on a planner's output after the real expansion; no cross-bucket problem allowed."""
    results, global_problems = evaluate_plans(prob, pipeline.expand(prob, plan))
    assert not global_problems, global_problems
    return results


def check_valid(prob: Problem, batchings: tuple[Batching, ...]) -> list[BucketResult]:
    """The Batching contract, then the evaluator's rules: no violation, at most K shapes jointly."""
    assert len(batchings) == len(prob.buckets)
    for b, bt in zip(prob.buckets, batchings, strict=True):
        nb = len(bt.shape_of)
        assert sorted(set(bt.batch_of.tolist())) == list(range(nb)), "batches 0..nb-1, each non-empty"
        assert (bt.shape_of % 64 == 0).all() and (bt.shape_of[bt.batch_of] >= align(b.prompt_len)).all()
        if prob.max_batch_size is not None:
            assert np.bincount(bt.batch_of).max() <= prob.max_batch_size
    results = evaluated(prob, planned(batchings))
    assert all(not r.violations for r in results), [r.violations for r in results]
    assert len(set().union(*(set(r.metrics.shapes) for r in results))) <= prob.max_shapes
    return results


def broken_limits(results: list[BucketResult]) -> list[str]:
    """'<bucket> <metric> <value> > <limit>' for every limit a plan breaks (empty: all met)."""
    return [f"{r.name} {c.metric} {c.value!r} > {c.limit!r}" for r in results for c in r.checks if not c.ok]


# ---------------------------------------------------------------- the whole model, every box


@dataclass(frozen=True, eq=False)
class FullModel:
    """The MIP over EVERY candidate box and every arc that fits (no column generation), limits hard."""

    bms: list[BucketModel]
    res: list[Restriction]
    shapes: np.ndarray | None  # strict mode: candidate shapes (z, y columns); reference: None
    ref_shapes: list[int] | None  # reference mode: each bucket's one compiled shape
    arrays: MipArrays


def one_shape_per_bucket(prob: Problem) -> list[int]:
    """Reference mode: each bucket declares one shape >= its largest aligned prompt, at most K of them in all,
    cheapest compile first (by enumeration: the candidates are the buckets' own maxima)."""
    need = [int(align(b.prompt_len).max()) for b in prob.buckets]
    best = None
    for k in range(1, prob.max_shapes + 1):
        for picks in itertools.combinations(sorted(set(need)), k):
            if picks[-1] < max(need):
                continue
            shapes = [min(v for v in picks if v >= n) for n in need]
            total = float(prob.cost.shape_charge(np.array(shapes)).sum())
            if best is None or total < best[0]:
                best = (total, shapes)
    return best[1]


def full_model(prob: Problem) -> FullModel:
    """Build the model as the planner does (reference: one shape per bucket, its compile cost a constant).

    No gen coarsening, so each cell's smallest gen is its gen.
    """
    hists = [build_histogram(b) for b in prob.buckets]
    bms = [bucket_model(h, h.G, lim, prob.cost) for h, lim in zip(hists, prob.limits, strict=True)]
    shapes, ref = None, None
    if prob.cost.pads_to_shape:
        shapes = np.unique(np.concatenate([h.S for h in hists]))
        if prob.max_seq_len is not None:
            shapes = shapes[shapes <= prob.max_seq_len]
    else:
        ref = one_shape_per_bucket(prob)
        bms = [replace(bm, const_cost=bm.const_cost + float(prob.cost.shape_charge(s))) for bm, s in zip(bms, ref, strict=True)]
    res = []
    for bm in bms:
        grid = candidate_grid(bm, shapes)
        boxes = np.arange(len(grid))
        t, g = grid.box(boxes)
        box, cell = np.nonzero((bm.hist.S[None, :] <= t[:, None]) & (bm.hist.G[None, :] <= g[:, None]))
        res.append(restriction(grid, boxes, cell, box))
    arrays = build_model(bms, res, shapes, prob.max_shapes, [1] * len(bms), prob.max_batch_size, False)
    return FullModel(bms, res, shapes, ref, arrays)


# ---------------------------------------------------------------- brute force


def set_partitions(items: list[int]):
    """Every partition of ``items`` into non-empty blocks (Bell(n) of them)."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for part in set_partitions(rest):
        yield [[first], *part]
        for i in range(len(part)):
            yield [*part[:i], [first, *part[i]], *part[i + 1:]]


@dataclass(frozen=True)
class Layout:
    """One bucket's plan up to batch ids: its batches (request indices) and each batch's declared shape."""

    blocks: tuple[tuple[int, ...], ...]
    shapes: tuple[int, ...]

    def arrays(self, recipients: dict[int, int] | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(rows in plan-file order, batch ids, seq_align); ``recipients`` maps a shape to the request that
        takes its compile spike: that request's batch gets the string-smallest id and it goes first."""
        recipients = recipients or {}
        chosen = set(recipients.values())
        rows, ids, seq = [], [], []
        for i, (blk, s) in enumerate(zip(self.blocks, self.shapes, strict=True)):
            lead = [r for r in blk if r in chosen]
            rank = 0 if lead else 1
            for r in lead + [r for r in blk if r not in chosen]:
                rows.append(r)
                ids.append(f"{rank}-{i}")
                seq.append(s)
        order = np.argsort([0 if r in chosen else 1 for r in rows], kind="stable")
        return (np.asarray(rows)[order], np.asarray(ids, dtype=object)[order],
                np.asarray(seq, dtype=np.int64)[order])


def layouts(b: Bucket, values: list[int], k: int, max_batch: int | None):
    """Every layout of a bucket: each partition, each batch at any candidate shape that covers it, <= k shapes."""
    S = align(b.prompt_len)
    for part in set_partitions(list(range(len(b)))):
        if max_batch is not None and max(len(blk) for blk in part) > max_batch:
            continue
        options = [[v for v in values if v >= S[blk].max()] for blk in part]
        for shapes in itertools.product(*options):
            if len(set(shapes)) <= k:
                yield Layout(tuple(tuple(blk) for blk in part), shapes)


def layout_metrics(b: Bucket, lay: Layout, prob: Problem, recipients: dict[int, int] | None = None,
                   waits: np.ndarray | None = None) -> Metrics:
    """The plan metrics of a layout; ``waits`` (ms per request, file order) are the arrival windows' waits."""
    rows, ids, seq = lay.arrays(recipients)
    return prob.cost.plan_metrics(b.prompt_len[rows], b.gen_len[rows], ids, seq,
                                  None if waits is None else np.asarray(waits)[rows])


def layout_units(lay: Layout, prob: Problem) -> list[int]:
    """Each batch's compile unit: its shape, or with compiled batch sizes its graph (``CostModel.compile_keys``)."""
    return prob.cost.compile_keys(np.array([len(blk) for blk in lay.blocks]), np.array(lay.shapes)).tolist()


def layout_graphs(b: Bucket, lay: Layout, prob: Problem) -> set[tuple[int, int]]:
    """The graphs (B, s) a layout runs."""
    return set(prob.cost.graphs_of(np.array([len(blk) for blk in lay.blocks]), np.array(lay.shapes)))


def layout_fits(b: Bucket, lay: Layout, prob: Problem) -> bool:
    """Every batch fits the cost model: the KV capacity (of its graph's rows) and, with batch buckets, some bucket."""
    return all(bool(prob.cost.batch_fits(len(blk), s, int(b.gen_len[list(blk)].max())))
               for blk, s in zip(lay.blocks, lay.shapes, strict=True))


def meets_limits(b: Bucket, lay: Layout, prob: Problem, limits: Limits, waits: np.ndarray | None = None) -> bool:
    """Whether SOME choice of batch ids and member order (i.e. of compile-spike recipients) meets every limit."""
    if limits.max_p95_latency_ms is None and limits.max_sequential_ms is None:
        return all(c.ok for c in limit_checks(layout_metrics(b, lay, prob, waits=waits), limits))
    by_shape: dict[int, list[int]] = {}  # by compile unit: a shape, or a graph
    for blk, unit in zip(lay.blocks, layout_units(lay, prob), strict=True):
        by_shape.setdefault(unit, []).extend(blk)
    for pick in itertools.product(*by_shape.values()):
        m = layout_metrics(b, lay, prob, dict(zip(by_shape, pick, strict=True)), waits)
        if all(c.ok for c in limit_checks(m, limits)):
            return True
    return False


@dataclass(frozen=True)
class Optimum:
    cost: float  # inf when no plan meets the limits
    layouts: tuple[Layout, ...] | None


@functools.lru_cache(maxsize=256)  # bounded: a long fuzz over many instances grew to gigabytes unbounded
def _ranked_layouts(prompts: tuple[int, ...], gens: tuple[int, ...], values: tuple[int, ...], k: int,
                    max_batch: int | None, cost) -> tuple[tuple[float, Layout], ...]:
    """Every layout of one bucket with its cost, cheapest first (limits aside, so reusable across limits)."""
    b = bucket(list(prompts), list(gens))
    prob = Problem((b,), (Limits(),), k, cost, max_batch)
    return tuple(sorted(((layout_metrics(b, lay, prob).cost, lay) for lay in layouts(b, list(values), k, max_batch)
                         if layout_fits(b, lay, prob)), key=lambda c: c[0]))


def brute_force(prob: Problem) -> Optimum:
    """The exact optimum over every plan: partitions x shape choices x spike placements, judged by plan_metrics.

    Candidate shapes are the aligned prompts of all buckets (any other shape can be lowered to one of
    them without raising any metric), or every allowed shape when the problem has a fixed set.  A batch must
    fit the cost model (KV capacity, batch buckets), and the graphs stay within the problem's graph cap.  Plans are visited cheapest first (cost does not depend on spike
    placement), so the first whose limits some spike placement meets is optimal.  For <= 6 requests.
    """
    values = sorted({int(s) for b in prob.buckets for s in align(b.prompt_len)})
    if prob.allowed_shapes is not None:  # every allowed shape, not only the ones the planner keeps as candidates
        values = sorted(prob.allowed_shapes)
    if prob.max_seq_len is not None:
        values = [v for v in values if v <= prob.max_seq_len]
    per_bucket = [_ranked_layouts(tuple(b.prompt_len.tolist()), tuple(b.gen_len.tolist()), tuple(values),
                                  prob.max_shapes, prob.max_batch_size, prob.cost)
                  for b in prob.buckets]
    combos = sorted(itertools.product(*per_bucket), key=lambda combo: sum(c for c, _ in combo))
    feasible: dict[tuple[int, Layout], bool] = {}
    cap = prob.graph_cap
    for combo in combos:
        if len(set().union(*(set(lay.shapes) for _, lay in combo))) > prob.max_shapes:
            continue
        if cap is not None and len(set().union(*(layout_graphs(b, lay, prob) for (_, lay), b
                                                 in zip(combo, prob.buckets, strict=True)))) > cap:
            continue
        ok = True
        for i, ((_, lay), b, lim) in enumerate(zip(combo, prob.buckets, prob.limits, strict=True)):
            if (i, lay) not in feasible:
                feasible[(i, lay)] = meets_limits(b, lay, prob, lim)
            ok = ok and feasible[(i, lay)]
        if ok:
            return Optimum(sum(c for c, _ in combo), tuple(lay for _, lay in combo))
    return Optimum(float("inf"), None)


# ---------------------------------------------------------------- brute force with arrival windows


def _shape_choices(options: list[list[int]], k: int, used: tuple[int, ...] = ()):
    """Every choice of one option per block with at most k distinct values (pruned as it goes)."""
    if not options:
        yield ()
        return
    for v in options[0]:
        now = used if v in used else (*used, v)
        if len(now) <= k:
            for rest in _shape_choices(options[1:], k, now):
                yield (v, *rest)


def windowed_layouts(prob: Problem, i: int, values: list[int]) -> list[tuple[float, Layout]]:
    """Every layout of bucket i whose batches stay within one arrival window (within K shapes, the batch-size
    cap and the KV capacity), with its exact cost, cheapest first.  A layout's cost is the sum of its batches'
    costs (each judged alone, compile aside) plus one compile per shape it uses."""
    b = prob.buckets[i]
    wins = windows_of(prob, b)
    S = align(b.prompt_len)
    free = prob.cost.without_compile()
    block_cost: dict[tuple[tuple[int, ...], int], float] = {}

    def cost_of(blk: tuple[int, ...], s: int) -> float:
        if (blk, s) not in block_cost:
            rows = list(blk)
            block_cost[(blk, s)] = free.plan_metrics(b.prompt_len[rows], b.gen_len[rows],
                                                     np.zeros(len(rows), dtype=object), np.full(len(rows), s)).cost
        return block_cost[(blk, s)]

    out = []
    for part in set_partitions(list(range(len(b)))):
        if any(len(set(wins[list(blk)].tolist())) > 1 for blk in part):
            continue
        if prob.max_batch_size is not None and max(len(blk) for blk in part) > prob.max_batch_size:
            continue
        blocks = tuple(tuple(blk) for blk in part)
        options = [[v for v in values if v >= S[list(blk)].max()
                    and bool(prob.cost.batch_fits(len(blk), v, int(b.gen_len[list(blk)].max())))] for blk in blocks]
        for shapes in _shape_choices(options, prob.max_shapes):
            total = sum(cost_of(blk, s) for blk, s in zip(blocks, shapes, strict=True))
            total += float(sum(prob.cost.shape_charge(s) for s in set(shapes)))
            out.append((total, Layout(blocks, shapes)))
    out.sort(key=lambda c: c[0])
    return out


def windowed_brute_force(prob: Problem) -> Optimum:
    """The exact optimum of a small windowed problem: every partition whose batches stay within one window x
    every shape per batch (at most K per bucket and jointly) x every spike placement, judged by plan_metrics
    with each member's wait to its window's end.  Plans are visited cheapest first (a lazy merge of the
    buckets' sorted layouts), so the first whose limits some spike placement meets is optimal; every plan is
    visited when none does (cost inf).  For up to about 7 requests over a few distinct prompt lengths."""
    values = sorted({int(s) for b in prob.buckets for s in align(b.prompt_len)})
    if prob.allowed_shapes is not None:
        values = sorted(prob.allowed_shapes)
    if prob.max_seq_len is not None:
        values = [v for v in values if v <= prob.max_seq_len]
    per_bucket = [windowed_layouts(prob, i, values) for i in range(len(prob.buckets))]
    if any(not lays for lays in per_bucket):
        return Optimum(float("inf"), None)
    waits = [waits_of(prob, b) for b in prob.buckets]
    start = (0,) * len(per_bucket)
    heap = [(sum(lays[0][0] for lays in per_bucket), start)]
    seen = {start}
    feasible: dict[tuple[int, int], bool] = {}
    while heap:
        total, idx = heapq.heappop(heap)
        combo = [lays[j] for lays, j in zip(per_bucket, idx, strict=True)]
        if len(set().union(*(set(lay.shapes) for _, lay in combo))) <= prob.max_shapes:
            ok = True
            for i, (j, (_, lay)) in enumerate(zip(idx, combo, strict=True)):
                if (i, j) not in feasible:
                    feasible[(i, j)] = meets_limits(prob.buckets[i], lay, prob, prob.limits[i], waits[i])
                ok = ok and feasible[(i, j)]
                if not ok:
                    break
            if ok:
                return Optimum(total, tuple(lay for _, lay in combo))
        for i in range(len(idx)):
            nxt = (*idx[:i], idx[i] + 1, *idx[i + 1:])
            if nxt[i] < len(per_bucket[i]) and nxt not in seen:
                seen.add(nxt)
                heapq.heappush(heap, (sum(lays[j][0] for lays, j in zip(per_bucket, nxt, strict=True)), nxt))
    return Optimum(float("inf"), None)


def plan_mip(prob: Problem, *args, **kw) -> Planned:
    """The MIP planner as the pipeline runs it: given the pipeline's judge (expand, then evaluate)."""
    from model.planning import mip
    return mip.plan_mip(prob, *args, judge=pipeline.judge, **kw)


def plan_windowed(prob: Problem, *args, **kw) -> Planned:
    """The windowed planner as the pipeline runs it (with the pipeline's judge)."""
    from model.planning import windowed
    return windowed.plan_windowed(prob, *args, judge=pipeline.judge, **kw)


def plan_cells(prob: Problem, *args, **kw):
    """The planner on histograms as the Dask engine runs it (judging runs by cells)."""
    from model.evaluation.cell_judge import evaluate_runs
    from model.planning import cellplan
    return cellplan.plan_cells(prob, *args, judge_runs=evaluate_runs, **kw)


def explain_infeasible(prob: Problem, *args, **kw) -> str:
    """The infeasibility diagnosis with the pipeline's judge for its probes."""
    from model.planning import diagnose
    return diagnose.explain_infeasible(prob, pipeline.judge, *args, **kw)
