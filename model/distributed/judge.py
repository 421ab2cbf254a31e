"""A plan dataset judged partition by partition, with exact global metrics.

The plan's records (any source: the files of a folder in name order, rows in order) are matched
to the request partitions' rows.  Every rule of the in-memory evaluator is checked on the match
(exactly once, shape covers prompt, one shape per batch, the shape caps, the largest shape, the
KV capacity), and the metrics come from two passes:

1. per batch: members, shape, largest aligned prompt and gen, and the batch's first record in
   plan-file order (which fixes the batch order and the spike rule's "first member");
2. one task per partition, given that small batch table: each member's latency by the cost
   model's own rule (``latencies_given``), the spike added where ``spike_batches`` puts it, and
   back come exact value counts of the latencies and of the processed prompts, each batch's
   largest latency, and sums.

The client merges them: P95 by the same rank rule over the merged counts (``p95_of_counts``,
exact, not sampled), sequential time as the sum of the batches' largest latencies, costs by
``batch_costs`` and ``prefill_cost`` over the merged prompt counts (so the result does not depend
on how the records were split into partitions).  Nothing of the cost arithmetic is repeated here.

How records meet requests depends on the dataset:

* aligned (what ``python -m model.solve --engine dask`` writes, see ``model.distributed.write``):
  ``part-00000`` holds a few records (the spike-taking members) and ``part-0000k`` the records of
  request partition k-1 in its row order, those few removed.  One task per partition reads the
  partition and its plan file and checks exactly that; if every partition passes and each record
  of ``part-00000`` names a request found once, every request is planned exactly once and the
  match is by position: no shuffle, and no task holds more than one partition and its plan file.
* anything else: a Dask merge on ``request_id`` (held in the workers' memory, so for data sets
  that fit there), which also names what is twice, unknown or missing.

Both give the same result, bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from model.base.errors import InputError
from model.cost.common import GRANULARITY, align
from model.cost.device import kv_tokens
from model.cost.metrics import (
    Metrics,
    spike_batches,
)
from model.cost.model import CostModel
from model.distributed.read import Source
from model.domain.schema import BucketResult, Limits, Violation
from model.evaluation.validate import limit_checks, shape_rules
from model.load.requests import MAX_LEN

PLAN_COLUMNS = {"request_id": "object", "batch_id": "object", "seq_align": "int64", "ppart": "int64",
                "prow": "int64"}
ROW_BITS = 40  # a record's plan-file position: (file index << 40) | row
LEAD_MAX = 100_000  # a part-00000 longer than this is no aligned layout's (it holds one record per shape)
BATCH_AGG = {"n": ("seq_align", "size"), "shape_min": ("seq_align", "min"), "shape_max": ("seq_align", "max"),
             "s_ref": ("s_ref", "max"), "g_max": ("gen_len", "max"), "first": ("pos", "min")}
BATCH_MERGE = {"n": "sum", "shape_min": "min", "shape_max": "max", "s_ref": "max", "g_max": "max", "first": "min"}
BATCH_META = {"batch_id": "object", "seq_align": "int64", "s_ref": "int64", "gen_len": "int64", "pos": "int64"}


def read_plan_partition(path: str, index: int) -> pd.DataFrame:
    """One plan file: ``request_id``, ``batch_id`` (text or integers), ``seq_align`` (a positive multiple of 64),
    with its file index and rows; a bad record is an InputError naming the file and row."""
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as exc:
        raise InputError(path, None, None, f"cannot read as Parquet: {str(exc).splitlines()[0]}") from None
    missing = [k for k in ("request_id", "batch_id", "seq_align") if k not in table.column_names]
    if missing:
        raise InputError(path, None, missing[0], f"missing column (a plan record is request_id, batch_id, "
                                                 f"seq_align; columns: {', '.join(table.column_names)})")
    out = {}
    for k in ("request_id", "batch_id"):
        col = table.column(k)
        if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type) or pa.types.is_integer(col.type)):
            raise InputError(path, None, k, f"must be text or integers, got {col.type}")
        if col.null_count:
            row = int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0])
            raise InputError(path, row + 1, k, "missing (null)")
        out[k] = pd.Series(np.asarray(col.cast(pa.string()).to_numpy(zero_copy_only=False), dtype=object),
                           dtype=object)
    seq = table.column("seq_align")
    if not pa.types.is_integer(seq.type):
        raise InputError(path, None, "seq_align", f"must be integers, got {seq.type}")
    values = seq.fill_null(0).to_numpy().astype(np.int64)
    bad = (values <= 0) | (values % GRANULARITY != 0) | (values > MAX_LEN)
    if seq.null_count or bad.any():
        row = int(np.argmax(bad))
        what = "missing (null)" if seq.null_count and values[row] == 0 and seq.is_null()[row].as_py() else \
            f"{int(values[row])} is not a positive multiple of {GRANULARITY} up to {MAX_LEN}"
        raise InputError(path, row + 1, "seq_align", what)
    n = table.num_rows
    return pd.DataFrame({**out, "seq_align": values, "ppart": np.full(n, index, dtype=np.int64),
                         "prow": np.arange(n, dtype=np.int64)})


def plan_frame(client, source: Source):
    """The plan dataset as a Dask dataframe, one partition per file, read again by each pass (nothing kept on
    the workers: a plan of 10^8 records does not fit there)."""
    import dask.dataframe as dd

    if source.fmt != "parquet":
        raise InputError(source.given, None, None, f"a plan dataset is Parquet files, found {source.fmt}")
    meta = pd.DataFrame({k: pd.Series(dtype=v) for k, v in PLAN_COLUMNS.items()})
    ddf = dd.from_map(read_plan_partition, [str(f) for f in source.files], list(range(len(source.files))),
                      meta=meta, label="read-plan", enforce_metadata=False)
    return ddf


def _where(source: Source, ppart: int, prow: int) -> str:
    return f"{source.files[int(ppart)]}:{int(prow) + 1}"


def coverage(client, name: str, plan_src: Source, req_src: Source, plan, reqs) -> list[Violation]:
    """Exactly once: no id twice in the plan, none unknown, none missing (each named by file and row/line)."""
    problems = []
    counts = plan["request_id"].value_counts()
    merged = plan[["request_id", "ppart", "prow"]].merge(reqs[["request_id", "part", "line"]], on="request_id",
                                                         how="outer", indicator=True, shuffle_method="p2p")
    dup, sides = client.compute([counts[counts > 1], merged["_merge"].value_counts()])
    dup, sides = dup.result(), sides.result()
    if len(dup):
        rows = client.compute(plan[plan["request_id"].isin(list(dup.index))][["request_id", "ppart", "prow"]]).result()
        rows = rows.sort_values(["ppart", "prow"])
        second = rows[rows["request_id"].duplicated()].iloc[0]
        problems.append(Violation(name, "exactly-once", f"{_where(plan_src, second.ppart, second.prow)}: request "
                                  f"{second.request_id!r} appears twice ({int((dup - 1).sum())} repeats)"))
    unknown, missing = int(sides.get("left_only", 0)), int(sides.get("right_only", 0))
    if unknown:
        rows = client.compute(merged[merged["_merge"] == "left_only"].nsmallest(1, ["ppart", "prow"])).result()
        r = rows.iloc[0]
        problems.append(Violation(name, "exactly-once", f"{_where(plan_src, r.ppart, r.prow)}: request "
                                  f"{r.request_id!r} is not in {req_src.given} ({unknown} unknown)"))
    if missing:
        rows = client.compute(merged[merged["_merge"] == "right_only"].nsmallest(1, ["part", "line"])).result()
        r = rows.iloc[0]
        problems.append(Violation(name, "exactly-once", f"request {r.request_id!r} ({req_src.files[int(r.part)]}:"
                                  f"{int(r.line)}) is missing from the plan ({missing} missing)"))
    return problems


def _batch_columns(frame: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({"batch_id": frame["batch_id"].to_numpy(dtype=object),
                         "seq_align": frame["seq_align"].to_numpy(np.int64),
                         "s_ref": align(frame["prompt_len"].to_numpy(np.int64)),
                         "gen_len": frame["gen_len"].to_numpy(np.int64),
                         "pos": (frame["ppart"].to_numpy(np.int64) << ROW_BITS) | frame["prow"].to_numpy(np.int64)})


def batch_table(client, joined) -> pd.DataFrame:
    """Per batch, in plan-file order of first appearance: members, smallest and largest shape, largest aligned
    prompt and gen, and the position of its first record."""
    cols = joined.map_partitions(_batch_columns, meta=BATCH_META)
    table = client.compute(cols.groupby("batch_id").agg(**BATCH_AGG)).result().sort_values("first", kind="stable")
    return table.reset_index()


def partial_batches(joined: pd.DataFrame) -> pd.DataFrame:
    """The batch table of some of the records (one partition's), to be merged by ``merge_batches``."""
    return _batch_columns(joined).groupby("batch_id", sort=False).agg(**BATCH_AGG)


def merge_batches(partials: list[pd.DataFrame]) -> pd.DataFrame:
    """The batch table (as ``batch_table``) from the partial tables of disjoint sets of records."""
    table = pd.concat(partials).groupby(level=0, sort=False).agg(BATCH_MERGE).astype(np.int64)
    table.index.name = "batch_id"
    return table.sort_values("first", kind="stable").reset_index()


def member_pass(frame: pd.DataFrame, index: pd.Index, n_b: np.ndarray, batch_shape: np.ndarray, s_max: np.ndarray,
                g_max: np.ndarray, spiked: np.ndarray, cost: CostModel) -> dict:
    """Runs on a worker, for one partition of the join: exact latency counts, each batch's largest latency, sums,
    and the first record whose shape does not cover its prompt."""
    code = index.get_indexer(frame["batch_id"].to_numpy(dtype=object))
    prompt = frame["prompt_len"].to_numpy(np.int64)
    gen = frame["gen_len"].to_numpy(np.int64)
    seq = frame["seq_align"].to_numpy(np.int64)
    pos = (frame["ppart"].to_numpy(np.int64) << ROW_BITS) | frame["prow"].to_numpy(np.int64)
    aligned = align(prompt)
    S = cost.arc_member_length(aligned, batch_shape[code])
    latency = cost.latencies_given(S, code, n_b, s_max, g_max)
    hit = np.isin(pos, spiked)
    latency[hit] += cost.spike_ms
    values, counts = np.unique(latency, return_counts=True)
    worst = pd.Series(latency).groupby(code).max()
    short = np.flatnonzero(seq < aligned)
    first_short = None
    if len(short):
        k = short[np.argmin(pos[short])]
        first_short = (int(pos[k]), str(frame["request_id"].iloc[k]), int(seq[k]), int(aligned[k]))
    return {"values": values, "counts": counts, "worst_code": worst.index.to_numpy(np.int64),
            "worst": worst.to_numpy(np.float64),
            "S_counts": None if cost.shared_batch_time else np.unique(S, return_counts=True),
            "S": int(S.sum()), "prompt": int(prompt.sum()), "gen": int(gen.sum()), "n": len(frame),
            "short": (len(short), first_short)}


def judge_bucket(client, name: str, req_src: Source, reqs, plan_src: Source, limits: Limits, max_shapes: int,
                 max_seq_len: int | None, cost: CostModel) -> BucketResult:
    """One bucket's plan dataset validated and judged: the in-memory evaluator's result, computed partition-wise.

    ``reqs`` is the request frame (``read.request_frame``, persisted or not), its ids unique across the
    partitions (``read.check_unique_ids``, which the evaluator runs first).  An aligned dataset is matched by
    position (see the module docstring), anything else by a merge on ``request_id``.
    """
    import dask

    layout = aligned_layout(client, reqs, plan_src)
    if layout is None:
        plan = plan_frame(client, plan_src)
        problems = coverage(client, name, plan_src, req_src, plan, reqs)
        if problems:
            return BucketResult(name, None, (), tuple(problems))
        # not persisted: each pass shuffles again (Dask's p2p shuffle goes through disk), so no worker holds
        # the join of 10^8 records
        joined = plan.merge(reqs[["request_id", "prompt_len", "gen_len"]], on="request_id", how="inner",
                            shuffle_method="p2p")
        bt = batch_table(client, joined)

        def tasks(shared: list) -> list:
            return [dask.delayed(member_pass)(part, *shared, cost) for part in joined.to_delayed()]
        local: list[pd.DataFrame] = []
    else:
        bt = layout.batches

        def tasks(shared: list) -> list:
            return [dask.delayed(aligned_member_pass)(part, str(plan_src.files[k + 1]), k + 1, layout.lead_rows[k],
                                                      *shared, cost)
                    for k, part in enumerate(reqs.to_delayed())]
        local = [layout.leads]
    ids = bt["batch_id"].to_numpy(dtype=object)
    n_b = bt["n"].to_numpy(np.int64)
    batch_shape = bt["shape_min"].to_numpy(np.int64)  # a batch of two shapes is broken below; its first is kept
    g_max = bt["g_max"].to_numpy(np.int64)
    s_max = batch_shape if cost.pads_to_shape else bt["s_ref"].to_numpy(np.int64)
    spiked = bt["first"].to_numpy(np.int64)[spike_batches(ids, batch_shape)]
    index = pd.Index(ids)
    given = (index, n_b, batch_shape, s_max, g_max, spiked)
    shared = [client.scatter(x, broadcast=True, hash=False) for x in given]
    parts = client.gather(client.compute(tasks(shared)))
    parts += [member_pass(frame, *given, cost) for frame in local]
    problems = shape_problems(name, plan_src, bt, parts, max_shapes, max_seq_len)
    if cost.kv_capacity is not None:
        tokens = kv_tokens(n_b, batch_shape, g_max)
        over = np.flatnonzero(tokens > cost.kv_capacity)
        if len(over):
            k = int(over[np.argmax(tokens[over])])
            problems.append(Violation(name, "kv-capacity", f"{plan_src.given}: batch {ids[k]!r} holds "
                                      f"{int(tokens[k])} KV tokens (members x (seq_align + G_max)), over the "
                                      f"device's capacity {cost.kv_capacity} ({len(over)} batch"
                                      f"{'es' if len(over) > 1 else ''} over)"))
    metrics = merged_metrics(parts, n_b, batch_shape, s_max, g_max, cost)
    return BucketResult(name, metrics, limit_checks(metrics, limits), tuple(problems))


# -- the aligned layout: records matched to requests by position ---------------------------------------------------

@dataclass(frozen=True, eq=False)
class Layout:
    """An aligned dataset, proven to plan every request exactly once: its batch table, the records of
    ``part-00000`` with their requests' lengths, and per request partition the rows those records name."""

    batches: pd.DataFrame
    leads: pd.DataFrame
    lead_rows: list[np.ndarray]


def lead_rows(ids: np.ndarray, lead_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rows of ``ids`` that are among ``lead_ids`` (a few), and which lead each is."""
    rows = np.flatnonzero(pd.Series(ids, dtype=object).isin(lead_ids).to_numpy()) if len(lead_ids) else []
    return np.asarray(rows, dtype=np.int64), pd.Index(lead_ids).get_indexer(ids[rows]).astype(np.int64)


def _matched(plan: pd.DataFrame, req: pd.DataFrame, leads: np.ndarray) -> pd.DataFrame:
    """A plan file's records with the lengths of the request rows they name (the partition's rows but ``leads``)."""
    keep = np.ones(len(req), dtype=bool)
    keep[leads] = False
    return plan.assign(prompt_len=req["prompt_len"].to_numpy(np.int64)[keep],
                       gen_len=req["gen_len"].to_numpy(np.int64)[keep])


def _aligned(plan: pd.DataFrame, req: pd.DataFrame, leads: np.ndarray) -> bool:
    ids = np.delete(req["request_id"].to_numpy(dtype=object), leads)
    named = plan["request_id"].to_numpy(dtype=object)
    return len(ids) == len(named) and bool((ids == named).all())


def align_partition(req: pd.DataFrame, plan_path: str, index: int, lead_ids: np.ndarray) -> dict | None:
    """Runs on a worker, for request partition ``index - 1`` and plan file ``index``: None unless the file's
    records name the partition's rows in order, the ``part-00000`` ones left out; else the partition's batch
    table and its rows named in ``part-00000``, with their lengths."""
    plan = read_plan_partition(plan_path, index)
    rows, at = lead_rows(req["request_id"].to_numpy(dtype=object), lead_ids)
    if not _aligned(plan, req, rows):
        return None
    return {"batches": partial_batches(_matched(plan, req, rows)), "rows": rows, "at": at,
            "prompt": req["prompt_len"].to_numpy(np.int64)[rows], "gen": req["gen_len"].to_numpy(np.int64)[rows]}


def aligned_member_pass(req: pd.DataFrame, plan_path: str, index: int, leads: np.ndarray, *given) -> dict:
    """``member_pass`` on a request partition and its plan file, matched by position (``align_partition``
    proved it; a file changed since is bad input)."""
    plan = read_plan_partition(plan_path, index)
    if not _aligned(plan, req, leads):
        raise InputError(plan_path, None, None, "changed while it was judged")
    return member_pass(_matched(plan, req, leads), *given)


def aligned_layout(client, reqs, plan_src: Source) -> Layout | None:
    """The dataset as aligned (see the module docstring) and proven to plan every request exactly once, or None
    (then the general path judges it).  A bad record raises as in the general path."""
    from distributed import as_completed

    n = reqs.npartitions
    if plan_src.fmt != "parquet" or len(plan_src.files) != n + 1:
        return None
    try:
        if pq.ParquetFile(plan_src.files[0]).metadata.num_rows > LEAD_MAX:
            return None
    except (OSError, pa.ArrowException):
        return None  # the general path says what is wrong with it
    lead = read_plan_partition(str(plan_src.files[0]), 0)
    lead_ids = lead["request_id"].to_numpy(dtype=object)
    if not pd.Index(lead_ids).is_unique:
        return None
    import dask

    shared = client.scatter(lead_ids, broadcast=True, hash=False)
    tasks = [dask.delayed(align_partition)(part, str(plan_src.files[k + 1]), k + 1, shared)
             for k, part in enumerate(reqs.to_delayed())]
    futures = client.compute(tasks)
    order = {f.key: k for k, f in enumerate(futures)}
    found: list[dict | None] = [None] * n
    try:
        for future, result in as_completed(futures, loop=client.loop, with_results=True):
            if result is None:  # not aligned: no need to look further
                client.cancel(futures)
                return None
            found[order[future.key]] = result
    except BaseException:
        client.cancel(futures)
        raise
    at = np.concatenate([np.zeros(0, np.int64), *(r["at"] for r in found)])
    if len(at) != len(lead_ids) or len(np.unique(at)) != len(lead_ids):
        return None  # a part-00000 record names no request (or, with repeated ids, more than one)
    prompt, gen = np.zeros(len(lead_ids), np.int64), np.zeros(len(lead_ids), np.int64)
    for r in found:
        prompt[r["at"]], gen[r["at"]] = r["prompt"], r["gen"]
    leads = lead.assign(prompt_len=prompt, gen_len=gen)
    batches = merge_batches([*(r["batches"] for r in found), partial_batches(leads)])
    return Layout(batches, leads, [r["rows"] for r in found])


def shape_problems(name: str, plan_src: Source, bt: pd.DataFrame, parts: list[dict], max_shapes: int,
                   max_seq_len: int | None) -> list[Violation]:
    """``model.evaluation.validate.shape_rules`` on the batch table and the partitions' finds (the engine
    refuses a fixed shape set, so none is checked here)."""
    shorts = [pt["short"][1] for pt in parts if pt["short"][0]]
    short = None
    if shorts:
        pos, rid, seq, need = min(shorts)
        short = (f"{_where(plan_src, pos >> ROW_BITS, pos & ((1 << ROW_BITS) - 1))}: seq_align {seq} < aligned "
                 f"prompt {need} of request {rid!r}")
    shapes = np.unique(np.r_[bt["shape_min"].to_numpy(np.int64), bt["shape_max"].to_numpy(np.int64)])
    mixed_rows = bt[bt["shape_min"] != bt["shape_max"]]
    mixed = None
    if len(mixed_rows):
        r = mixed_rows.iloc[0]
        mixed = (f"{plan_src.given}: batch {r.batch_id!r} mixes seq_align {int(r.shape_min)} and {int(r.shape_max)} "
                 f"({len(mixed_rows)} batches mix shapes)")
    return shape_rules(name, shapes, max_shapes, max_seq_len, None, lambda bad: (str(plan_src.given), int(bad.max())),
                       short, mixed)


def merged_metrics(parts: list[dict], n_b: np.ndarray, batch_shape: np.ndarray, s_max: np.ndarray,
                   g_max: np.ndarray, cost: CostModel) -> Metrics:
    """The bucket's metrics from the partitions' exact counts and sums (see the module docstring)."""
    prefill = None if cost.shared_batch_time else prefill_of_counts([pt["S_counts"] for pt in parts], cost)
    worst = np.full(len(n_b), -np.inf)
    for pt in parts:
        np.maximum.at(worst, pt["worst_code"], pt["worst"])
    values = np.concatenate([pt["values"] for pt in parts])
    counts = np.concatenate([pt["counts"] for pt in parts])
    pad = int(sum(pt["S"] - pt["prompt"] for pt in parts) + int((n_b * g_max).sum()) - sum(pt["gen"] for pt in parts))
    real = int(sum(pt["prompt"] + pt["gen"] for pt in parts))
    return cost.counted_metrics(values, counts, worst, n_b, batch_shape, s_max, g_max, prefill, pad, real)


def prefill_of_counts(counts: list[tuple[np.ndarray, np.ndarray]], cost: CostModel) -> float:
    """The analytic prefill total from the partitions' value counts of the processed prompts S: merged first,
    so the sum is the same however the members were split."""
    values, inverse = np.unique(np.concatenate([v for v, _ in counts]), return_inverse=True)
    n = np.zeros(len(values), dtype=np.int64)
    np.add.at(n, inverse, np.concatenate([c for _, c in counts]).astype(np.int64))
    return cost.prefill_total(values, n)
