"""Plans by cells judged exactly: the one cost model on runs (``CellRuns``), never one record per request.

A run is ``count`` requests of one exact cell (aligned prompt S, gen G) in one batch; they
share their latency, so every metric of ``model.cost.metrics`` follows from the runs, the
batches' extents and the cells' token sums -- exactly what the expanded plan evaluates to,
request by request.  Each shape's compile spike is placed by the expansion's own rule
(``model.expand.spikes.spike_leads``, members weighted by run), on the first request of the
chosen run.  The rules that hold by construction for runs (every request exactly once) are
not re-checked; the shape rules are: a batch's shape covers each of its cells, the largest
allowed shape, the allowed shapes, the K cap per bucket and across buckets.  Device mode's KV
rule is not: the planner by cells takes the analytic modes only (``evaluate_runs`` refuses it).
"""

from __future__ import annotations

import numpy as np

from model.cost.metrics import (
    Metrics,
    segment_max,
)
from model.cost.model import CostModel
from model.domain.schema import BucketResult, CellRuns, Evaluation, Limits, Problem, RunsJudged, Violation
from model.evaluation.validate import joint_shape_cap, limit_checks, shape_rules
from model.expand.spikes import spike_leads
from model.histogram.cells import Histogram


def run_metrics(hist: Histogram, runs: CellRuns, cost: CostModel, limits: Limits) -> tuple[Metrics, np.ndarray,
                                                                                          np.ndarray]:
    """(metrics, lead run per batch, takes per batch) of a bucket's runs over its exact histogram."""
    nb = runs.n_batches
    count = runs.count
    S = cost.arc_member_length(hist.S[runs.cell], runs.shape_of[runs.batch])
    n_b = np.bincount(runs.batch, weights=count, minlength=nb).astype(np.int64)
    s_max = cost.batch_contexts(S, runs.batch, runs.shape_of)
    g_max = segment_max(hist.G[runs.cell], runs.batch, nb)
    latency = cost.latencies_given(S, runs.batch, n_b, s_max, g_max)
    spike = cost.spike_ms
    lead, takes = spike_leads(runs.batch, runs.shape_of, latency, spike, limits, weight=count)
    hit = lead[takes]  # one member of each of these runs takes its shape's spike
    values = np.r_[latency, latency[hit] + spike]
    counts = np.r_[count, np.ones(len(hit), dtype=np.int64)]
    counts[hit] -= 1
    worst = segment_max(values, np.r_[runs.batch, runs.batch[hit]], nb)
    prefill = cost.prefill_total(S, count)
    pad = int((S * count).sum() - hist.prompt_sum.sum() + (g_max[runs.batch] * count).sum() - hist.gen_sum.sum())
    real = int(hist.prompt_sum.sum() + hist.gen_sum.sum())
    metrics = cost.counted_metrics(values, counts, worst, n_b, runs.shape_of, s_max, g_max, prefill, pad, real)
    return metrics, lead, takes


def shape_violations(name: str, hist: Histogram, runs: CellRuns, problem: Problem) -> list[Violation]:
    """``model.evaluation.validate.shape_rules`` on runs (places are batch numbers; runs have no file)."""
    shape = runs.shape_of[runs.batch]
    short = shape < hist.S[runs.cell]
    k = int(np.argmax(short))
    text = (f"batch {int(runs.batch[k])}: seq_align {int(shape[k])} < aligned prompt {int(hist.S[runs.cell[k]])}"
            if short.any() else None)
    return shape_rules(name, np.unique(runs.shape_of), problem.max_shapes, problem.max_seq_len,
                       problem.allowed_shapes, short=text)


def evaluate_runs(problem: Problem, hists: list[Histogram], runs: tuple[CellRuns, ...]
                  ) -> tuple[Evaluation, tuple[RunsJudged, ...]]:
    """Every bucket's runs judged (``run_metrics``, the shape rules, the limits) and the joint shape cap.  The
    analytic modes only: the planner by cells refuses device mode, and its KV rule is not judged here."""
    if problem.cost.shared_batch_time:
        raise ValueError("runs are judged in the reference and strict modes; device mode plans from requests")
    judged = []
    all_shapes: set[int] = set()
    for bucket, limits, hist, r in zip(problem.buckets, problem.limits, hists, runs, strict=True):
        metrics, lead, takes = run_metrics(hist, r, problem.cost, limits)
        all_shapes.update(metrics.shapes)
        result = BucketResult(bucket.name, metrics, limit_checks(metrics, limits),
                              tuple(shape_violations(bucket.name, hist, r, problem)))
        judged.append(RunsJudged(result, lead, takes))
    return (Evaluation(tuple(j.result for j in judged), tuple(joint_shape_cap(all_shapes, problem.max_shapes))),
            tuple(judged))
