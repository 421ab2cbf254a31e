"""Plan a serving graph set: replay, record the step demands, choose graphs by MIP, replay again until stable.

The graph set changes the schedule (a padded step takes longer, so more requests queue
and the next prompt step batches more of them), so no single MIP over one replay's
demands can promise what the server will do.  The loop (the design card's shape):

1. replay the trace on a set that pads almost nothing (``candidates.dense_set``): its
   steps are close to what the traffic asks for;
2. record the steps' demands (``demands``), with every demand an earlier round saw kept
   at weight 0 (the graphs must still cover it), and build the candidate grid;
3. solve the MIP (``cover``): at most N graphs, every demand on the graph the lookup
   picks, least busy time of the recorded steps;
4. replay on the chosen set; stop when the MIP, given that replay's demands, chooses the
   same set again and the replay compiled nothing at run time (stable), else go to 2.

Under gaudi the prefill cap (``max_prefill_seqs``: how many prompts one step batches)
is a setting the graphs need, and it moves the answer most -- batching prompts pads
them to the longest -- so the loop runs once per cap (powers of two up to the
server's ceiling) and keeps going while a larger cap still helps.  The replay of the
chosen set, with the settings an export writes, is what is reported and what the SLOs
are judged on; the MIP's gap is reported for what it is valid for: the recorded
demands of the round that chose the set, over the candidate grid.

The MIP minimises busy time, which says nothing of latency: a decode graph twice the
size of a step's batch slows every request in it.  When the replay misses an SLO, the
same cap is planned again with a slowdown limit (no recorded step may run on a graph
more than 1.5, then 1.25, then 1.1 times slower than a graph of its own size), starting
from the set before; the first level that meets the SLOs is kept.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from model.base.runtime import Deadline, DeadlineExceeded
from model.cost.serving import ServingCost
from model.domain.server import GraphSet, ServerSettings
from model.evaluation.replay_metrics import ReplaySummary, Slo, summarize
from model.evaluation.replay_run import Trace, replay
from model.serveplan.candidates import Grid, batch_grid, dense_set, gaudi_families, graph_set, nxdi_families
from model.serveplan.cover import CoverReport, lookup_ms, solve_cover, uncovered
from model.serveplan.demands import Demands, merged, replay_demands

ROUNDS = 6  # replays of one cap: the set settles in two or three on the Azure traces
PATIENCE = 2  # gaudi: caps tried past the best one before the search stops (one more while none is accepted)
MIP_SHARE = 0.25  # of the time left, for one MIP
MIP_LEAST_S = 0.5  # one MIP's limit when a quarter of the time left is less (never past the deadline)
MIP_MOST_S = 60.0  # one MIP's own limit (the run's --time-limit bounds them all)
SLOWDOWNS = (None, 1.5, 1.25, 1.1)  # step-time limits over a step's own-size graph, loosest first
SETTLED = 1e-6  # relative: a set this close to the MIP's optimum on its own demands is a fixed point


@dataclass(frozen=True)
class PlanSpec:
    """What to plan for: the server (its settings as given), the graph cap, the SLOs, the replicas."""

    settings: ServerSettings
    max_graphs: int
    slo: Slo | None = None
    replicas: int = 1
    backend: str = "highs"
    rounds: int = ROUNDS
    grid: Grid = field(default_factory=Grid)
    caps: tuple[int, ...] | None = None  # gaudi prefill caps to try (default: powers of two up to the ceiling)
    slowdowns: tuple[float | None, ...] = SLOWDOWNS  # tried in turn while the replay misses an SLO


@dataclass(frozen=True)
class Round:
    """One replay of the loop: the set it ran, its busy time and run-time compiles, the MIP on its demands."""

    graphs: GraphSet
    busy_ms: float
    compiles: int
    cells: int
    mip: CoverReport | None
    chosen: GraphSet | None  # what that MIP chose (the next round's set)


@dataclass(frozen=True)
class Attempt:
    """One prefill cap's loop and what came of it (``reason`` says why it was not accepted)."""

    cap: int
    rounds: tuple[Round, ...]
    stable: bool
    slowdown: float | None = None
    graphs: GraphSet | None = None
    settings: ServerSettings | None = None
    summary: ReplaySummary | None = None
    mip: CoverReport | None = None  # the MIP that chose ``graphs``, on the demands of the round before
    reason: str | None = None
    over_budget: bool = False  # a prompt step no graph within the token budget covers (larger caps batch more)
    slo_missed: bool = False  # refused only for the SLOs: a tighter slowdown limit may meet them

    @property
    def accepted(self) -> bool:
        return self.reason is None and self.summary is not None


@dataclass(frozen=True)
class ServingPlan:
    """Every cap tried and the chosen one (the accepted attempt with the least busy time), or None."""

    attempts: tuple[Attempt, ...]
    best: Attempt | None
    timed_out: bool = False


def slo_problem(summary: ReplaySummary) -> str | None:
    """Why the replay misses its SLOs (None when it meets them or none was given)."""
    s = summary.slo
    if s is None:
        return None
    q = f"p{float(s.slo.quantile) * 100:g}"
    missed = []
    if s.ttft_met is False:
        missed.append(f"TTFT {q} {s.ttft_at_quantile:.1f} ms > {s.slo.ttft_ms:g} ms")
    if s.tpot_met is False:
        missed.append(f"TPOT {q} {s.tpot_at_quantile:.1f} ms > {s.slo.tpot_ms:g} ms")
    return "SLO missed: " + ", ".join(missed) if missed else None


def final_settings(settings: ServerSettings, graphs: GraphSet) -> ServerSettings:
    """The settings an export writes: gaudi's prefill cap = the largest prompt batch (the stack's own default,
    VLLM_PROMPT_BS_BUCKET_MAX); no step of the planning replay batched more, so the replay is the same."""
    if settings.stack != "gaudi":
        return settings
    return replace(settings, max_prefill_seqs=max(b for b, _ in graphs.prompt))


def settled(current: GraphSet, new: GraphSet, families, report: CoverReport, settings: ServerSettings,
            cost: ServingCost) -> bool:
    """The set is a fixed point: the MIP on the demands it produced chose it again, or chose a set no cheaper
    on those demands (a tie, which would only make the loop swap equals)."""
    if new == current:
        return True
    if report.objective is None:
        return False
    if settings.stack == "gaudi":
        kinds = ((current.prompt, lambda g: cost.prompt_ms(*g)),
                 (current.decode, lambda g: cost.decode_ms(g[0], g[1] * settings.block_size)))
    else:
        m = settings.max_num_seqs
        kinds = ((tuple((1, s) for s in current.context), lambda g: cost.prompt_ms(settings.ctx_batch_size, g[1])),
                 (tuple((1, s) for s in current.token_generation), lambda g: cost.decode_ms(m, m * g[1])))
    total = 0.0
    for family, (opened, price) in zip(families, kinds, strict=True):
        part = lookup_ms(family, opened, price)
        if part is None:
            return False
        total += part
    return total <= report.objective * (1 + SETTLED)


def _families(demands: Demands, settings: ServerSettings, cost: ServingCost, cap: int, longest: int, grid: Grid,
              slowdown: float | None):
    if settings.stack == "gaudi":
        return gaudi_families(demands, settings, cost, cap, longest, grid, slowdown)
    return nxdi_families(demands, settings, cost, grid, slowdown)


def plan_cap(trace: Trace, spec: PlanSpec, cost: ServingCost, cap: int, deadline: Deadline,
             tick: Callable[[], None] | None = None, slowdown: float | None = None,
             start: GraphSet | None = None, seen: list[Demands] | None = None) -> Attempt:
    """The loop for one prefill cap (gaudi) or for the server as it is (nxdi), from ``start`` (default: the
    dense set) with the demands ``seen`` before (kept covered; the list grows)."""
    base = replace(spec.settings, max_prefill_seqs=cap) if spec.settings.stack == "gaudi" else spec.settings
    longest = int((trace.prompt + trace.gen).max())
    pool = base.total_blocks(cost.profile.kv_capacity_tokens or 0)
    graphs = start or dense_set(base.stack, base, cap, int(trace.prompt.max()), longest, pool)
    seen = [] if seen is None else seen
    over: str | None = None  # the last prompt demand no kept graph covers
    rounds: list[Round] = []
    best: tuple[float, GraphSet, CoverReport | None] | None = None
    stable = False
    chooser: CoverReport | None = None
    for _ in range(spec.rounds):
        deadline.tick("serving plan")  # between rounds too: a small trace's replay never reaches its own tick
        result = replay(trace, base, graphs, cost, spec.replicas, record=True, tick=tick)
        busy = sum(r.busy_ms for r in result.replicas)
        compiles = sum(len(r.compiled) for r in result.replicas)
        found = replay_demands(result)
        if rounds and not compiles and (best is None or busy < best[0]):
            best = (busy, graphs, chooser)
        demands = merged([found], seen)
        seen.append(found)
        families = _families(demands, base, cost, cap, longest, spec.grid, slowdown)
        bad = uncovered(families[0])
        if len(bad):  # no kept graph can run them: left to the replay, which refuses a set whose steps need them
            n, s, _ = (int(v) for v in bad[-1])
            over = (f"a prompt step batched {n} prompts up to {s} tokens, which no graph within "
                    f"max_num_batched_tokens {base.max_num_batched_tokens} covers (vllm-gaudi drops larger ones)")
            keep = ~families[0].cover().any(axis=1)
            families = (replace(families[0], cells=families[0].cells[~keep],
                                exact_ms=None if families[0].exact_ms is None else families[0].exact_ms[~keep]),
                        families[1])
        deadline.tick("serving plan")
        limit = min(MIP_MOST_S, max(deadline.left() * MIP_SHARE, min(MIP_LEAST_S, deadline.left())))
        chosen = solve_cover(families, spec.max_graphs, spec.backend, limit)
        if chosen.graphs is None:
            rounds.append(Round(graphs, busy, compiles, demands.cells(), chosen.report, None))
            if chosen.report.status.proven_infeasible:
                return Attempt(cap, tuple(rounds), False, slowdown, reason=f"no {spec.max_graphs} graphs cover "
                               "the recorded demands within the slowdown limit (proven by the MIP for those demands)")
            break
        new = graph_set(base.stack, *chosen.graphs)
        rounds.append(Round(graphs, busy, compiles, demands.cells(), chosen.report, new))
        if len(rounds) > 1 and not compiles and settled(graphs, new, families, chosen.report, base, cost):
            stable = True
            break
        graphs, chooser = new, chosen.report
    if best is None:
        why = f"; {over}" if over else ""
        return Attempt(cap, tuple(rounds), stable, slowdown, reason="every replay of a chosen set compiled at "
                       f"run time (after {len(rounds)} rounds){why}", over_budget=over is not None)
    chosen_set, mip = best[1], best[2]
    settings = final_settings(base, chosen_set)
    deadline.tick("serving plan")
    result = replay(trace, settings, chosen_set, cost, spec.replicas, tick=tick)
    summary = summarize(result, cost, spec.slo)
    missed = slo_problem(summary)
    reason = f"the final replay compiled {len(summary.runtime_compiles)} graphs at run time" \
        if summary.runtime_compiles else missed
    return Attempt(cap, tuple(rounds), stable, slowdown, chosen_set, settings, summary, mip, reason,
                   slo_missed=reason is not None and reason == missed)


def caps_to_try(spec: PlanSpec) -> tuple[int, ...]:
    """gaudi: the given caps, or powers of two up to the server's prefill ceiling; nxdi: its ctx_batch_size."""
    s = spec.settings
    if s.stack != "gaudi":
        return (s.ctx_batch_size,)
    if spec.caps is not None:
        return spec.caps
    return tuple(batch_grid(min(s.max_prefill_seqs or s.max_num_seqs, s.max_num_seqs)))


def plan_levels(trace: Trace, spec: PlanSpec, cost: ServingCost, cap: int, deadline: Deadline,
                attempts: list[Attempt]) -> Attempt:
    """One cap at each slowdown limit in turn, while the replay misses only the SLOs (each level starts from the
    last one's set and keeps its demands covered); every attempt goes to ``attempts``, the last is returned."""
    seen: list[Demands] = []
    start = None
    for slowdown in spec.slowdowns:
        attempt = plan_cap(trace, spec, cost, cap, deadline, lambda: deadline.tick("serving plan"), slowdown, start,
                           seen)
        attempts.append(attempt)
        if not attempt.slo_missed:
            break
        start = attempt.graphs
    return attempt


def plan(trace: Trace, spec: PlanSpec, cost: ServingCost, deadline: Deadline | None = None) -> ServingPlan:
    """Run the loop for each cap (stopping PATIENCE caps past the best) and keep the least busy accepted one."""
    deadline = deadline or Deadline.never()
    attempts: list[Attempt] = []
    best: Attempt | None = None
    since = 0
    for cap in caps_to_try(spec):
        try:
            attempt = plan_levels(trace, spec, cost, cap, deadline, attempts)
        except DeadlineExceeded:
            return ServingPlan(tuple(attempts), best, timed_out=True)
        if attempt.accepted and (best is None or attempt.summary.busy_ms < best.summary.busy_ms):
            best, since = attempt, 0
        else:
            since += 1
            if since >= (PATIENCE if best is not None else PATIENCE + 1):
                break  # past the best, or nothing accepted three caps running
            if attempt.over_budget:
                break  # a larger cap batches more prompts still: it cannot get inside the budget either
    return ServingPlan(tuple(attempts), best)


def recorded_gap_text(report: CoverReport | None) -> str:
    """The MIP's certificate, worded for what it covers."""
    if report is None:
        return "no MIP chose this set"
    if report.gap is None:
        return f"MIP {report.status.text} ({report.backend} {report.version}), no bound"
    return (f"MIP {report.status.text} ({report.backend} {report.version}): gap {report.gap:.3%} for the RECORDED "
            "demands of the round that chose the set, over the candidate grid (not a bound on the replay)")
