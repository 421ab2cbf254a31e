"""Which member takes each shape's compile spike: the choice that meets the P95 and sequential limits if any does.

A shape's spike (+compile time) lands on one member of one of its batches, and the
expansion may pick any (by batch ids and member order).  The choice changes two
limited metrics, each shape's choice independently of the others' (a batch has one
shape):

- P95: the recipient is pushed over the limit L only if it *crosses* (lat <= L <
  lat + spike); a member already over L, or one that stays under L with the spike,
  costs nothing;
- sequential time: its batch's largest latency grows by
  ``max(0, lat + spike - batch max)`` -- least for the batch's fastest member.

Per batch two candidates suffice: its fastest member (least growth), and its fastest
harmless member (already over L, or under L even with the spike).  With arrival windows
the two latencies differ: P95 judges a member's latency with its wait to its window's end,
sequential time (device time run back to back) without it; so "harmless" reads the
waited latency and "growth" the unwaited one, and a member that waits less may stay under
L with the spike while a faster one crosses (the wait once counted in the growth too, and
a plan meeting both limits was judged to break its sequential time).  Per shape that gives the
best harmless option and the best option overall; across shapes, the P95 limit
allows ``allowed_above(n) - (members already over)`` crossings, and they go to the
shapes where crossing saves the most sequential time.  That is exact: it minimises
sequential time among the placements that keep the P95 count within its allowance
(and keeps the count least when none does).
"""

from __future__ import annotations

import numpy as np

from model.cost.common import allowed_above
from model.cost.metrics import segment_max
from model.domain.schema import Limits


def member_order(codes: np.ndarray, latency: np.ndarray) -> np.ndarray:
    """Records by batch code, then latency, then index: the order ``spike_leads`` reads batches in."""
    return np.lexsort((np.arange(len(codes)), latency, codes))


def spike_leads(codes: np.ndarray, shape_of: np.ndarray, latency: np.ndarray, spike: float, limits: Limits,
                weight: np.ndarray | None = None, order: np.ndarray | None = None,
                wait: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(lead, takes): per batch the record that goes first, and whether that batch takes its shape's spike.

    ``codes`` numbers each record's batch 0..nb-1 (every batch non-empty), ``latency``
    is each record's latency without spikes.  A batch that takes the spike leads with
    its recipient, every other batch with its fastest member.  With ``weight`` a record
    stands for that many members of equal latency (a run of one cell in one batch): the
    P95 allowance counts members, and the spike goes to one member of the chosen record.  ``order`` is
    ``member_order(codes, latency)`` when the caller has it (a sort of 10^7 records takes seconds).  ``wait``
    (per record, arrival windows) is added to the latency the P95 limit judges, not to sequential time.
    """
    codes = np.asarray(codes, dtype=np.int64)
    shape_of = np.asarray(shape_of, dtype=np.int64)
    n, nb = len(codes), len(shape_of)
    order = member_order(codes, latency) if order is None else order
    fastest = order[np.r_[True, codes[order][1:] != codes[order][:-1]]] if n else np.zeros(0, np.int64)
    lead = fastest.copy()
    takes = np.zeros(nb, dtype=bool)
    if nb == 0:
        return lead, takes
    batch_max = segment_max(np.asarray(latency, dtype=np.float64), codes, nb)
    limit = limits.max_p95_latency_ms
    waited = np.asarray(latency, dtype=np.float64) + (0.0 if wait is None else np.asarray(wait, dtype=np.float64))
    cand = [fastest]
    if limit is not None:
        harmless = order[(waited[order] > limit) | (waited[order] + spike <= limit)]
        if len(harmless):
            cand.append(harmless[np.r_[True, codes[harmless][1:] != codes[harmless][:-1]]])
    cand = np.concatenate(cand)
    cb = codes[cand]
    lat = latency[cand]
    inc = np.maximum(0.0, lat + spike - batch_max[cb])
    cross = ((waited[cand] <= limit) & (waited[cand] + spike > limit) if limit is not None
             else np.zeros(len(cand), bool))
    shape = shape_of[cb]
    # per shape: the best option overall (least growth; harmless first on ties) and the best harmless one
    best_all = _first_per_shape(shape, np.lexsort((cb, lat, cross, inc, shape)))
    keep = np.flatnonzero(~cross)
    best_safe = _first_per_shape(shape, keep[np.lexsort((cb[keep], lat[keep], inc[keep], shape[keep]))])
    chosen = {}
    if limits.max_sequential_ms is None:  # only the P95 count matters: harmless wherever possible
        chosen = {s: best_safe.get(s, a) for s, a in best_all.items()}
    else:
        slack = np.inf
        if limit is not None:
            w = np.ones(n, dtype=np.int64) if weight is None else np.asarray(weight, dtype=np.int64)
            slack = allowed_above(int(w.sum())) - int(w[waited > limit].sum())
        forced = [s for s in best_all if s not in best_safe]
        slack -= sum(int(cross[best_all[s]]) for s in forced)
        saving = sorted(((inc[best_safe[s]] - inc[a], s) for s, a in best_all.items() if s in best_safe),
                        key=lambda t: (-t[0], t[1]))
        for s in forced:
            chosen[s] = best_all[s]
        for save, s in saving:
            crossing = bool(cross[best_all[s]])
            if save > 0 and (not crossing or slack >= 1):
                chosen[s] = best_all[s]
                slack -= int(crossing)
            else:
                chosen[s] = best_safe[s]
    for c in chosen.values():
        lead[cb[c]] = cand[c]
        takes[cb[c]] = True
    return lead, takes


def _first_per_shape(shape: np.ndarray, order: np.ndarray) -> dict[int, int]:
    """Shape -> the first candidate of that shape in ``order`` (indices sorted by shape first)."""
    if len(order) == 0:
        return {}
    s = shape[order]
    heads = np.r_[True, s[1:] != s[:-1]]
    return dict(zip(s[heads].tolist(), order[heads].tolist(), strict=True))
