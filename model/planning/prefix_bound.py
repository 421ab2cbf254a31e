"""Device mode: a bucket's bound over every shape set by branch and bound from the bottom ("the prefix bound").

Why.  The rider chain (``rider_chain``) prices a FIXED shape set nearly as well as its LP, but its prices of
an interval depend on every shape below, so no DP over sets can use them; the riders' bound
(``rider_bound``) is a DP because it caps every rider's price at phi (the penalised LP prices' suffix
minimum) at the candidate after its interval, which costs it where the riders' real prices are far below
the caps (the embedded default's chat bucket: the DP's best set gets 287,654 where the chain on that set
certifies 327,355, compiles included).

The search.  A node is a prefix P = (y_1 < ... < y_j) of a set, every y below the bucket's top candidate.
Its requests (entry shape <= y_j) run only at shapes of P, or ride above y_j.  They are priced by the chain
interval by interval, riders at their prices (``rider_chain.member_limits``); the chain's prices are kept
uncapped (they are what the next interval's riders pay) and each request's is capped, for the node's bound
only, at phi at the candidate after y_j: as a rider above y_j it is then priced at most what the riders'
bound assumes there, and lower prices keep every batch's reduced cost at least what it was.  Every set with
this prefix then costs at least

    sum of the prefix's capped prices + m * min(0, least reduced cost of its batches) + its compiles
      + the riders' DP over the shapes above y_j with at most K - j of them (the table's entries)

(m <= the prefix's requests: the Lagrangian of ``rider_chain``; the suffix entries hold for any riders priced
within the caps, and the search raises the entries its suffixes stand on, ``Suffixes``).  A node's children
add one shape; until a child is priced its bound is its parent's capped prices plus the riders' DP through
it (the entry of its new interval, then the suffix above).  Adding the top candidate ends a set, whose
value is the chain's on the whole set, uncapped (nothing rides above the top).  Each child's bound is at
least its parent's, every set lies below exactly one node of the frontier, so the least bound over the
frontier is a bound over every set at every moment: the search pops the least, best first, until the
deadline, or until the least is a whole set's own value (then it is the least over every set exactly).
All at the same P95 multiplier lam as the table (minus lam times the allowance, once).
"""

from __future__ import annotations

import functools
import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from model.base.runtime import Deadline, check_interrupt
from model.domain.schema import Problem
from model.planning.rider_bound import interval_rows, rider_entry
from model.planning.rider_chain import interval_prices, member_limits
from model.planning.shape_lp import SAFETY, Boxes, Cells, all_boxes, least_reduced_costs
from model.planning.shapes import charged_tables

# requests x candidates up to the top beyond which the search is not started: a node's children price an
# interval over every request below it each (the embedded default's chat bucket, 800 x 29: 6 ms a child, 290
# children a second; the Azure code trace, 8,819 x 117: 86 ms a child, its 116 first shapes alone 10 s)
MAX_WORK = 200_000
# beside the planner (``beside``) the search costs it nothing, so it runs on buckets up to this much work (the
# Azure code trace's 1.03M)
BESIDE_MAX_WORK = 5_000_000
# the search's memory at most: every node made holds its arrays (8 bytes per request of its prefix, 24 per
# cell) and NODE_OVERHEAD besides (counted as if none were ever freed), every frontier entry about ENTRY_BYTES
# (most are a node's unpriced children, which share it).  Counting the entries as nodes capped the Azure code
# trace's search at 2,835 entries, about 25 expansions (its bound 3.664e6 after 9 s, whatever the time;
# uncapped 3.681e6 after 90 s)
NODE_BYTES = 400_000_000
NODE_OVERHEAD = 1_000
ENTRY_BYTES = 200


@dataclass(frozen=True, eq=False)
class Prefix:
    """A node: the candidate indices of the prefix, its requests' cells (gens, counts, the chain's uncapped
    prices), which requests it holds (``rows``) and each one's cell, and the least reduced cost over its
    batches (<= 0)."""

    shapes: tuple[int, ...]
    G: np.ndarray
    n: np.ndarray
    pi: np.ndarray
    rows: np.ndarray
    cell: np.ndarray
    rc: float

    @property
    def nbytes(self) -> int:
        """What the node holds in memory, about (its arrays and NODE_OVERHEAD)."""
        return NODE_OVERHEAD + sum(a.nbytes for a in (self.G, self.n, self.pi, self.rows, self.cell))

    @property
    def requests(self) -> int:
        return len(self.rows)


@dataclass(frozen=True)
class PrefixBound:
    """The least bound over every shape set (before lam times the allowance, compiles included), whether it is
    exact (the least is a whole set's own value), and how many nodes were expanded."""

    bound: float
    exact: bool
    expanded: int


def suffix_values(own: np.ndarray, top: int, max_shapes: int) -> np.ndarray:
    """F[i, k]: the least over shape sets above candidate i ending at the top with at most k shapes of the sum
    of the table's entries ``own[lo + 1, hi]`` of their intervals, the first from i (inf where k = 0)."""
    F = np.full((top + 1, max_shapes + 1), np.inf)
    for k in range(1, max_shapes + 1):
        for i in range(top - 1, -1, -1):
            best = own[i + 1, top]
            if k > 1 and i + 1 < top:
                best = min(best, float(np.min(own[i + 1, i + 1:top] + F[i + 1:top, k - 1])))
            F[i, k] = best
    return F


def suffix_path(own: np.ndarray, F: np.ndarray, i: int, k: int, top: int) -> list[tuple[int, int]]:
    """The intervals (lo, hi) of a set above candidate i attaining ``suffix_values``' F[i, k]."""
    path = []
    while k > 1 and i + 1 < top:
        vals = own[i + 1, i + 1:top] + F[i + 1:top, k - 1]
        j = int(np.argmin(vals))
        if own[i + 1, top] <= vals[j]:
            break
        path.append((i, i + 1 + j))
        i, k = i + 1 + j, k - 1
    return [*path, (i, top)]


class Suffixes:
    """The riders' DP over the sets above each candidate (``suffix_values``) on the bucket's charged table, its
    entries raised by ``rider_bound.rider_entry`` along the sets the search asks about (those not raised
    before): an entry only rises and every raised one is a valid entry, so every F on the way is a bound."""

    def __init__(self, problem: Problem, S: np.ndarray, G: np.ndarray, phi: np.ndarray, acc: np.ndarray,
                 raised: np.ndarray, charge: np.ndarray, top: int, cands: np.ndarray, lam: float,
                 limit: float | None):
        self.args = (problem, S, G, phi, cands)
        self.top, self.lam, self.limit, self.K = top, lam, limit, problem.max_shapes
        self.charge = charge
        self.own = charged_tables(acc, charge, top)[0]
        self.raised = raised.copy()
        self.F = suffix_values(self.own, top, self.K)

    def value(self, i: int, k: int, deadline: Deadline) -> float:
        """F[i, k] after raising the entries of the sets attaining it until they all are or ``deadline`` passes."""
        while not deadline.expired():
            path = suffix_path(self.own, self.F, i, k, self.top)
            todo = [(lo, hi) for lo, hi in path if not self.raised[lo + 1, hi]]
            if not todo:
                break
            for lo, hi in todo:
                if deadline.expired():
                    break
                problem, S, G, phi, cands = self.args
                entry = rider_entry(problem, S, G, phi, cands, lo, hi, self.top, self.lam, self.limit)
                self.own[lo + 1, hi] = max(self.own[lo + 1, hi], entry + self.charge[hi])
                self.raised[lo + 1, hi] = True
            self.F = suffix_values(self.own, self.top, self.K)
        return float(self.F[i, k])


def shape_boxes(problem: Problem, S: np.ndarray, G: np.ndarray, cands: np.ndarray, hi: int, limit: float | None
                ) -> Boxes:
    """The boxes at candidate hi over every request that fits under it (``shape_lp.all_boxes``): they depend on
    those requests' gens alone, not on how a prefix splits them into intervals, so the search builds them once
    per candidate."""
    gens, n = np.unique(G[S <= cands[hi]], return_counts=True)
    return all_boxes(problem.cost, Cells(np.zeros(len(gens), dtype=np.int64), gens, n), np.array([int(cands[hi])]),
                     limit, problem.max_batch_size)


def extend(node: Prefix, S: np.ndarray, G: np.ndarray, cands: np.ndarray, hi: int, boxes: Boxes, lam: float
           ) -> Prefix:
    """The node with candidate ``hi`` added: the new interval priced by the chain with the node's requests as
    riders at their uncapped prices (divided by theta where riders alone overrun a batch there); the least
    reduced cost over the new shape's batches (``boxes``: ``shape_boxes`` at hi) joins the node's."""
    lo = node.shapes[-1] if node.shapes else -1
    rows = np.flatnonzero(interval_rows(S, cands, lo, hi))
    gens, inv = np.unique(G[rows], return_inverse=True)
    counts = np.bincount(inv, minlength=len(gens))
    cells = Cells(np.zeros(len(node.G) + len(gens), dtype=np.int64), np.r_[node.G, gens], np.r_[node.n, counts])
    order = np.argsort(-node.pi, kind="stable")
    Tp, theta = member_limits(boxes, np.arange(len(boxes.i)), gens, int(counts.sum()), node.pi[order],
                              node.n[order], node.G[order], lam)
    pi = np.r_[node.pi / theta, interval_prices(counts, Tp) if len(gens) else np.zeros(0)]
    rc = least_reduced_costs(cells, boxes, pi, lam)
    return Prefix(node.shapes + (hi,), cells.G, cells.n, pi, np.r_[node.rows, rows].astype(np.int32),
                  np.r_[node.cell, len(node.G) + inv].astype(np.int32), min(node.rc, float(rc.min(initial=0.0))))


def prefix_value(node: Prefix, phi: np.ndarray, top: int, charge: np.ndarray) -> float:
    """What every plan's prefix batches cost at least plus its compiles: the Lagrangian on the node's prices,
    each request's capped at phi at the candidate after the prefix's last shape unless that is the top (lower
    prices keep every batch's reduced cost at least what it was)."""
    last = node.shapes[-1]
    prices = node.pi[node.cell]
    if last < top:
        prices = np.minimum(prices, phi[node.rows, last + 1])
    return float(prices.sum()) + node.requests * min(0.0, node.rc) + float(np.sum(charge[list(node.shapes)]))


def prefix_bound(problem: Problem, S: np.ndarray, G: np.ndarray, phi: np.ndarray, acc: np.ndarray,
                 raised: np.ndarray, charge: np.ndarray, top: int, cands: np.ndarray, lam: float, limit: float | None,
                 deadline: Deadline, on_rise: Callable[[float], None] | None = None, max_work: int = MAX_WORK
                 ) -> PrefixBound:
    """One bucket's bound over every shape set of at most K shapes (see module docstring): requests with entry
    shapes S and gens G, phi their prices at every candidate, ``acc`` the bucket's interval table at the same
    multiplier lam with the entries marked ``raised`` raised (``rider_bound.raised_table``; the search raises
    the rest it needs), ``charge`` its compile per candidate, ``top`` its longest prompt's candidate; the P95
    ``limit`` priced at lam (None: not).  -inf where the bucket is too large to search (``max_work``); the riders'
    DP itself where the deadline passed before any node was priced; inf where no plan holds the requests.
    ``on_rise`` is told each higher least bound as the search goes (lowered by SAFETY: valid when told)."""
    limit = limit if lam > 0 else None
    K = problem.max_shapes
    if len(S) * (top + 1) > max_work:
        return PrefixBound(-np.inf, False, 0)
    suffixes = Suffixes(problem, S, G, phi, acc, raised, charge, top, cands, lam, limit)
    own, F = suffixes.own, suffixes.F
    empty, none = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int32)
    root = Prefix((), empty, empty, np.zeros(0), none, none, 0.0)
    tie = itertools.count()
    boxes_at = functools.cache(lambda h: shape_boxes(problem, S, G, cands, h, limit))
    # a frontier item: (bound, tie, node, state, h); OPEN a priced prefix to expand, CHILD the node's child at
    # candidate h not priced yet (the riders' DP through h until popped), CLOSE the node closed with the top not
    # priced yet, WHOLE a whole set priced
    OPEN, CHILD, CLOSE, WHOLE = 0, 1, 2, 3
    frontier: list[tuple[float, int, Prefix, int, int]] = []
    if K >= 1:  # the top alone
        frontier.append((float(own[0, top]), next(tie), root, CLOSE, top))
    for y in range(top) if K >= 2 else ():  # the root's children: each first shape below the top
        frontier.append((float(own[0, y] + F[y, K - 1]), next(tie), root, CHILD, y))  # the riders' DP's bound
    heapq.heapify(frontier)
    told = -np.inf
    expanded = 0
    made = 0  # bytes of the nodes made so far
    while (frontier and frontier[0][3] != WHOLE and not deadline.expired()
           and made + len(frontier) * ENTRY_BYTES < NODE_BYTES):
        check_interrupt()
        if on_rise is not None and told < frontier[0][0] < np.inf:
            told = frontier[0][0]
            on_rise(told - SAFETY * abs(told))
        bound, _, node, state, h = heapq.heappop(frontier)
        if state == CLOSE:  # price the set node + (top,) whole
            whole = extend(node, S, G, cands, top, boxes_at(top), lam)
            made += whole.nbytes
            value = prefix_value(whole, phi, top, charge)
            heapq.heappush(frontier, (max(bound, value), next(tie), whole, WHOLE, top))
        elif state == CHILD:
            child = extend(node, S, G, cands, h, boxes_at(h), lam)
            made += child.nbytes
            used = len(child.shapes)
            value = prefix_value(child, phi, top, charge) + suffixes.value(h, K - used, deadline)
            heapq.heappush(frontier, (max(bound, value), next(tie), child, OPEN, h))
        else:
            last, used = node.shapes[-1], len(node.shapes)
            base = prefix_value(node, phi, top, charge)
            value = base + suffixes.value(last, K - used, deadline)  # the entries raised since it was priced
            if value > bound * (1 + 1e-12) + 1e-9:
                heapq.heappush(frontier, (value, next(tie), node, OPEN, h))
                continue
            expanded += 1
            own = suffixes.own
            heapq.heappush(frontier, (max(bound, base + float(own[last + 1, top])), next(tie), node, CLOSE, top))
            for nxt in range(last + 1, top) if used + 2 <= K else ():  # until priced, the riders' DP through nxt
                path = base + float(own[last + 1, nxt] + suffixes.F[nxt, K - used - 1])
                heapq.heappush(frontier, (max(bound, path), next(tie), node, CHILD, nxt))
    if not frontier:
        return PrefixBound(np.inf, True, expanded)
    least, _, _, state, _ = frontier[0]
    if np.isfinite(least):
        least -= SAFETY * abs(least)  # float sums at a tie must not lift it above the optimum
    return PrefixBound(least, state == WHOLE, expanded)  # inf: no plan holds the requests (no batch fits)
