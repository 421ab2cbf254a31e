"""The Dask engine's solve: partitions -> group-by histogram -> the planner -> quotas -> a plan dataset.

``solve`` runs the existing planner (``model.pipeline.run``: the MIP or a packer, with its own
exact judging) on every request's lengths in partition order, so the batching -- and every metric
-- is exactly the in-memory engine's on the partitions concatenated in order.  ``write`` hands the
batching back to the partitions as quotas (``assign``) and has each worker write its own records
(``write``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from model import pipeline
from model.cost.analytic import CostParams
from model.cost.common import Mode
from model.cost.device import DeviceProfile
from model.cost.metrics import batch_index, spike_members
from model.distributed.assign import quotas
from model.distributed.read import PartHistogram, Source, check_unique_ids, histogram, lengths, line_of, request_frame
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
from model.errors import InputError
from model.schema import Bucket, Limits, Plan, Problem


@dataclass(frozen=True)
class Settings:
    """What the flags set (the same meaning as for request files in memory)."""

    limits: Limits = Limits()
    max_shapes: int = 8
    params: CostParams | DeviceProfile = dataclasses.field(default_factory=CostParams)
    mode: Mode = "reference"
    max_batch_size: int | None = None
    max_seq_len: int | None = None
    params_source: str | None = None  # the file the coefficients came from (named if its costs overflow)
    columns: str | None = None
    fmt: str | None = None


@dataclass(frozen=True, eq=False)
class Loaded:
    """Buckets read into the cluster: their sources, Dask frames (persisted), histograms, and the problem the
    planner sees (each request's lengths in partition order; its ids are the row numbers, the real ids stay on
    the workers)."""

    sources: tuple[Source, ...]
    frames: tuple
    hists: tuple[PartHistogram, ...]
    problem: Problem


def load(client, sources: list[Source], settings: Settings) -> Loaded:
    """Read every bucket's partitions on the workers, histogram them, and build the planner's problem."""
    frames, hists, buckets = [], [], []
    names: dict[str, str] = {}
    for source in sources:
        if source.name in names:
            raise InputError(source.given, None, None, f"bucket name {source.name!r} is also the name of "
                                                       f"{names[source.name]}; bucket names must differ")
        names[source.name] = source.given
        ddf = request_frame(client, source, settings.columns)
        hist = histogram(client, ddf, len(source.files))
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
        frames.append(ddf)
        hists.append(hist)
    problem = Problem(tuple(buckets), tuple(settings.limits for _ in buckets), settings.max_shapes, settings.params,
                      settings.mode, settings.max_batch_size, settings.max_seq_len)
    if settings.params_source is not None:
        pipeline.check_cost_range(problem, settings.params_source)
    return Loaded(tuple(sources), tuple(frames), tuple(hists), problem)


def solve(loaded: Loaded, solver: str, backend: str, time_limit: float) -> pipeline.Run:
    """The planner on the lengths: the in-memory engine's run, batch for batch."""
    return pipeline.run(loaded.problem, solver, backend, time_limit)


def write(client, out_dir: Path, loaded: Loaded, run: pipeline.Run) -> tuple[Path, ...]:
    """Every bucket's plan as a dataset in ``out_dir`` (see ``model.distributed.write``): all of them, or none."""
    import dask

    staged: list[Staged] = []
    futures: list = []
    made = [f for f in (Path(out_dir), *Path(out_dir).parents) if not f.exists()]  # removed again if it fails
    try:
        for b, (source, ddf, hist, plan) in enumerate(zip(loaded.sources, loaded.frames, loaded.hists, run.plans,
                                                          strict=True)):
            s = stage(Path(out_dir), source.name)
            staged.append(s)
            bucket = loaded.problem.buckets[b]
            codes, ids = batch_index(plan.batch_ids)
            shape = np.asarray(plan.seq_align, dtype=np.int64)[np.unique(codes, return_index=True)[1]]
            batch_of = np.empty(len(bucket), dtype=np.int64)
            batch_of[np.asarray(plan.request_ids, dtype=np.int64)] = codes
            lead_rows = np.sort(np.asarray(plan.request_ids, dtype=np.int64)[spike_members(codes, ids, shape)])
            qs = quotas(bucket.prompt_len, bucket.gen_len, batch_of, hist)
            starts = np.r_[0, np.cumsum(hist.sizes)]
            ids_f = client.scatter(np.asarray(ids, dtype=object), broadcast=True)
            shape_f = client.scatter(shape, broadcast=True)
            parts = ddf.to_delayed()
            tasks = [dask.delayed(write_partition)(parts[p], qs[p], ids_f, shape_f,
                                                   lead_rows[(lead_rows >= starts[p]) & (lead_rows < starts[p + 1])]
                                                   - starts[p], str(s.tmp / part_name(p + 1)))
                     for p in range(len(parts))]
            futures = client.compute(tasks)
            leads = client.gather(futures)
            lead = (np.concatenate([f["request_id"].to_numpy(dtype=object) for f in leads]),
                    np.concatenate([f["batch_id"].to_numpy(dtype=object) for f in leads]),
                    np.concatenate([f["seq_align"].to_numpy(dtype=np.int64) for f in leads]))
            order = np.argsort(lead[1].astype(str), kind="stable")
            pq.write_table(records_table(lead[0][order], lead[1][order], lead[2][order]), s.tmp / part_name(0))
            write_manifest(s, manifest(source, plan, codes, ids, shape, run, b))
        commit(staged)
    except BaseException:
        with _quiet():
            client.cancel(futures)
        discard(staged)
        for folder in made:  # deepest first; only empty ones go
            with _quiet():
                folder.rmdir()
        raise
    return tuple(s.target for s in staged)


def manifest(source: Source, plan: Plan, codes: np.ndarray, ids: np.ndarray, shape: np.ndarray,
             run: pipeline.Run, b: int) -> dict:
    """The dataset's manifest: where it came from, its files, shapes, batches and metrics (as the planner judged)."""
    metrics = run.evaluation.results[b].metrics
    rep = run.planned.report
    return {
        "format": FORMAT, "version": 1, "bucket": source.name,
        "requests": [str(f) for f in source.files],
        "files": [part_name(k) for k in range(len(source.files) + 1)],
        "record_order": "files in name order, rows in file order; part-00000 holds the members that take a "
                        "compile spike",
        "n_requests": len(plan), "n_batches": len(ids),
        "shapes": sorted({int(s) for s in shape}),
        "batches": {"batch_id": [str(i) for i in ids], "seq_align": shape.tolist(),
                    "members": np.bincount(codes, minlength=len(ids)).tolist()},
        "metrics": {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(metrics).items()},
        "solver": {"planner": run.planner, "status": rep.status.value, "backend": rep.backend,
                   "bound": rep.bound, "gap": rep.gap},
    }


class _quiet:
    """Swallow anything while cancelling work after an error (the error itself is what the user must see)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> bool:
        return True

