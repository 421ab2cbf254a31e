"""Device mode without windows: the LP-price bound's interval entries raised by the rider chain, over every shape set.

Why.  The LP-price bound (``model.planning.limit_bound``) charges the members of an interval
(lo, hi] of a shape set their duals at hi over the whole pool below hi; most of that pool rides
lower, so the members' prices are what batching with it would cost, not what batching among
themselves does: on the main job's chat bucket the interval (1024, 2048] is charged 38,898 where
its members alone need 70,235.  The rider chain (``model.planning.rider_chain``) prices an
interval's members given what riders from below pay; here the riders' prices are not known (they
depend on the shapes below), so each is replaced by an upper bound that holds for every set.

The argument.  Every plan can be taken with each batch at the smallest shape of its bucket's set
covering its longest prompt (moving a batch down lowers its time and meets every limit it met), so a
batch at hi holds at least one member of (lo, hi] and riders from below lo.  Give every request r
of an interval (lo', hi'] below the bucket's top a price at most phi[r, next(hi')] (phi: the
penalised LP prices' suffix minimum over shapes, as in ``window_bound``; next(s): the candidate after
s).  phi grows with the shape and hi' <= lo, so a rider at hi pays at most phi[r, next(lo)] whatever
the shapes below.  The members of (lo, hi] may then be priced by the chain's projections with the
riders at those prices (the sum of a batch's members' prices at most its penalised time less the
riders' prices), capped at phi[m, next(hi)] unless hi is the bucket's top (nothing rides above it).
Every batch's penalised time then covers its members' prices, so the sum of the prices, less
lam times the P95 allowance, is a bound for every plan whose bucket uses that set.  The old entry
(phi[m, hi] for every member) obeys the same caps, so each entry may be the larger of the two, and
the DP over sets stays a bound with any mixture: the entries of the DP's best set are raised until
they all are, and every DP value on the way is certified.  Member prices may be negative here (a
batch the riders already pay for): the projections allow it.
"""

from __future__ import annotations

import numpy as np

from model.base.runtime import Deadline, check_interrupt
from model.domain.schema import Problem
from model.planning.projections import greatest_convex
from model.planning.rider_chain import member_limits
from model.planning.shape_lp import SAFETY, Cells, all_boxes
from model.planning.shapes import charged_tables, own_bound

MAX_ROUNDS = 200  # DP rounds (each raises the best set's unraised entries)


def free_prices(levels_n: np.ndarray, Tp: np.ndarray) -> np.ndarray:
    """Per level, the members' price (nondecreasing, possibly negative): the greatest convex cumulative price V
    with V[N_l] - V[N_l - a] <= Tp[l, a] (``rider_chain.interval_prices`` without the floor at 0)."""
    c = levels_n.astype(np.float64)
    N = np.r_[0.0, np.cumsum(c)]
    n = np.arange(1, Tp.shape[1])
    T = np.where(n[None, :] <= N[1:, None], Tp[:, 1:], np.inf)
    src = np.maximum(N[1:, None] - n[None, :], 0.0)
    single = Tp[:, 1] if Tp.shape[1] > 1 else np.zeros(len(c))
    V = np.r_[0.0, np.cumsum(c * np.where(np.isfinite(single), single, 0.0))]
    V = greatest_convex(N, V, T)
    # the last iterate may sit a hair above a constraint: lower every level by the worst excess per member
    sums = V[1:, None] - np.interp(src, N, V)
    excess = np.where(np.isfinite(T), sums - T, -np.inf).max(initial=0.0)
    return np.diff(V) / c - max(0.0, float(excess))


def interval_rows(S: np.ndarray, cands: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Which requests (entry shapes S) are members of the interval (cands[lo], cands[hi]] (lo = -1: none below)."""
    return (S <= cands[hi]) & ((S > cands[lo]) if lo >= 0 else True)


def rider_entry(problem: Problem, S: np.ndarray, G: np.ndarray, phi: np.ndarray, cands: np.ndarray, lo: int,
                hi: int, top: int, lam: float, limit: float | None) -> float:
    """The raised entry of interval (cands[lo], cands[hi]] (lo = -1: none below) of one bucket whose requests
    (entry shapes S, gens G) have prices phi (see module docstring); -inf where it has no members."""
    s = int(cands[hi])
    mem = np.flatnonzero(interval_rows(S, cands, lo, hi))
    if not len(mem):
        return -np.inf
    rid = np.flatnonzero(S <= cands[lo]) if lo >= 0 else np.zeros(0, dtype=np.int64)
    rp = phi[rid, lo + 1] if lo >= 0 else np.zeros(0)
    fits = np.isfinite(rp)  # a rider priced inf cannot run at next(lo) or above: it never rides at hi
    rid, rp = rid[fits], rp[fits]
    gens, inv = np.unique(G[np.r_[mem, rid]], return_inverse=True)
    cells = Cells(np.zeros(len(gens), dtype=np.int64), gens, np.bincount(inv))
    boxes = all_boxes(problem.cost, cells, np.array([s]), limit, problem.max_batch_size)
    if not len(boxes.i):
        return -np.inf
    mg, mc = np.unique(G[mem], return_counts=True)
    order = np.argsort(-rp, kind="stable")
    Tp, _ = member_limits(boxes, np.arange(len(boxes.i)), mg, len(mem), rp[order],
                          np.ones(len(rid), dtype=np.int64), G[rid][order], lam, scale=False)
    prices = np.repeat(free_prices(mc, Tp), mc)  # members in gen order
    if hi < top:
        ranked = mem[np.argsort(G[mem], kind="stable")]
        prices = np.minimum(prices, phi[ranked, hi + 1])
    total = float(prices.sum())
    return total - SAFETY * abs(total)  # float sums at a tie must not lift the entry above the optimum


def raised_own_bound(problem: Problem, windows: list[tuple[np.ndarray, np.ndarray, np.ndarray]], acc: np.ndarray,
                     charge: np.ndarray, top: int, cands: np.ndarray, lam: float, limit: float | None,
                     deadline: Deadline) -> float:
    """``raised_table``'s bound alone."""
    return raised_table(problem, windows, acc, charge, top, cands, lam, limit, deadline)[0]


def raised_table(problem: Problem, windows: list[tuple[np.ndarray, np.ndarray, np.ndarray]], acc: np.ndarray,
                 charge: np.ndarray, top: int, cands: np.ndarray, lam: float, limit: float | None,
                 deadline: Deadline) -> tuple[float, np.ndarray, np.ndarray]:
    """One bucket's own bound (before lam times its allowance) with the entries of the DP's best set raised
    until they all are or ``deadline`` passes (see module docstring).  ``windows`` holds each window's requests
    (entry shapes, gens) and their prices phi at every candidate (the suffix minimum of the LP prices penalised
    at lam for the P95 ``limit``); ``acc`` is the bucket's interval table on them (``window_bound.interval_table``).
    Batches never span two windows, so each window's part of an entry is the larger of its old and raised sums.
    Returns the bound, the table with the entries raised so far (every entry obeys the caps: a DP over any
    part of it stays a bound, ``prefix_bound``'s suffixes) and which entries were raised."""
    limit = limit if lam > 0 else None
    acc = acc.copy()
    raised = np.zeros(acc.shape, dtype=bool)
    value = -np.inf
    for _ in range(MAX_ROUNDS):
        check_interrupt()
        own, _ = charged_tables(acc, charge, top)
        value, shapes = own_bound(own, cands, top, problem.max_shapes)
        idx = [int(np.searchsorted(cands, x)) for x in shapes]
        todo = [(lo, hi) for lo, hi in zip([-1, *idx[:-1]], idx, strict=True) if not raised[lo + 1, hi]]
        if not todo or deadline.expired():
            break
        for lo, hi in todo:
            if deadline.expired():
                return value, acc, raised
            total = 0.0
            for S, G, phi in windows:
                inside = interval_rows(S, cands, lo, hi)
                if inside.any():
                    old = float(phi[inside, hi].sum())
                    total += max(old, rider_entry(problem, S, G, phi, cands, lo, hi, top, lam, limit))
            acc[lo + 1, hi] = max(acc[lo + 1, hi], total)
            raised[lo + 1, hi] = True
    return value, acc, raised
