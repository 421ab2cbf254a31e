"""Solver-independent validation: every rule of the contract, recomputed from the plan alone."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from model.cost.common import align
from model.cost.metrics import Metrics, batch_index
from model.cost.model import CostModel
from model.domain.schema import (
    Bucket,
    BucketResult,
    LimitCheck,
    Limits,
    Plan,
    Problem,
    Violation,
)
from model.domain.windowing import waits_of, windows_of
from model.load.requests import id_hash


def plan_rows(bucket: Bucket, plan: Plan) -> tuple[np.ndarray | None, list[Violation]]:
    """Row of the bucket behind each plan record, or the coverage violations found.

    Each request must appear exactly once: no unknown ids, no repeats, none missing.
    """
    if plan.rows is not None and _rows_hold(bucket, plan):
        return plan.rows, []
    rows = _rows_by_hash(bucket, plan)
    if rows is not None:
        return rows, []
    problems: list[Violation] = []
    ids = pd.Index(bucket.request_ids.astype(str))
    plan_ids = pd.Series(plan.request_ids.astype(str))
    dup = plan_ids.duplicated().to_numpy()
    if dup.any():
        k = int(np.argmax(dup))
        problems.append(Violation(bucket.name, "exactly-once",
                                  f"{plan.source}:{_line(plan, k)}: request {plan_ids.iloc[k]!r} appears twice"
                                  f" ({int(dup.sum())} repeats)"))
    rows = ids.get_indexer(plan_ids)
    unknown = rows < 0
    if unknown.any():
        k = int(np.argmax(unknown))
        problems.append(Violation(bucket.name, "exactly-once",
                                  f"{plan.source}:{_line(plan, k)}: request {plan_ids.iloc[k]!r} is not in "
                                  f"{bucket.source} ({int(unknown.sum())} unknown)"))
    seen = np.zeros(len(bucket), bool)
    seen[rows[~unknown]] = True
    if not seen.all():
        k = int(np.argmax(~seen))
        problems.append(Violation(bucket.name, "exactly-once",
                                  f"request {bucket.request_ids[k]!r} ({bucket.source}:{int(bucket.lines[k])}) "
                                  f"is missing from the plan ({int((~seen).sum())} missing)"))
    return (None if problems else rows), problems


def _rows_hold(bucket: Bucket, plan: Plan) -> bool:
    """An in-memory plan's row numbers: a permutation of the bucket whose ids match the records.

    Checking that costs two linear passes, where matching ids as text costs a hash join
    (81 s at 10^7 requests); when it fails, the full id matching finds what is wrong.
    """
    rows = plan.rows
    if len(rows) != len(bucket) or rows.min(initial=0) < 0 or rows.max(initial=-1) >= len(bucket):
        return False
    if not (np.bincount(rows, minlength=len(bucket)) == 1).all():
        return False
    return bool((bucket.request_ids[rows] == plan.request_ids).all())


def _rows_by_hash(bucket: Bucket, plan: Plan) -> np.ndarray | None:
    """The rows of a plan read from a file, matched by 64-bit hashes of the ids' text and confirmed by the text:
    a few int64 arrays, where a hash join of 10^7 Python strings held 0.9 GB more and took twice as long.

    Both sides' hashes sorted: when they are equal element by element and the bucket's are distinct, the k-th
    record in hash order is the k-th row in hash order -- a permutation -- and comparing the ids' text rules
    out a collision.  None whenever that fails: the full matching then names what is wrong.
    """
    n = len(bucket)
    if len(plan) != n or n == 0:
        return None
    h = id_hash(bucket.request_ids)
    by_row = np.argsort(h)
    h = h[by_row]
    if (h[1:] == h[:-1]).any():
        return None
    hp = id_hash(plan.request_ids)
    by_record = np.argsort(hp)
    same = bool((hp[by_record] == h).all())
    del h, hp
    if not same:
        return None
    rows = np.empty(n, dtype=np.int64)
    rows[by_record] = by_row
    del by_row, by_record
    return rows if bool((bucket.request_ids[rows] == plan.request_ids).all()) else None


def _line(plan: Plan, k: int) -> int:
    return int(plan.lines[k]) if plan.lines is not None else k + 1


def shape_rules(name: str, shapes: np.ndarray, max_shapes: int, max_seq_len: int | None,
                allowed: tuple[int, ...] | None, locate: Callable[[np.ndarray], tuple[str, int]] | None = None,
                short: str | None = None, mixed: str | None = None) -> list[Violation]:
    """The shape rules of one bucket, however its judge read the batches (plan records, a Dask batch table,
    runs by cells): ``shapes`` are its distinct seq_align values; ``locate`` names the first place declaring
    one of the given shapes and the shape there ("file:line"; without it: no place, the first shape); ``short``
    describes the first member whose seq_align is below its aligned prompt and ``mixed`` the first batch
    declaring two shapes, as the judge found them (None: none).

    Rules: seq_align covers every member, one shape per batch, none above max_seq_len, only allowed shapes
    (when a fixed set is given), at most K shapes in the bucket."""
    def at(bad: np.ndarray) -> str:
        where, shape = locate(bad) if locate is not None else ("", int(bad[0]))
        return f"{where + ': ' if where else ''}seq_align {shape}"

    problems = []
    if short is not None:
        problems.append(Violation(name, "shape-covers-prompt", short))
    if max_seq_len is not None and len(shapes) and int(shapes.max()) > max_seq_len:
        over = shapes[shapes > max_seq_len]
        problems.append(Violation(name, "max-seq-len", f"{at(over)} exceeds the largest allowed shape {max_seq_len}"))
    if mixed is not None:
        problems.append(Violation(name, "one-shape-per-batch", mixed))
    if allowed is not None:
        outside = shapes[~np.isin(shapes, np.asarray(allowed, dtype=np.int64))]
        if len(outside):
            problems.append(Violation(name, "allowed-shapes",
                                      f"{at(outside)} is not an allowed shape (outside the "
                                      f"set: {', '.join(map(str, outside.tolist()))}; allowed: "
                                      f"{', '.join(map(str, allowed))})"))
    if len(shapes) > max_shapes:
        problems.append(Violation(name, "shape-cap",
                                  f"{len(shapes)} distinct shapes in the bucket, at most {max_shapes} allowed"))
    return problems


def plan_shape_rules(bucket: Bucket, plan: Plan, rows: np.ndarray, problem: Problem) -> list[Violation]:
    """``shape_rules`` on plan records, each finding named by file and line."""
    need = align(bucket.prompt_len[rows])
    short = plan.seq_align < need
    k = int(np.argmax(short))
    short_text = (f"{plan.source}:{_line(plan, k)}: seq_align {int(plan.seq_align[k])} < aligned prompt "
                  f"{int(need[k])} of request {plan.request_ids[k]!r}") if short.any() else None
    codes, _ = batch_index(plan.batch_ids)
    first = np.unique(codes, return_index=True)[1]
    mixed = plan.seq_align != plan.seq_align[first][codes]
    m = int(np.argmax(mixed))
    mixed_text = (f"{plan.source}:{_line(plan, m)}: batch {plan.batch_ids[m]!r} mixes seq_align "
                  f"{int(plan.seq_align[first][codes[m]])} and {int(plan.seq_align[m])}") if mixed.any() else None

    def locate(bad: np.ndarray) -> tuple[str, int]:
        k = int(np.argmax(np.isin(plan.seq_align, bad)))
        return f"{plan.source}:{_line(plan, k)}", int(plan.seq_align[k])

    return shape_rules(bucket.name, np.unique(plan.seq_align), problem.max_shapes, problem.max_seq_len,
                       problem.allowed_shapes, locate, short_text, mixed_text)


def kv_rule(bucket: Bucket, plan: Plan, rows: np.ndarray, cost: CostModel) -> list[Violation]:
    """Where the cost model has a KV capacity: a batch is valid only if B * (s + G_max) <= capacity (all its
    KV fits; B its members, or with batch buckets its graph's batch size)."""
    capacity = cost.kv_capacity
    if capacity is None:
        return []
    tokens, ids = cost.batch_kv_tokens(plan.batch_ids, bucket.gen_len[rows], plan.seq_align)
    over = np.flatnonzero(tokens > capacity)
    if not len(over):
        return []
    k = int(over[np.argmax(tokens[over])])
    rows_are = "graph batch size" if cost.compiles_graphs else "members"
    return [Violation(bucket.name, "kv-capacity",
                      f"{plan.source}: batch {ids[k]!r} holds {int(tokens[k])} KV tokens ({rows_are} x (seq_align + "
                      f"G_max)), over the device's capacity {capacity} "
                      f"({len(over)} batch{'es' if len(over) > 1 else ''} over)")]


def bucket_rule(bucket: Bucket, plan: Plan, buckets: tuple[int, ...] | None) -> list[Violation]:
    """With compiled batch sizes, a batch runs in the smallest bucket holding its members: one larger than
    every bucket fits no graph."""
    if buckets is None:
        return []
    codes, ids = batch_index(plan.batch_ids)
    n_b = np.bincount(codes, minlength=len(ids))
    over = np.flatnonzero(n_b > buckets[-1])
    if not len(over):
        return []
    k = int(over[np.argmax(n_b[over])])
    first = int(np.argmax(codes == k))
    return [Violation(bucket.name, "batch-buckets",
                      f"{plan.source}:{_line(plan, first)}: batch {ids[k]!r} has {int(n_b[k])} members, more than "
                      f"the largest batch bucket {buckets[-1]} (buckets {', '.join(map(str, buckets))}): no "
                      f"graph holds it ({len(over)} batch{'es' if len(over) > 1 else ''} over)")]


def time_text(seconds: float) -> str:
    """An arrival time as a person reads it: a UTC timestamp for epoch seconds, else seconds."""
    if 1e8 <= seconds < 1e11:
        stamp = pd.Timestamp(seconds, unit="s", tz="UTC")
        return stamp.strftime("%Y-%m-%d %H:%M:%S.%f").rstrip("0").rstrip(".") + " UTC"
    return f"{seconds:.9g} s"


def window_rule(problem: Problem, bucket: Bucket, plan: Plan, rows: np.ndarray) -> list[Violation]:
    """With arrival windows, every member of a batch must come from the same window."""
    if problem.windowing is None:
        return []
    wins = windows_of(problem, bucket)[rows]
    codes, ids = batch_index(plan.batch_ids)
    nb = len(ids)
    lo = np.full(nb, np.iinfo(np.int64).max)
    hi = np.full(nb, np.iinfo(np.int64).min)
    np.minimum.at(lo, codes, wins)
    np.maximum.at(hi, codes, wins)
    mixed = np.flatnonzero(lo != hi)
    if not len(mixed):
        return []
    k = int(mixed[0])
    members = np.flatnonzero(codes == k)
    a = int(members[np.argmin(wins[members])])
    b = int(members[np.argmax(wins[members])])
    t = bucket.arrival_s[rows]
    seconds = problem.windowing.seconds
    return [Violation(bucket.name, "window",
                      f"{plan.source}: batch {ids[k]!r} mixes arrival windows of {seconds:g} s: request "
                      f"{plan.request_ids[a]!r} arrived at {time_text(float(t[a]))} (window {int(wins[a])}), request "
                      f"{plan.request_ids[b]!r} at {time_text(float(t[b]))} (window {int(wins[b])})"
                      f" ({len(mixed)} batch{'es' if len(mixed) > 1 else ''} mix windows; windows count from the "
                      f"first arrival of all the buckets given, {time_text(problem.windowing.origin_s)})")]


def limit_checks(metrics: Metrics, limits: Limits) -> tuple[LimitCheck, ...]:
    """Each set limit beside the metric it bounds."""
    return tuple(LimitCheck(name, metrics.value(name), bound) for name, bound in limits.items())


def evaluate_plans(problem: Problem, plans: tuple[Plan, ...], tick: Callable[[], None] | None = None
                   ) -> tuple[list[BucketResult], list[Violation]]:
    """Validate and evaluate every bucket's plan, plus the cross-bucket shape cap (``tick`` before each bucket:
    a caller's deadline or signal check)."""
    results = []
    all_shapes: set[int] = set()
    all_graphs: set[tuple[int, int]] = set()
    for bucket, limits, plan in zip(problem.buckets, problem.limits, plans, strict=True):
        if tick is not None:
            tick()
        rows, problems = plan_rows(bucket, plan)
        if rows is None:
            results.append(BucketResult(bucket.name, None, (), tuple(problems)))
            continue
        problems += plan_shape_rules(bucket, plan, rows, problem)
        problems += bucket_rule(bucket, plan, problem.cost.batch_buckets)
        problems += kv_rule(bucket, plan, rows, problem.cost)
        problems += window_rule(problem, bucket, plan, rows)
        waits = waits_of(problem, bucket)
        metrics = problem.cost.plan_metrics(bucket.prompt_len[rows], bucket.gen_len[rows], plan.batch_ids,
                                            plan.seq_align, None if waits is None else waits[rows])
        all_shapes.update(metrics.shapes)
        all_graphs.update(metrics.graphs)
        results.append(BucketResult(bucket.name, metrics, limit_checks(metrics, limits), tuple(problems)))
    return results, joint_shape_cap(all_shapes, problem.max_shapes) + joint_graph_cap(all_graphs, problem)


def joint_shape_cap(shapes: set[int], max_shapes: int) -> list[Violation]:
    """The cap K across all buckets: the distinct shapes of every bucket's plan together."""
    if len(shapes) <= max_shapes:
        return []
    return [Violation("*", "shape-cap", f"{len(shapes)} distinct shapes across all buckets "
                                        f"({', '.join(map(str, sorted(shapes)))}), at most {max_shapes} allowed")]


def joint_graph_cap(graphs: set[tuple[int, int]], problem: Problem) -> list[Violation]:
    """The caps on what the plans compile across all buckets: at most ``max_graphs`` distinct graphs, and a
    warm-up (compile time x distinct graphs) within ``max_warmup_s``."""
    found = []
    listed = ", ".join(f"({b}, {s})" for b, s in sorted(graphs, key=lambda g: (g[1], g[0])))
    if problem.max_graphs is not None and len(graphs) > problem.max_graphs:
        found.append(Violation("*", "graph-cap", f"{len(graphs)} distinct graphs (batch, shape) across all buckets "
                                                 f"({listed}), at most {problem.max_graphs} allowed"))
    warmup = problem.cost.warmup_ms(len(graphs))
    if problem.max_warmup_s is not None and warmup > problem.max_warmup_s * 1000.0:
        found.append(Violation("*", "warm-up", f"warming up {len(graphs)} graphs takes {warmup / 1000.0:g} s "
                                               f"({problem.cost.spike_ms / 1000.0:g} s each), over the "
                                               f"{problem.max_warmup_s:g} s allowed"))
    return found
