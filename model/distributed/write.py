"""A plan as a partitioned Parquet dataset plus a small manifest, written all or nothing.

``OUT/plan_<bucket>/`` holds ``part-00000.parquet`` (the records of the members that take a
compile spike: at most one per shape), ``part-00001.parquet`` ... (one per request partition, its
own records in its row order, written by the worker that holds the partition) and
``manifest.json`` (shapes, batch ids with their shapes and sizes, metrics, the solver's report).
A record is ``request_id, batch_id, seq_align``; the plan-file order is the files' name order,
then row order, so the spike-taking members come first in their batches and the evaluator's
spike rule (first member of the batch whose id sorts first) lands every spike where the planner
put it.

Every dataset is built in a temporary folder beside its target and renamed into place only when
all of them are complete; an existing dataset is moved aside first and put back if a later
rename fails.  An interrupt (Ctrl-C) or error before that leaves the old datasets as they were
and no temporary folder behind.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from model.base.errors import InputError
from model.base.runtime import shielded
from model.distributed.assign import Quotas, apply_quotas, row_of_rank

MANIFEST = "manifest.json"
FORMAT = "shapeplan-plan-dataset"
SCHEMA = pa.schema([("request_id", pa.string()), ("batch_id", pa.string()), ("seq_align", pa.int64())])


def part_name(k: int) -> str:
    return f"part-{k:05d}.parquet"


def dataset_path(out_dir: Path, bucket: str) -> Path:
    """Where a bucket's plan dataset lives in an output folder (names are plain: see ``model.load.names``)."""
    return Path(out_dir) / f"plan_{bucket}"


def records_table(request_id, batch_id, seq_align) -> pa.Table:
    return pa.table({"request_id": pa.array(np.asarray(request_id, dtype=object), pa.string()),
                     "batch_id": pa.array(np.asarray(batch_id, dtype=object), pa.string()),
                     "seq_align": pa.array(np.asarray(seq_align, dtype=np.int64), pa.int64())}, schema=SCHEMA)


def write_partition(frame: pd.DataFrame, q: Quotas, batch_ids: np.ndarray, batch_shape: np.ndarray,
                    lead_key: np.ndarray, lead_rank: np.ndarray, path: str) -> pd.DataFrame:
    """Runs on a worker, for one request partition: its rows' batches from its quotas, its records written to
    ``path`` (in row order, without the spike-taking members), and those members' records returned.  The
    spike-taking members are named by cell key and rank among the partition's requests of that cell."""
    prompt, gen = frame["prompt_len"].to_numpy(), frame["gen_len"].to_numpy()
    code = apply_quotas(prompt, gen, q)
    ids = frame["request_id"].to_numpy(dtype=object)
    lead = np.zeros(len(code), dtype=bool)
    lead[row_of_rank(prompt, gen, lead_key, lead_rank)] = True
    keep = ~lead
    pq.write_table(records_table(ids[keep], batch_ids[code[keep]], batch_shape[code[keep]]), path)
    return pd.DataFrame({"request_id": ids[lead], "batch_id": batch_ids[code[lead]],
                         "seq_align": batch_shape[code[lead]]})


@dataclass
class Staged:
    """A dataset being built: its target and the temporary folder it is built in."""

    target: Path
    tmp: Path


def stage(out_dir: Path, bucket: str) -> Staged:
    """A fresh temporary folder beside the bucket's target (refused when the target is a file)."""
    target = dataset_path(out_dir, bucket)
    if target.exists() and not target.is_dir():
        raise InputError(str(target), None, None, "is a file; a plan dataset is a folder")
    if target.is_dir() and any(target.iterdir()) and not (target / MANIFEST).is_file():
        raise InputError(str(target), None, None, "is a folder that holds no plan dataset (no manifest.json); "
                                                  "refusing to replace it")
    out_dir.mkdir(parents=True, exist_ok=True)
    return Staged(target, Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=out_dir)))


def write_manifest(staged: Staged, manifest: dict) -> None:
    """The manifest, written last into the staged folder (a dataset without one is incomplete)."""
    with open(staged.tmp / MANIFEST, "w", encoding="utf-8") as fh:
        json.dump(manifest, fh, indent=1)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())


def commit(staged: list[Staged]) -> None:
    """Rename every staged dataset over its target together: all land, or every target stays as it was."""
    asides: dict[Path, Path | None] = {}
    done: list[Staged] = []
    try:
        for s in staged:
            aside = None
            if s.target.exists():
                aside = Path(tempfile.mkdtemp(prefix=f".{s.target.name}.", suffix=".old", dir=s.target.parent))
                os.rmdir(aside)
                os.replace(s.target, aside)
            asides[s.target] = aside
            done.append(s)
            os.replace(s.tmp, s.target)
    except BaseException as exc:
        with shielded():
            for s in reversed(done):
                aside = asides.get(s.target)
                try:
                    if s.target.exists() and not s.tmp.exists():
                        os.replace(s.target, s.tmp)  # ours: back to the staging name, removed below
                    if aside is not None:
                        os.replace(aside, s.target)
                except OSError:
                    pass
        if isinstance(exc, OSError):
            raise InputError(str(staged[len(done) - 1].target if done else staged[0].target), None, None,
                             f"cannot write: {exc.strerror or exc}") from exc
        raise
    finally:
        with shielded():
            for aside in asides.values():
                if aside is not None and aside.exists():
                    shutil.rmtree(aside, ignore_errors=True)


def discard(staged: list[Staged]) -> None:
    """Remove staged folders (after an error or an interrupt; committed ones are gone from their tmp name)."""
    with shielded():
        for s in staged:
            shutil.rmtree(s.tmp, ignore_errors=True)
