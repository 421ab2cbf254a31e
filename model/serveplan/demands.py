"""The step demands of a replay: what every prompt and decode step asked for, as histograms.

A graph set is priced by the steps that run on it, and a step's graph depends only on
two numbers (``shared/serving_model.md``): a prompt step on (n admitted, longest prompt),
a decode step on (n running, total KV blocks) under gaudi and on the longest context
under nxdi (whose decode batch is always ``max_num_seqs`` and whose prompt graph always
runs at ``ctx_batch_size``, so n plays no part there and is recorded as 1).  Counting
equal demands turns the replay's steps into two small histograms, which the MIP
(``model.serveplan.cover``) assigns to graphs.  The histograms are for the steps this
replay ran: another graph set changes step times and so the schedule, which is why the
planner replays again.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from model.evaluation.replay import StepRuns
from model.evaluation.replay_run import ReplayResult


@dataclass(frozen=True, eq=False)
class Demands:
    """Distinct demands and how many steps asked for each: rows (n, x, steps), sorted, int64.

    ``prompt``: x is the longest prompt of the step; ``decode``: x is gaudi's total KV
    blocks or nxdi's longest context.  A row with 0 steps is a demand an earlier replay
    recorded: it carries no cost, but the graphs must still cover it.
    """

    prompt: np.ndarray
    decode: np.ndarray

    def cells(self) -> int:
        return int(self.prompt.shape[0] + self.decode.shape[0])


def _counted(n: np.ndarray, x: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """(n, x, steps) rows summed over equal (n, x), sorted."""
    if n.size == 0:
        return np.zeros((0, 3), dtype=np.int64)
    keys, inverse = np.unique(np.stack([n, x], axis=1), axis=0, return_inverse=True)
    total = np.bincount(inverse.ravel(), weights=steps, minlength=keys.shape[0]).astype(np.int64)
    return np.concatenate([keys, total[:, None]], axis=1).astype(np.int64)


def runs_demands(runs: StepRuns, stack: str) -> Demands:
    """One replica's recorded runs as demands (a run of equal decode steps counts each of its steps)."""
    pick = runs.prompt_n > 0
    p_n = runs.prompt_n[pick] if stack == "gaudi" else np.ones(int(pick.sum()), dtype=np.int64)
    prompt = _counted(p_n, runs.prompt_len[pick], np.ones(int(pick.sum()), dtype=np.int64))
    dec = runs.decode_n > 0
    count, need = runs.count[dec], runs.decode_need[dec]
    if stack == "gaudi":  # nb stays the same within a run
        decode = _counted(runs.decode_n[dec], need, count)
    else:  # the longest context grows by one a step within a run
        total = int(count.sum())
        starts = np.repeat(np.cumsum(count) - count, count)
        context = np.repeat(need, count) + (np.arange(total) - starts)
        decode = _counted(np.ones(total, dtype=np.int64), context, np.ones(total, dtype=np.int64))
    return Demands(prompt, decode)


def replay_demands(result: ReplayResult) -> Demands:
    """Every replica's demands together (the replay must have been run with ``record=True``)."""
    parts = [runs_demands(r.runs, result.settings.stack) for r in result.replicas if r.runs is not None]
    if len(parts) != len(result.replicas):
        raise ValueError("the replay was not recorded (record=True)")
    return merged(parts, ())


def merged(latest: list[Demands] | tuple[Demands, ...], earlier: list[Demands] | tuple[Demands, ...]) -> Demands:
    """The latest replay's demands with their step counts, plus every earlier demand at 0 steps (still covered)."""
    out = []
    for kind in ("prompt", "decode"):
        rows = [getattr(d, kind) for d in latest] + [getattr(d, kind) * np.array([1, 1, 0]) for d in earlier]
        rows = [r for r in rows if r.size]
        if not rows:
            out.append(np.zeros((0, 3), dtype=np.int64))
            continue
        both = np.concatenate(rows)
        out.append(_counted(both[:, 0], both[:, 1], both[:, 2]))
    return Demands(*out)
