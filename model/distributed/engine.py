"""The Dask engine's solve: partitions -> group-by histogram -> the planner -> quotas -> a plan dataset.

Two ways to plan (``Settings.plan_from``):

- from requests: the existing planner (``model.pipeline.run``: the MIP or a packer, with its own
  exact judging) on every request's lengths in partition order, so the batching -- and every
  metric -- is exactly the in-memory engine's on the partitions concatenated in order.  The client
  holds 16 bytes a request and the partitions stay in the workers' memory.
- from the histogram: the MIP on the group-by's cells alone (``model.planning.cellplan``), its
  answer runs of cells judged exactly by cells (``model.evaluation.cell_judge``).  The client holds
  cells, arcs and batches, never a request, and the partitions are read again by each pass that
  needs them, never kept: this is how 10^8 requests are planned.  "auto" takes it above
  ``REQUESTS_ON_CLIENT`` requests.

``write`` hands the batching back to the partitions as quotas (``assign``) and has each worker
write its own records (``write``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from model import pipeline
from model.base.errors import InputError
from model.cost.common import align
from model.cost.metrics import batch_index, spike_members
from model.cost.model import CostModel, ReferenceCost
from model.distributed.assign import holder, quotas, run_quotas
from model.distributed.read import (
    PartHistogram,
    Source,
    cell_key,
    check_unique_ids,
    histogram,
    lengths,
    line_of,
    request_frame,
)
from model.distributed.write import (
    FORMAT,
    Staged,
    commit,
    discard,
    part_name,
    records_table,
    stage,
    write_manifest,
    write_partition,
)
from model.domain.schema import Bucket, CellRuns, Evaluation, Limits, Plan, Problem, RunsJudged, SolveReport
from model.evaluation.cell_judge import evaluate_runs
from model.expand.assemble import ranked_ids, shape_ranks
from model.histogram.cells import Histogram, from_counts
from model.planning.cellplan import CellPlanned, plan_cells


@dataclass(frozen=True)
class Settings:
    """What the flags set (the same meaning as for request files in memory)."""

    limits: Limits = Limits()
    max_shapes: int = 8
    cost: CostModel = ReferenceCost()
    max_batch_size: int | None = None
    max_seq_len: int | None = None
    params_source: str | None = None  # the file the coefficients came from (named if its costs overflow)
    columns: str | None = None
    fmt: str | None = None
    plan_from: str = "auto"  # "requests", "histogram", or "auto" (see PLAN_FROM)


PLAN_FROM = ("auto", "requests", "histogram")  # auto: the histogram above REQUESTS_ON_CLIENT, except in device mode
REQUESTS_ON_CLIENT = 20_000_000  # "auto" plans from the histogram above this many requests in all


@dataclass(frozen=True, eq=False)
class Loaded:
    """Buckets read into the cluster: their sources, Dask frames (persisted), histograms, and the problem the
    planner sees (each request's lengths in partition order; its ids are the row numbers, the real ids stay on
    the workers)."""

    sources: tuple[Source, ...]
    frames: tuple
    hists: tuple[PartHistogram, ...]
    problem: Problem
    cells: tuple[Histogram, ...] | None = None  # planning from the histogram: each bucket's exact cells

    @property
    def n_requests(self) -> tuple[int, ...]:
        return tuple(int(h.sizes.sum()) for h in self.hists)


def load(client, sources: list[Source], settings: Settings) -> Loaded:
    """Read every bucket's partitions on the workers, histogram them, and build the planner's problem."""
    if settings.plan_from not in PLAN_FROM:
        raise InputError("--plan-from", None, None, f"{settings.plan_from!r} is not one of {', '.join(PLAN_FROM)}")
    frames, hists = [], []
    names: dict[str, str] = {}
    for source in sources:
        if source.name in names:
            raise InputError(source.given, None, None, f"bucket name {source.name!r} is also the name of "
                                                       f"{names[source.name]}; bucket names must differ")
        names[source.name] = source.given
        ddf = request_frame(client, source, settings.columns, persist=False)
        hists.append(histogram(client, ddf, len(source.files)))
        frames.append(ddf)
    total = sum(int(h.sizes.sum()) for h in hists)
    # auto: device mode always from requests (its exact runs need them), the analytic modes above the threshold
    by_cells = settings.plan_from == "histogram" or (settings.plan_from == "auto" and total > REQUESTS_ON_CLIENT
                                                      and not settings.cost.shared_batch_time)
    if by_cells:
        return _load_cells(client, sources, frames, hists, settings)
    frames = [client.persist(f) for f in frames]  # small enough to keep: every later pass reads memory
    buckets = []
    for source, ddf, hist in zip(sources, frames, hists, strict=True):
        check_unique_ids(client, ddf, source)
        prompt, gen = lengths(client, ddf)
        if len(prompt) != int(hist.sizes.sum()):
            raise RuntimeError("partition sizes disagree between the histogram and the lengths")
        if settings.max_seq_len is not None and (prompt > settings.max_seq_len).any():
            k = int(np.argmax(prompt > settings.max_seq_len))
            part = int(np.searchsorted(np.cumsum(hist.sizes), k, side="right"))
            file, line = line_of(client, ddf, source, part, k - int(hist.sizes[:part].sum()))
            raise InputError(file, line, "prompt_len", f"{int(prompt[k])} is longer than the largest allowed "
                                                       f"shape {settings.max_seq_len}")
        n = len(prompt)
        buckets.append(Bucket(source.name, source.given, np.arange(n, dtype=np.int64), prompt, gen,
                              np.arange(1, n + 1, dtype=np.int64)))
    problem = Problem(tuple(buckets), tuple(settings.limits for _ in buckets), settings.max_shapes, settings.cost,
                      settings.max_batch_size, settings.max_seq_len)
    if settings.params_source is not None:
        pipeline.check_cost_range(problem, settings.params_source)
    return Loaded(tuple(sources), tuple(frames), tuple(hists), problem)


def _load_cells(client, sources: list[Source], frames: list, hists: list[PartHistogram], settings: Settings
                ) -> Loaded:
    """The histogram path of ``load``: ids checked unique and prompts against max_seq_len partition by
    partition, each bucket's exact cells summed over its partitions, and a problem whose buckets carry only
    their names (no request reaches the client)."""
    if settings.cost.shared_batch_time:
        raise InputError("--plan-from", None, None, "device mode plans from requests (its exact runs batch "
                         "requests by gen); give --plan-from requests, or reference or strict mode")
    cells = []
    for source, ddf, hist in zip(sources, frames, hists, strict=True):
        check_unique_ids(client, ddf, source)
        if settings.max_seq_len is not None and int(hist.S.max()) > settings.max_seq_len:
            _first_too_long(client, ddf, source, settings.max_seq_len)
        key = cell_key(hist.S, hist.G)
        first = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
        cells.append(from_counts(source.name, hist.S[first], hist.G[first], np.add.reduceat(hist.count, first),
                                 np.add.reduceat(hist.prompt_sum, first)))
    empty = np.zeros(0, dtype=np.int64)
    buckets = tuple(Bucket(s.name, s.given, np.zeros(0, dtype=object), empty, empty, empty) for s in sources)
    problem = Problem(buckets, tuple(settings.limits for _ in buckets), settings.max_shapes, settings.cost,
                      settings.max_batch_size, settings.max_seq_len)
    if settings.params_source is not None:
        pipeline.check_cost_extent(problem, sum(h.n_requests for h in cells), max(int(h.S.max()) for h in cells),
                                   max(int(h.G.max()) for h in cells), settings.params_source)
    return Loaded(tuple(sources), tuple(frames), tuple(hists), problem, tuple(cells))


def _first_too_long(client, ddf, source: Source, max_seq_len: int) -> None:
    """Raise for the first prompt (partition order) longer than ``max_seq_len``, naming its file and line."""
    over = client.compute(ddf[ddf["prompt_len"] > max_seq_len][["part", "line", "prompt_len"]]).result()
    if not len(over):
        return  # aligned over, but the prompt itself fits (max_seq_len not a multiple of the granularity)
    part, line, prompt = over.sort_values(["part", "line"]).to_numpy()[0]
    raise InputError(str(source.files[int(part)]), int(line), "prompt_len",
                     f"{int(prompt)} is longer than the largest allowed shape {max_seq_len}")


@dataclass(frozen=True, eq=False)
class Solved:
    """A Dask run's plan before it is written: its evaluation and report, and either the in-memory planner's
    run (planned from requests) or the runs of cells (planned from the histogram)."""

    planner: str
    evaluation: Evaluation
    report: SolveReport
    wall_s: float
    run: pipeline.Run | None = None
    cells: CellPlanned | None = None


def solve(loaded: Loaded, solver: str, backend: str, time_limit: float) -> Solved:
    """The planner on the lengths (the in-memory engine's run, batch for batch), or on the cells alone."""
    if loaded.cells is None:
        run = pipeline.run(loaded.problem, solver, backend, time_limit)
        return Solved(solver, run.evaluation, run.planned.report, run.wall_s, run=run)
    if solver != pipeline.MIP:
        raise InputError("--solver", None, None, f"planning from the histogram runs the MIP only, not {solver!r} "
                         "(the packers place requests one by one); give --plan-from requests")
    t0 = time.perf_counter()
    cells = plan_cells(loaded.problem, list(loaded.cells), backend, time_limit, judge_runs=evaluate_runs)
    return Solved(solver, cells.evaluation, cells.report, time.perf_counter() - t0, cells=cells)


@dataclass(frozen=True, eq=False)
class Layout:
    """One bucket's plan as the partitions write it: quotas per partition, batch ids and shapes, and the
    spike-taking members, each as (partition, cell key, rank among that partition's requests of the cell)."""

    quotas: list
    ids: np.ndarray
    shape: np.ndarray
    members: np.ndarray
    lead_part: np.ndarray
    lead_key: np.ndarray
    lead_rank: np.ndarray


def request_layout(bucket: Bucket, plan: Plan, hist: PartHistogram) -> Layout:
    """The layout of a plan the in-memory planner expanded (rows are the bucket's, partition order)."""
    codes, ids = batch_index(plan.batch_ids)
    shape = np.asarray(plan.seq_align, dtype=np.int64)[np.unique(codes, return_index=True)[1]]
    batch_of = np.empty(len(bucket), dtype=np.int64)
    batch_of[np.asarray(plan.request_ids, dtype=np.int64)] = codes
    rows = np.sort(np.asarray(plan.request_ids, dtype=np.int64)[spike_members(codes, ids, shape)])
    keys = cell_key(align(bucket.prompt_len), bucket.gen_len)
    # each lead's rank among the requests of its cell before it, in partition order
    rank = np.asarray([int((keys[:r] == keys[r]).sum()) for r in rows], dtype=np.int64)
    return Layout(quotas(bucket.prompt_len, bucket.gen_len, batch_of, hist), ids, shape,
                  np.bincount(codes, minlength=len(ids)), *_held(keys[rows], rank, hist))


def cell_layout(hist: Histogram, runs: CellRuns, judged: RunsJudged, part_hist: PartHistogram) -> Layout:
    """The layout of runs of cells: batch ids ``s<shape>-<rank>``, the batch that takes its shape's spike ranked
    0 (its id sorts first), the others in batch order; the spike goes to the first request of the chosen run."""
    shape = runs.shape_of
    nb = len(shape)
    ids = ranked_ids(shape, shape_ranks(shape, np.lexsort((np.arange(nb), ~judged.takes, shape))))
    key = cell_key(hist.S[runs.cell], hist.G[runs.cell])
    before = np.cumsum(runs.count) - runs.count  # requests of earlier runs ...
    cell_first = np.r_[True, runs.cell[1:] != runs.cell[:-1]]
    before -= np.maximum.accumulate(np.where(cell_first, before, 0))  # ... of the same cell
    lead_runs = judged.lead[judged.takes]
    members = np.bincount(runs.batch, weights=runs.count, minlength=nb).astype(np.int64)
    return Layout(run_quotas(key, runs.batch, runs.count, part_hist), ids, shape, members,
                  *_held(key[lead_runs], before[lead_runs], part_hist))


def _held(keys: np.ndarray, ranks: np.ndarray, hist: PartHistogram) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The spike-taking members, given by cell key and rank in partition order, as (partition, cell key, rank
    among that partition's requests of the cell)."""
    held = [holder(int(k), int(r), hist) for k, r in zip(keys, ranks, strict=True)]
    return (np.asarray([h[0] for h in held], dtype=np.int64), np.asarray(keys, dtype=np.int64),
            np.asarray([h[1] for h in held], dtype=np.int64))


def write(client, out_dir: Path, loaded: Loaded, solved: Solved) -> tuple[Path, ...]:
    """Every bucket's plan as a dataset in ``out_dir`` (see ``model.distributed.write``): all of them, or none."""
    import dask

    staged: list[Staged] = []
    futures: list = []
    made = [f for f in (Path(out_dir), *Path(out_dir).parents) if not f.exists()]  # removed again if it fails
    try:
        for b, (source, ddf, hist) in enumerate(zip(loaded.sources, loaded.frames, loaded.hists, strict=True)):
            s = stage(Path(out_dir), source.name)
            staged.append(s)
            if solved.cells is not None:
                lay = cell_layout(loaded.cells[b], solved.cells.runs[b], solved.cells.judged[b], hist)
            else:
                lay = request_layout(loaded.problem.buckets[b], solved.run.plans[b], hist)
            ids_f = client.scatter(np.asarray(lay.ids, dtype=object), broadcast=True)
            shape_f = client.scatter(lay.shape, broadcast=True)
            parts = ddf.to_delayed()
            tasks = [dask.delayed(write_partition)(parts[p], lay.quotas[p], ids_f, shape_f,
                                                   lay.lead_key[lay.lead_part == p], lay.lead_rank[lay.lead_part == p],
                                                   str(s.tmp / part_name(p + 1)))
                     for p in range(len(parts))]
            futures = client.compute(tasks)
            leads = client.gather(futures)
            lead = (np.concatenate([f["request_id"].to_numpy(dtype=object) for f in leads]),
                    np.concatenate([f["batch_id"].to_numpy(dtype=object) for f in leads]),
                    np.concatenate([f["seq_align"].to_numpy(dtype=np.int64) for f in leads]))
            order = np.argsort(lead[1].astype(str), kind="stable")
            pq.write_table(records_table(lead[0][order], lead[1][order], lead[2][order]), s.tmp / part_name(0))
            write_manifest(s, manifest(source, lay, solved, b))
        commit(staged)
    except BaseException:
        with contextlib.suppress(BaseException):  # the error itself is what the user must see
            client.cancel(futures)
        discard(staged)
        for folder in made:  # deepest first; only empty ones go
            with contextlib.suppress(BaseException):
                folder.rmdir()
        raise
    return tuple(s.target for s in staged)


def manifest(source: Source, lay: Layout, solved: Solved, b: int) -> dict:
    """The dataset's manifest: where it came from, its files, shapes, batches and metrics (as the planner judged)."""
    metrics = solved.evaluation.results[b].metrics
    rep = solved.report
    return {
        "format": FORMAT, "version": 1, "bucket": source.name,
        "requests": [str(f) for f in source.files],
        "files": [part_name(k) for k in range(len(source.files) + 1)],
        "record_order": "files in name order, rows in file order; part-00000 holds the members that take a "
                        "compile spike",
        "n_requests": int(lay.members.sum()), "n_batches": len(lay.ids),
        "shapes": sorted({int(s) for s in lay.shape}),
        "batches": {"batch_id": [str(i) for i in lay.ids], "seq_align": lay.shape.tolist(),
                    "members": lay.members.tolist()},
        "metrics": {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(metrics).items()},
        "solver": {"planner": solved.planner, "planned_from": "histogram" if solved.cells is not None else "requests",
                   "status": rep.status.value, "backend": rep.backend, "bound": rep.bound, "gap": rep.gap},
    }

