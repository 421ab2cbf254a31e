"""Which part of a windowed gap is the plan and which the bound: each window's exact LP under the plan's shapes.

The certified bound of the windowed problem (``model.planning.window_bound``) is the least,
over every shape set Y, of per-request prices at their smallest covering shape of Y plus
the compiles.  A gap between it and a plan mixes three things, which this module splits:

1. ``shape part``: the bound's value at the plan's own shapes (the same prices, Y fixed to
   the plan's set: ``relax``) less the bound -- what the bound's freedom to pick another
   shape set costs it (or what another set could save a plan);
2. per window, with the plan's shapes fixed every window is a problem of its own, and
   ``model.planning.window_lp`` bounds it by the set-partitioning LP (column generation
   started from the bound's own prices, so it never ends below them; the rider chain's
   certified bound, ``model.planning.rider_chain``, where that is higher): the plan's batches
   above that LP bound are at most what the plan leaves to gain under its shapes (``plan
   part``: exact where the LP converged and is integral, an upper bound elsewhere), and the
   LP bound above the bound's prices is what the prices fail to charge (``bound part``).
   Where the problem has no limits, each sampled window's own MIP under the plan's shapes
   is run too: a cheaper plan it finds is surely the plan's part (``plan_at_least``).

Bounding every window takes long on big windows, so (2) is measured on a sample of windows
(an even spread by size) and its shares applied to the rest of the gap; the split says so.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from model.base.errors import InfeasibleError, NoPlanFound
from model.base.runtime import Deadline
from model.domain.schema import Batching, Bucket, Limits, Problem
from model.domain.windowing import windows_of
from model.planning.contract import Judge
from model.planning.mip import plan_mip
from model.planning.rider_chain import chain_bound
from model.planning.window_bound import suffix_min, window_prices
from model.planning.window_lp import window_lp
from model.planning.window_runs import entry_shapes


@dataclass(frozen=True)
class WindowGap:
    """One window of one bucket: its requests, the plan's batch cost there, the bound's prices at the plan's
    shapes (``relax``) and the window's LP bound under those shapes (``lp``, >= relax), converged or not."""

    bucket: int
    window: int
    requests: int
    plan: float
    relax: float
    lp: float | None = None
    converged: bool = False
    found: float | None = None  # the cheapest plan of the window under the plan's shapes its own MIP found


@dataclass(frozen=True)
class GapSplit:
    """The plan's cost, the certified bound, every window's plan and relax (compiles added once), and the
    windows bounded by their LP (the sample)."""

    cost: float
    bound: float
    compile_cost: float
    windows: tuple[WindowGap, ...]

    @property
    def sample(self) -> tuple[WindowGap, ...]:
        return tuple(w for w in self.windows if w.lp is not None)

    @property
    def relax_total(self) -> float:
        """The bound's prices at the plan's shapes, summed over every window, plus the plan's compiles: a
        certified bound on every plan that declares only the plan's shapes."""
        return sum(w.relax for w in self.windows) + self.compile_cost

    @property
    def gap(self) -> float:
        return (self.cost - self.bound) / self.cost

    @property
    def shape_part(self) -> float:
        """Share of the cost between the bound at the plan's shapes and the bound (part 1); 0 where the bound is
        above its plain prices at the plan's shapes (the riders' entries raise the bound, not those prices)."""
        return max(0.0, (self.relax_total - self.bound) / self.cost)

    def plan_at_least(self) -> float | None:
        """The share of the rest of the gap that is surely the plan's: on the sample, the plan's batches above
        the cheapest plan each window's own MIP found under the same shapes (None without those MIPs)."""
        sample = [w for w in self.sample if w.found is not None]
        above = sum(w.plan - w.relax for w in sample)
        if not sample or above <= 0:
            return None
        rest = (self.cost - self.relax_total) / self.cost
        return rest * sum(w.plan - min(w.plan, w.found) for w in sample) / above

    def window_parts(self) -> tuple[float, float] | None:
        """(plan part, bound part) of the rest of the gap, (cost - relax_total) / cost, split by the sample's
        shares (part 2); None without a sample or where the sample has no gap."""
        sample = self.sample
        above = sum(w.plan - w.relax for w in sample)
        if not sample or above <= 0:
            return None
        rest = (self.cost - self.relax_total) / self.cost
        plan = sum(w.plan - w.lp for w in sample) / above
        return rest * plan, rest * (1 - plan)


def window_batches(problem: Problem, b: int, batching: Batching) -> dict[int, list[np.ndarray]]:
    """Per window of bucket b, its batches' members (bucket rows)."""
    wins = windows_of(problem, problem.buckets[b])
    batch_of = np.asarray(batching.batch_of, dtype=np.int64)
    order = np.argsort(batch_of, kind="stable")
    starts = np.flatnonzero(np.r_[True, np.diff(batch_of[order]) != 0])
    out: dict[int, list[np.ndarray]] = {}
    for members in np.split(order, starts[1:]):
        if len(members):
            out.setdefault(int(wins[members[0]]), []).append(members)
    return out


def window_costs(problem: Problem, b: int, batching: Batching) -> list[tuple[int, np.ndarray, np.ndarray, list]]:
    """Per window of bucket b (by window): (window, rows, entry shapes, the plan's batches as (cost, members
    by window position))."""
    cm, bucket = problem.cost, problem.buckets[b]
    E = entry_shapes(problem, bucket)
    out = []
    for w, batches in sorted(window_batches(problem, b, batching).items()):
        rows = np.concatenate(batches)
        local = np.empty(int(rows.max()) + 1, dtype=np.int64)
        local[rows] = np.arange(len(rows))
        cols = [(float(cm.batch_total(len(m), int(batching.shape_of[batching.batch_of[m[0]]]),
                                      int(bucket.gen_len[m].max()))), local[m]) for m in batches]
        out.append((w, rows, E[rows], cols))
    return out


def relax_prices(problem: Problem, S: np.ndarray, G: np.ndarray, shapes: np.ndarray,
                 deadline: Deadline = Deadline.never()) -> np.ndarray:
    """The windowed bound's price of each request (window order) at its smallest covering shape of ``shapes``,
    the prices taken over those shapes only (``window_prices``, then the least over the shapes above)."""
    order = np.argsort(G, kind="stable")
    psi = window_prices(problem, S[order], G[order], shapes, problem.cost.shared_batch_time, deadline)
    phi = suffix_min(psi)
    out = np.empty(len(S))
    out[order] = phi[np.arange(len(S)), np.searchsorted(shapes, S[order])]
    return out


def window_mip(problem: Problem, b: int, rows: np.ndarray, shapes: np.ndarray, judge: Judge, seconds: float
               ) -> float | None:
    """The cheapest plan of one window's requests under ``shapes`` (compiles aside, no limits) the MIP planner
    finds in ``seconds``: what the windowed plan could have had there (None when it finds none)."""
    bucket = problem.buckets[b]
    sub = Bucket(bucket.name, bucket.source, bucket.request_ids[rows], bucket.prompt_len[rows],
                 bucket.gen_len[rows], bucket.lines[rows])
    allowed = tuple(int(s) for s in shapes)
    alone = replace(problem, buckets=(sub,), limits=(Limits(),), windowing=None, allowed_shapes=allowed,
                    max_shapes=len(allowed), cost=problem.cost.without_compile())
    try:
        return plan_mip(alone, time_limit=seconds, judge=judge).report.objective
    except (InfeasibleError, NoPlanFound):
        return None


def gap_split(problem: Problem, batchings: tuple[Batching, ...], cost: float, bound: float, compile_cost: float,
              deadline: Deadline, most: int = 12, window_s: float = 5.0, judge: Judge | None = None) -> GapSplit:
    """The split of a windowed plan's gap (module docstring): every window's plan cost and relax, then the LP of
    an even sample of at most ``most`` windows by size, each given ``window_s`` seconds, while the deadline
    allows; with a ``judge`` and no limits, each sampled window's own MIP too (as long again), whose plan
    shows how much of the gap is surely the plan's."""
    found: list[WindowGap] = []
    detail = {}
    for b, bt in enumerate(batchings):
        shapes = np.unique(np.asarray(bt.shape_of, dtype=np.int64))
        for w, rows, S, cols in window_costs(problem, b, bt):
            prices = relax_prices(problem, S, problem.buckets[b].gen_len[rows], shapes)
            found.append(WindowGap(b, w, len(rows), sum(c for c, _ in cols), float(prices.sum())))
            detail[(b, w)] = (S, problem.buckets[b].gen_len[rows], shapes, cols, prices)
    by_size = sorted(range(len(found)), key=lambda i: (found[i].requests, i))
    picks = sorted(set(by_size[i] for i in np.linspace(0, len(by_size) - 1, min(most, len(by_size))).round()
                       .astype(int).tolist())) if found else []
    for i in picks:
        if deadline.expired():
            break
        g = found[i]
        S, G, shapes, cols, prices = detail[(g.bucket, g.window)]
        until = Deadline(min(deadline.at, Deadline.after(window_s).at))
        # the rider chain's certified bound first (a fraction of a second): the LP below often stops short of it
        chain = chain_bound(problem.cost, S, G, shapes, None, problem.max_batch_size, until).bound
        res = window_lp(problem.cost, S, G, shapes, problem.max_batch_size, cols, until, center=prices)
        better = None
        if judge is not None and all(not lim.items() for lim in problem.limits) and not deadline.expired():
            rows = np.flatnonzero(windows_of(problem, problem.buckets[g.bucket]) == g.window)
            better = window_mip(problem, g.bucket, rows, shapes, judge, min(window_s, deadline.left()))
        found[i] = WindowGap(g.bucket, g.window, g.requests, g.plan, g.relax, max(res.bound, chain, g.relax),
                             res.converged, better)
    return GapSplit(cost, bound, compile_cost, tuple(found))
