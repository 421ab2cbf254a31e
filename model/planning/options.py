"""Every tuning constant of the MIP planner (``plan_mip`` and what it calls), in one frozen record passed down
the call chain.

The windowed planner's shares of its time limit (``model.planning.windowed``), the infeasibility probes'
time (``model.planning.diagnose``) and the window bound's LP sizes (``model.planning.window_bound``) are that
planner's and that module's own, named at the top of each.

None of these changes what a plan costs or whether it is valid -- the evaluator
judges every plan exactly -- they only trade solve time against how close to the
bound the planner gets within its time limit.  Defaults were set on the shared
workloads and the Azure traces (see ``scripts/bench.py``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PlannerOptions:
    """How the planner spends its time.

    Attributes:
      max_gen_values: distinct gen values a bucket keeps before its histogram is
        coarsened to upper edges (the bound stays certified on the exact cells).
      pricing_budget: boxes (t values x gen values) a bucket's grid may hold before
        its gens are coarsened further (pricing keeps a few arrays of this size).
      target_gap: once the incumbent is this close to the bound, only polish it.
      polish_s, polish_share: the full MIP polishes an incumbent within target_gap
        for polish_s seconds or polish_share of the time left, whichever is longer
        (CP-SAT and PuLP spend seconds building an 80k-column model before they search).
      max_repairs: re-solves with tightened limits after the exact evaluation finds
        a limit the model missed (a compile spike it could not place harmlessly).
      greedy_max_requests: above this many requests the greedy warm start is skipped
        (its merges work per request and would eat the time limit).
      all_shapes_max: strict mode searches every candidate shape up to this many,
        else only the shape relaxation's choice.
      greedy_share: share of the time limit the greedy warm start may use (cut
        short, the search starts without it).
      colgen_share: share of the time limit column generation may use.
      exact_bound_share: share of what column generation left that is kept for
        the bound on the exact histogram (after the MIP) when gens were coarsened.
      support_share: share of what is left that the first MIP (over the LP's
        support) may use before the full search.
      columns_per_round: boxes added per bucket per column-generation round.
      max_rounds: column-generation rounds at most.
      arcs_per_box: most valuable arcs a box gets per pricing round.
      full_arcs: a model with at most this many arcs is built whole (no column
        generation: the MIP is then exact).
      spike_arcs: a reference-mode model with at most this many arcs gives every arc a
        column for "the compile spike lands here" (exact spikes); a bigger one counts
        each spike whole against sequential time (sound, and a smaller model).
      max_polish_arcs: reduced-cost fixing keeps at most about this many arcs (each
        box's most valuable) for the second MIP: with a weak bound it kept 5M arcs of a
        long-context trace, which no backend could even load within the limit.
      min_call_s: the least time a solver call is granted (the deadline is honoured,
        not padded).
      repair_margin: a limit the exact evaluation found broken is lowered by this
        many times its excess.
      flow_shape_levels, flow_gen_levels: strict/device mode's flow model keeps at most
        this many shape levels (shared) and gen levels (per bucket); beyond that they
        are request-weighted quantiles and the bound comes from the relaxed model.
      start_share: share of the time limit device mode's start (shape local search with
        exact batching) may use.
      fallback_share: share of the time left that device mode's packer fallbacks may start
        within (a packer is not started after it).
      start_rebatch_share: device mode: share of the time left after the fallbacks within which the cheapest
        of them is re-batched exactly on its own shapes (``mip.rebatched_fallback``; 4 s with the counted DP in
        single members on 12k long-context requests, whose time model asks 7.5 s: 0.3 of a 30 s run's 25 s left
        was too little): a candidate that the search's time cannot squeeze.
      relaxation_share: share of the time limit device mode's shape relaxation may use
        (10 s on 10^5 long-context requests); cut short, it gives no bound and the one
        shape covering every prompt as the start.
      lp_price_share: share of the time left that device mode's LP-price bound
        (``model.planning.window_bound.whole_trace_bound``) may use; cut short, it prices the
        remaining shapes by per-request floors and stays valid.
      lp_price_max_cells: that bound prices every request at every candidate shape;
        above this many (requests x candidates) it is skipped (10^5 long-context
        requests x 2,000 shapes took 50 s and 1.6 GB); it is skipped too when even
        its floors-only table would take over a quarter of the time left.
      judge_margin, judge_s_per_request: the final judging (expansion and exact evaluation) must fit in the
        time limit too: it is timed on greedy's plan and that much times judge_margin kept; without greedy it
        is estimated at judge_s_per_request per request (measured at 10^7: 20-25 s).
      final_pass_judges: the final shape pass judges up to this many re-declarations of the returned plan.
      solver_stop_s, solver_stop_share: a solver call may end this long after its limit (a HiGHS run left
        behind, a child killed): kept back, but never more than this share of the whole limit, which a short
        run needs for its search and bound.
      match_s_per_cell: device mode: the flow solution's matching to requests (0.48 s on 68k cells).
      rebatch_share: device mode: share of the time limit kept back from the search for re-batching the
        cheapest candidates' shapes exactly under the limits (``model.planning.rebatch``: 1 s with the weights
        and 4 s with the counted DP in single members on 12k long-context requests) and moving members up a shape
        (``model.planning.move_up``) -- a quarter, or on a long trace the bound's second pass leaves the counted
        DP too little for counts in single members; 0: no re-batching, at the start or the end (the
        windowed planner's per-window MIPs, whose merged plan it re-batches once).
      on_shapes_share: device mode: share of the time left after the final judging within which the returned
        plan's own shapes are priced (``model.planning.fixed_set.on_shapes_bound``: the rider chain, 0.5 s on the
        embedded default, 7.6 s with its whole multiplier sweep on 12k long-context requests, so a quarter of what
        is left cuts the sweep there): a bound on every plan compiling those shapes, which tells how much of the
        gap better batching could close; 0: not priced (the windowed planner's per-window MIPs).
      chain_shapes_share: device mode: share of the time left after the re-batching within which each bucket's
        shape set is searched near the cheapest plan's by the rider chain's bound and the best found planned on
        (``model.planning.chain_shapes``; the main job: 465,198 -> 455,720); 0: not searched.
      prefix_share: device mode: share of the time left after the LP-price bound within which each bucket's own
        bound is raised by the branch and bound over its shape sets (``model.planning.prefix_bound``; the
        embedded default's chat bucket: 287,654 -> about 297,000 in 1 s, the short one exact in 0.1 s); 0: not
        searched (the windowed planner's per-window MIPs).
      beside_slice_s: device mode, where a second core can take the search over shape sets beside the planner
        (``model.planning.beside``): the planner's own search is cut at this many seconds (small buckets end
        exact within it) and a forked process searches on until the planner reports; 0: never forked.
      beside_wait_s: how long the planner, its plan final, waits at most for that search while its bound is more
        than ``target_gap`` below the plan (never past the time limit): the embedded default's chat search ends
        exact about 2 s after the plan; 0: stopped at once.
      flow_stall_s, flow_stall_share: device mode's flow MIP gives its time back once it has found no
        better incumbent for the larger of these (seconds; share of the time it was given), counted from its
        start: on the embedded default it never beats the exact-runs start and ran 58 s for nothing (1.5 s and 3 %:
        2.5 s there at 2 s and 5 %; the Azure traces' plans unchanged at 30 s).
    """

    max_gen_values: int = 2048
    pricing_budget: float = 4e6
    target_gap: float = 1e-3
    polish_s: float = 3.0
    polish_share: float = 0.2
    max_repairs: int = 2
    greedy_max_requests: int = 1_000_000
    all_shapes_max: int = 24
    greedy_share: float = 0.25
    colgen_share: float = 0.45
    exact_bound_share: float = 0.3
    support_share: float = 0.25
    columns_per_round: int = 300
    max_rounds: int = 30
    arcs_per_box: int = 96
    full_arcs: int = 20_000
    spike_arcs: int = 20_000
    max_polish_arcs: int = 400_000
    min_call_s: float = 0.05
    repair_margin: float = 1.01
    flow_shape_levels: int = 48
    flow_gen_levels: int = 160
    start_share: float = 0.2
    relaxation_share: float = 0.3
    fallback_share: float = 0.3
    start_rebatch_share: float = 0.4
    lp_price_share: float = 0.2
    lp_price_max_cells: int = 20_000_000
    judge_margin: float = 1.5
    judge_s_per_request: float = 2.5e-6
    final_pass_judges: int = 2
    solver_stop_s: float = 0.5
    solver_stop_share: float = 0.1
    match_s_per_cell: float = 7e-6
    rebatch_share: float = 0.25
    flow_stall_s: float = 1.5
    flow_stall_share: float = 0.03
    on_shapes_share: float = 0.25
    chain_shapes_share: float = 0.3
    prefix_share: float = 0.025
    beside_slice_s: float = 0.15
    beside_wait_s: float = 3.0
