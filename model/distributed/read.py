"""Partitions: find them (a folder or a glob), read each on a worker, histogram them by a Dask group-by.

Each partition is read by the in-memory loader (``model.load.requests.load_requests``), so a
partition is held to exactly the rules of a request file, and a bad row is named by its own file
and line.  The frame a partition becomes (``REQUEST_COLUMNS``) stays on its worker, or (``persist=False``,
for sets larger than the workers' memory) is read again by each task that needs it.
"""

from __future__ import annotations

import glob
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from model.base.errors import InputError
from model.cost.common import GRANULARITY, align
from model.load.names import check_name
from model.load.requests import Columns, detect_format, id_hash, load_requests

SUFFIXES = (".parquet", ".csv", ".jsonl")
GLOB_CHARS = "*?["
REQUEST_COLUMNS = {"request_id": "object", "prompt_len": "int64", "gen_len": "int64", "line": "int64",
                   "part": "int64"}


@dataclass(frozen=True)
class Source:
    """One bucket given as partitions: its name (the folder's), what was given and the files, in name order."""

    name: str
    given: str
    files: tuple[Path, ...]
    fmt: str


def partitions(given: str | Path, fmt: str | None = None, what: str = "request") -> Source:
    """The partition files a folder or a glob names, sorted by file name, all of one format.

    A folder's partitions are its files ending in .parquet, .csv or .jsonl (hidden files and ones
    starting with ``_`` are skipped); a glob's are the files it matches.  No partition, or two
    formats among them, is bad input.
    """
    text = str(given)
    path = Path(text)
    if any(c in text for c in GLOB_CHARS) and not path.exists():
        files = [Path(f) for f in glob.glob(text) if Path(f).is_file()]
        home = path.parent
    elif path.is_dir():
        files = [f for f in path.iterdir() if f.is_file() and f.suffix in SUFFIXES and f.name[0] not in "._"]
        home = path
    elif path.is_file():
        files = [path]
        home = path.parent
    else:
        raise InputError(text, None, None, f"no such folder or file, and no glob: give a folder or glob of {what} "
                                           "partitions")
    files = sorted(files, key=lambda f: f.name) if path.is_dir() else sorted(files)
    if not files:
        raise InputError(text, None, None, f"no {what} partitions (files ending in {', '.join(SUFFIXES)})")
    kinds = {detect_format(f, fmt) for f in files}
    if len(kinds) > 1:
        by = {k: next(f for f in files if detect_format(f, fmt) == k) for k in sorted(kinds)}
        raise InputError(text, None, None, "partitions mix formats (" + ", ".join(f"{k}: {f.name}" for k, f in
                                                                                 by.items()) + "); use one format")
    name = path.stem if path.is_file() else (home.resolve().name if home.name in ("", ".", "..") else home.name)
    name = check_name(name, text, None, None, derived=True)
    return Source(name, text, tuple(files), kinds.pop())


def read_partition(path: str, part: int, fmt: str | None, mapping: str | None) -> pd.DataFrame:
    """One partition as a frame of ``REQUEST_COLUMNS`` (runs on a worker; bad input raises InputError)."""
    bucket = load_requests(path, "partition", Columns.parse(mapping) if mapping else None, fmt)
    ids = bucket.request_ids  # the loader's ids are text already: converted again only if not held as objects
    return pd.DataFrame({
        "request_id": pd.Series(ids if ids.dtype == object else ids.astype(str).astype(object), dtype=object),
        "prompt_len": bucket.prompt_len.astype(np.int64),
        "gen_len": bucket.gen_len.astype(np.int64),
        "line": np.asarray(bucket.lines, dtype=np.int64),
        "part": np.full(len(bucket), part, dtype=np.int64),
    })


def request_frame(client, source: Source, columns: str | None, persist: bool = True):
    """The bucket as a Dask dataframe of its partitions.  With ``persist`` (the default) they are read once and
    kept in the workers' memory; without it the frame stays lazy, and every computation on it reads its
    partitions again (cheap for Parquet), so no worker ever holds more than the partitions it works on."""
    import dask.dataframe as dd

    meta = pd.DataFrame({k: pd.Series(dtype=v) for k, v in REQUEST_COLUMNS.items()})
    ddf = dd.from_map(read_partition, [str(f) for f in source.files], list(range(len(source.files))),
                      args=(source.fmt, columns), meta=meta, label="read-requests", enforce_metadata=False)
    return client.persist(ddf) if persist else ddf


def cells_of(frame: pd.DataFrame) -> pd.DataFrame:
    """Each request's partition and histogram cell (aligned prompt S, gen_len G), and its prompt_len."""
    return pd.DataFrame({"part": frame["part"].to_numpy(), "S": align(frame["prompt_len"].to_numpy()),
                         "G": frame["gen_len"].to_numpy(), "prompt_len": frame["prompt_len"].to_numpy()})


@dataclass(frozen=True, eq=False)
class PartHistogram:
    """Request counts (and prompt-token sums) per (partition, cell): ``part``, ``S``, ``G``, ``count``,
    ``prompt_sum`` sorted by (S, G, part)."""

    part: np.ndarray
    S: np.ndarray
    G: np.ndarray
    count: np.ndarray
    sizes: np.ndarray  # requests per partition
    prompt_sum: np.ndarray | None = None

    @property
    def n_cells(self) -> int:
        return len(np.unique(cell_key(self.S, self.G)))


def cell_key(S: np.ndarray, G: np.ndarray) -> np.ndarray:
    """One int64 per cell, ordered as (S, G): gens are at most 2^20, so S / 64 goes above bit 21."""
    return (np.asarray(S, dtype=np.int64) // GRANULARITY << 21) | np.asarray(G, dtype=np.int64)


def histogram(client, ddf, n_parts: int) -> PartHistogram:
    """The per-partition histogram over cells, by a Dask group-by on (partition, S, G)."""
    cells = ddf.map_partitions(cells_of, meta={"part": "int64", "S": "int64", "G": "int64", "prompt_len": "int64"})
    sums = client.compute(cells.groupby(["part", "S", "G"])["prompt_len"].agg(["size", "sum"])).result()
    frame = sums.reset_index().sort_values(["S", "G", "part"], kind="stable")
    part = frame["part"].to_numpy(np.int64)
    count = frame["size"].to_numpy(np.int64)
    return PartHistogram(part, frame["S"].to_numpy(np.int64), frame["G"].to_numpy(np.int64), count,
                         np.bincount(part, weights=count, minlength=n_parts).astype(np.int64),
                         frame["sum"].to_numpy(np.int64))


def lengths(client, ddf) -> tuple[np.ndarray, np.ndarray]:
    """Every request's (prompt_len, gen_len) in partition order: all the planner needs of a request."""
    frame = client.compute(ddf[["prompt_len", "gen_len"]]).result()
    return frame["prompt_len"].to_numpy(np.int64), frame["gen_len"].to_numpy(np.int64)


MAX_HASH_BITS = 10  # at most 1024 hash ranges


def hash_split(frame: pd.DataFrame, bits: int) -> tuple[np.ndarray, ...]:
    """Runs on a worker: a partition's id hashes, sorted and cut by their top ``bits`` bits into 2^bits ranges."""
    h = np.sort(id_hash(frame["request_id"].to_numpy(dtype=object)))
    if bits == 0:
        return (h,)
    bounds = np.arange(1, 1 << bits, dtype=np.uint64) << np.uint64(64 - bits)
    return tuple(np.split(h, np.searchsorted(h, bounds)))


def repeated_hashes(*pieces: np.ndarray) -> np.ndarray:
    """Runs on a worker: the hashes of one range that occur more than once over all the partitions' pieces."""
    h = np.sort(np.concatenate(pieces))
    return np.unique(h[1:][h[1:] == h[:-1]])


def rows_hashed(frame: pd.DataFrame, hashes: np.ndarray) -> pd.DataFrame:
    """Runs on a worker: a partition's rows whose id hashes to one of ``hashes`` (id, partition, line)."""
    hit = np.isin(id_hash(frame["request_id"].to_numpy(dtype=object)), hashes)
    return frame.loc[hit, ["request_id", "part", "line"]]


def check_unique_ids(client, ddf, source: Source) -> None:
    """A request id may appear once in the whole bucket (each file checks its own; this checks across them).

    By hash ranges, so no task ever sees more than a range of hashes: each partition hashes its ids (64 bits)
    and cuts them by the top bits into R ranges (R, a power of two, about the number of partitions); one task
    per range gathers that range from every partition and finds the hashes that repeat.  Only ids with such a
    hash are fetched and compared as text: two different ids with one hash are no duplicate.
    """
    import dask

    n = ddf.npartitions
    bits = min(MAX_HASH_BITS, max(0, (n - 1).bit_length()))
    parts = ddf.to_delayed()
    pieces = [dask.delayed(hash_split, nout=1 << bits)(part, bits) for part in parts]
    ranges = [dask.delayed(repeated_hashes)(*(pc[r] for pc in pieces)) for r in range(1 << bits)]
    hashes = np.unique(np.concatenate([np.zeros(0, np.uint64), *client.gather(client.compute(ranges))]))
    if not len(hashes):
        return
    shared = client.scatter(hashes, broadcast=True, hash=False)
    found = client.gather(client.compute([dask.delayed(rows_hashed)(part, shared) for part in parts]))
    rows = pd.concat(found, ignore_index=True)
    counts = rows["request_id"].value_counts()
    dup = counts[counts > 1]
    if not len(dup):
        return  # hash collisions of different ids only
    rid = str(sorted(dup.index.astype(str))[0])
    where = rows[rows["request_id"] == rid][["part", "line"]].sort_values(["part", "line"])
    (p1, l1), (p2, l2) = where.to_numpy()[:2]
    raise InputError(str(source.files[p2]), int(l2), "request_id",
                     f"duplicate id {rid!r} (also at {source.files[p1]}:{int(l1)}); ids must be unique across "
                     f"the partitions ({len(dup)} ids repeated)")


def line_of(client, ddf, source: Source, part: int, row: int) -> tuple[str, int]:
    """The file and line of a partition's row (to name a request in an error)."""
    lines = client.compute(ddf.partitions[part]["line"]).result().to_numpy()
    return str(source.files[part]), int(lines[row])
