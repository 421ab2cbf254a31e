"""The run's clock and its exits: a deadline reaches every long phase, a cut bound stays valid, no plan without a
proof is exit 4 (never 3), signals are exit 130/143, and --time-limit must be a positive number.

Phases are made slow by monkeypatching (each one still checks its deadline as the real one does), so these run
in seconds; ``test_deadline_slow.py`` measures the real thing on big inputs.
"""

from __future__ import annotations

import math
import signal
import time

import numpy as np
import pytest
from helpers import broken_limits, check_valid, evaluated, plan_mip
from test_solve_cli import OLD_PLAN, synthetic

from model import pipeline, solve, sweep
from model.base.errors import InfeasibleError, NoPlanFound
from model.base.runtime import (
    Deadline,
    DeadlineExceeded,
    Interrupted,
    clear_interrupt,
    request_interrupt,
    run_native,
)
from model.cli_common import run_main
from model.cost.model import StrictCost, cost_model
from model.domain.schema import Limits, Problem
from model.formulation import pricing
from model.histogram.cells import build_histogram
from model.planning import mip, stages
from solvers.backends import highs
from solvers.backends.result import BackendResult, SolveOptions, Status

SLACK = 0.3  # seconds a loaded test machine may add on top of the 10% allowance


@pytest.fixture(autouse=True)
def no_interrupt_left():
    yield
    clear_interrupt()


def two_buckets(n: int = 150, seed: int = 3, limits: Limits = Limits()) -> Problem:
    return Problem(synthetic(n, seed), (limits, limits), 8)


# ---------------------------------------------------------------- the clock itself


def test_deadline_arithmetic():
    d = Deadline.after(10.0)
    assert 9.0 < d.left() <= 10.0 and not d.expired()
    assert d.within(1.0).left() <= 1.0 and d.within(100.0).at == d.at
    assert 4.0 < d.share(0.5).left() <= 5.0
    assert Deadline.never().left() == math.inf and Deadline(0.0).expired() and Deadline(0.0).left() == 0.0


def test_tick_stops_at_the_deadline_and_on_an_interrupt():
    Deadline.never().tick("phase")  # nothing to stop
    with pytest.raises(DeadlineExceeded, match="phase"):
        Deadline(0.0).tick("phase")
    request_interrupt(signal.SIGTERM)
    with pytest.raises(Interrupted) as stop:
        Deadline.never().tick("phase")
    assert stop.value.exit_code == 143


def test_run_native_leaves_behind_a_call_that_ignores_stop():
    """A native call that polls nothing is told to stop at ``until`` and left behind ``grace_s`` later."""
    t0 = time.perf_counter()
    stopped = []
    run = run_native(lambda: time.sleep(1.5), lambda: stopped.append(time.perf_counter() - t0),
                     until=t0 + 0.2, grace_s=0.2)
    assert run.abandoned and not run.interrupted and run.result is None
    assert stopped and 0.15 < stopped[0] < 0.4 and time.perf_counter() - t0 < 0.8
    ran = []
    skipped = run_native(lambda: ran.append(1), lambda: None, until=time.perf_counter() + 0.2)
    assert skipped.abandoned and not ran  # the one left behind still runs at this call's deadline: not started
    done = run_native(lambda: 42, lambda: None)  # waits for the one left behind first
    assert done.result == 42 and time.perf_counter() - t0 >= 1.4


def test_run_native_hands_back_the_result_and_the_exception():
    assert run_native(lambda: "x", lambda: None).result == "x"
    with pytest.raises(ZeroDivisionError):
        run_native(lambda: 1 / 0, lambda: None)


# ---------------------------------------------------------------- slow phases honour the deadline


def slow_pricing(monkeypatch, seconds: float):
    """Every pricing pass takes ``seconds`` (checking its deadline every 50 ms, as the real chunks do)."""
    real = pricing.price_boxes

    def slow(bm, grid, duals, max_batch, check=None):
        for _ in range(int(seconds / 0.05)):
            time.sleep(0.05)
            if check is not None:
                check()
        return real(bm, grid, duals, max_batch, check)

    monkeypatch.setattr(pricing, "price_boxes", slow)


@pytest.mark.parametrize("mode", ["reference", "strict"])
def test_slow_pricing_is_cut_at_the_deadline_and_the_bound_stays_valid(monkeypatch, mode):
    """Pricing that takes 3 s a pass under a 1.5 s limit: the run still ends in time, says the pricing was cut,
    and its bound (the own-box floor: no pass completed) is below the plan's exact cost."""
    slow_pricing(monkeypatch, 3.0)
    prob = Problem(synthetic(150, 3), (Limits(), Limits()), 8, cost_model(mode))
    t0 = time.perf_counter()
    out = plan_mip(prob, time_limit=1.5)
    spent = time.perf_counter() - t0
    assert spent <= 1.5 * 1.1 + SLACK, spent
    assert any("cut column generation's pricing short" in n for n in out.report.notes), out.report.notes
    cost = sum(r.metrics.cost for r in check_valid(prob, out.batchings))
    assert out.report.bound <= cost * (1 + 1e-12)


def test_a_cut_exact_bound_falls_back_to_the_floor(monkeypatch):
    """Coarsened gens: the exact-histogram bound is the last phase; cut, it must not be the partial Lagrangian."""
    from model.planning import options as options_module

    prob = two_buckets(300)
    opts = options_module.PlannerOptions(max_gen_values=48, pricing_budget=1.0)  # force coarsening
    calls = []
    real = pricing.lagrangian_bound

    def spy(*args, **kw):
        calls.append(time.perf_counter())
        if len(calls) > 1:  # colgen's rounds run fast; the exact-histogram pass is slow
            slow_pricing(monkeypatch, 5.0)
        return real(*args, **kw)

    monkeypatch.setattr(pricing, "lagrangian_bound", spy)
    from model.planning import colgen

    monkeypatch.setattr(colgen, "lagrangian_bound", spy)
    t0 = time.perf_counter()
    out = plan_mip(prob, time_limit=2.0, options=opts)
    assert time.perf_counter() - t0 <= 2.0 * 1.1 + SLACK
    cost = sum(r.metrics.cost for r in check_valid(prob, out.batchings))
    assert out.report.bound <= cost
    assert any("the time limit cut the exact-histogram bound short: the bound is the own-box floor" in n
               for n in out.report.notes), out.report.notes


def test_a_slow_greedy_warm_start_is_cut_at_its_share(monkeypatch):
    def endless(problem, deadline):
        while True:
            time.sleep(0.02)
            deadline.tick("greedy warm start")

    monkeypatch.setattr(stages, "greedy_pack", endless)
    t0 = time.perf_counter()
    out = plan_mip(two_buckets(), time_limit=2.0)
    assert time.perf_counter() - t0 <= 2.0 * 1.1 + SLACK
    assert out.batchings is not None


def test_a_slow_strict_shape_relaxation_falls_back_to_one_shape(monkeypatch):
    from model.planning import shapes

    real = shapes.floor_table

    def slow(bm, all_shapes, deadline):
        while True:
            time.sleep(0.02)
            deadline.tick("shape relaxation")
        return real(bm, all_shapes, deadline)

    monkeypatch.setattr(shapes, "floor_table", slow)
    prob = Problem(synthetic(100, 4), (Limits(), Limits()), 8, StrictCost())
    t0 = time.perf_counter()
    out = plan_mip(prob, time_limit=1.5)
    assert time.perf_counter() - t0 <= 1.5 * 1.1 + SLACK
    assert any("cut the shape relaxation short" in n for n in out.report.notes), out.report.notes
    check_valid(prob, out.batchings)


# ---------------------------------------------------------------- no plan: proven or not


def failing_mip(monkeypatch, status: Status, native: str = ""):
    """HiGHS's MIPs end with ``status`` and no solution (its LPs still run), and no packer finds anything."""
    real = highs.BACKEND.solve

    def solve_(model, options: SolveOptions) -> BackendResult:
        if options.relax:
            return real(model, options)
        return BackendResult(status, None, None, None, None, 0.0, "highs", "test", native)

    monkeypatch.setattr(highs.BACKEND, "solve", solve_)
    monkeypatch.setattr(mip, "greedy_plan", lambda *a, **k: None)
    monkeypatch.setattr(mip, "LAST_RESORT", ())  # nor do the packers tried as a last resort


@pytest.mark.parametrize("status, said", [
    (Status.TIME_LIMIT_NO_SOLUTION, "no plan found within the time limit (highs: time limit, no solution)"),
    (Status.ERROR, "no plan found (highs: solver error: boom)"),
    (Status.INFEASIBLE, "the MIP over the boxes the search kept is infeasible (highs)"),
])
def test_no_plan_without_a_proof_is_not_infeasible(monkeypatch, status, said):
    failing_mip(monkeypatch, status, "boom")
    with pytest.raises(NoPlanFound) as stop:
        plan_mip(two_buckets(150), time_limit=5)
    assert said in str(stop.value) and str(stop.value).endswith("not proven infeasible")


def test_no_plan_exits_4_and_writes_nothing(monkeypatch, tmp_path, capsys):
    failing_mip(monkeypatch, Status.TIME_LIMIT_NO_SOLUTION)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "plan_chat.jsonl").write_bytes(OLD_PLAN)
    monkeypatch.chdir(tmp_path)
    from test_solve_cli import write_scenario

    scenario = write_scenario(tmp_path / "s", synthetic(60, 3), (Limits(), Limits()))
    with pytest.raises(SystemExit) as stop:
        run_main(lambda: solve.main(["--scenario", str(scenario), "--out", "out", "--quiet", "--time-limit", "5"]))
    err = capsys.readouterr().err
    assert stop.value.code == 4, err
    assert err.strip().splitlines()[-1] == ("no plan found within the time limit (highs: time limit, no solution); "
                                            "not proven infeasible")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["plan_chat.jsonl"]
    assert (tmp_path / "out" / "plan_chat.jsonl").read_bytes() == OLD_PLAN


def test_a_whole_exact_model_proven_infeasible_is_exit_3():
    """Six requests whose cost limit is one below the brute-force optimum (no single limit explains it): the
    whole model is small and exact, so HiGHS's infeasible is a proof."""
    from helpers import problem
    from test_mip_known import SIX

    prob = problem(SIX, k=2, limits=Limits(max_cost=124_940_157.0))
    with pytest.raises(InfeasibleError, match=r"cost <= 1.2494e\+08 cannot be met, even alone \(highs proved the "
                       r"whole exact model infeasible\)"):
        plan_mip(prob, time_limit=10)


def test_when_the_search_finds_nothing_the_simple_packers_are_tried_before_giving_up(monkeypatch):
    """The MIP ends without a solution and greedy finds nothing: every request alone (solo, the first packer
    tried as a last resort) meets a sequential limit set at its own sequential time, so that plan is returned."""
    failing_mip(monkeypatch, Status.TIME_LIMIT_NO_SOLUTION)
    monkeypatch.setattr(mip, "LAST_RESORT", ("solo", "cells"))
    free = Problem(synthetic(40, 3), (Limits(), Limits()), 8)
    solo = evaluated(free, pipeline.plan(free, "solo"))
    prob = Problem(free.buckets, tuple(Limits(max_sequential_ms=r.metrics.sequential_ms) for r in solo), 8)
    out = plan_mip(prob, time_limit=5)
    assert not broken_limits(check_valid(prob, out.batchings))
    assert any("the solo plan is returned" in n or "the cells plan is returned" in n for n in out.report.notes)


def test_an_interrupted_backend_interrupts_the_planner(monkeypatch):
    real = highs.BACKEND.solve

    def solve_(model, options):
        if options.relax:
            return real(model, options)
        request_interrupt(signal.SIGTERM)
        return BackendResult(Status.INTERRUPTED, None, None, None, None, 0.0, "highs", "test", "interrupted")

    monkeypatch.setattr(highs.BACKEND, "solve", solve_)
    with pytest.raises(Interrupted) as stop:
        plan_mip(two_buckets(60), time_limit=5)
    assert stop.value.signum == signal.SIGTERM


# ---------------------------------------------------------------- exit statuses


@pytest.mark.parametrize("raised, code", [
    (NoPlanFound("no plan found; not proven infeasible"), 4),
    (InfeasibleError("the limits cannot all be met"), 3),
    (Interrupted(signal.SIGINT), 130),
    (Interrupted(signal.SIGTERM), 143),
    (KeyboardInterrupt(), 130),
])
def test_run_main_exit_statuses(raised, code, capsys):
    def main():
        raise raised

    with pytest.raises(SystemExit) as stop:
        run_main(main)
    assert stop.value.code == code
    assert capsys.readouterr().err.strip()


def test_run_main_restores_the_signal_handlers():
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit):
        run_main(lambda: 0)
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "-0.5"])
@pytest.mark.parametrize("entry", [solve.main, sweep.main], ids=["solve", "sweep"])
def test_time_limit_must_be_a_positive_number(entry, value, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stop:
        run_main(lambda: entry(["--time-limit", value, "--quiet"]))
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "--time-limit" in err and "positive" in err, err
    assert not list(tmp_path.iterdir())


def test_the_floor_bound_needs_no_pricing(monkeypatch):
    """The own-box floor is the bucket constants: computed without a pricing pass (minutes on big grids)."""
    from model.planning import colgen

    def no(*a, **k):
        raise AssertionError("priced")

    prob = two_buckets(50)
    fine = [build_histogram(b) for b in prob.buckets]
    bms = stages.bucket_models(prob, fine)
    space = stages.Space(prob, bms, [stages.candidate_grid(bm, None) for bm in bms], None, [1, 1])
    expected = pricing.lagrangian_bound(space.bms, space.grids,
                                        [colgen.own_box_duals(bm, g) for bm, g in zip(bms, space.grids, strict=True)],
                                        None)
    monkeypatch.setattr(pricing, "price_boxes", no)
    monkeypatch.setattr(colgen, "lagrangian_bound", no)
    floor = colgen.floor_bound(space)
    assert floor.total == pytest.approx(expected.total, rel=1e-12)
    assert np.allclose(floor.per_bucket, expected.per_bucket, rtol=1e-12)


def test_a_cut_device_shape_relaxation_gives_no_bound_and_the_top_shape():
    """Device mode's shape relaxation under a deadline already passed: no bound, and the one shape covering
    every prompt as the start (the run goes on instead of spending seconds past its limit)."""
    from model.planning.device_search import all_shapes, shape_relaxation

    prob = two_buckets(60)
    fine = [build_histogram(b) for b in prob.buckets]
    cut = shape_relaxation(prob, fine, Deadline(0.0))
    assert cut.bound == -np.inf and cut.shapes == (int(all_shapes(prob, fine)[-1]),)
    whole = shape_relaxation(prob, fine)
    assert np.isfinite(whole.bound)


def test_a_grid_pass_is_not_started_with_less_time_than_a_pricing_took(monkeypatch):
    """Reduced-cost fixing and the exact-histogram bound each make one indivisible pass over the box grid (1 s
    on 10^5 long-context requests, which overran a 3 s limit): with less time left than column generation's
    pricing took, neither starts, and the bound is the floor on the exact histogram (still valid).  Shown here
    for the bound; reduced-cost fixing follows the same rule."""
    from dataclasses import replace

    from model.planning import colgen
    from model.planning.options import PlannerOptions

    real, real_bound = stages.generate, colgen.lagrangian_bound
    armed, called = [], []

    def generate(*a, **k):
        out = replace(real(*a, **k), pricing_s=1e9)
        armed.append(True)  # column generation's own pricing is done: any later one is a grid pass
        return out

    monkeypatch.setattr(stages, "generate", generate)
    monkeypatch.setattr(colgen, "lagrangian_bound",
                        lambda *a, **k: (called.append(1) if armed else None) or real_bound(*a, **k))
    prob = Problem(synthetic(300, 4), (Limits(), Limits()), 4)
    out = plan_mip(prob, time_limit=10, options=PlannerOptions(max_gen_values=48, pricing_budget=1.0))
    notes = " ".join(out.report.notes)
    assert "cut the exact-histogram bound short" in notes, notes
    assert not called  # no Lagrangian over the exact grid was started
    assert out.report.bound <= out.report.objective * (1 + 1e-9)
    check_valid(prob, out.batchings)


def test_a_time_limit_too_short_for_the_mip_returns_the_packer_plan_with_a_time_limit_status(monkeypatch):
    """At 10^7 requests greedy is skipped and a 10 s limit left the MIP no time: plan_mip raised NoPlanFound
    although dpfill's plan was seconds away.  Here greedy is skipped the same way and the clock passes the
    deadline while the MIP searches (a fake clock jumps: no seconds are measured); the plan must be a packer's,
    valid, with the status time_limit and a note saying where it came from."""
    from dataclasses import replace

    from helpers import FakeClock

    from model.planning.options import PlannerOptions

    clock = FakeClock(monkeypatch)
    real = mip.search

    def all_the_time(*args, **kw):
        outcome = real(*args, **kw)  # its bound stays: only the plan is lost
        clock.jump(1e6)  # the search used the whole limit, and found nothing
        return replace(outcome, batchings=None, objective=None, status=Status.TIME_LIMIT_NO_SOLUTION)

    monkeypatch.setattr(mip, "search", all_the_time)
    prob = Problem(synthetic(300, 4), (Limits(max_pad_ratio=5.0), Limits(max_pad_ratio=5.0)), 4, StrictCost())
    out = plan_mip(prob, time_limit=5.0, options=PlannerOptions(greedy_max_requests=0))
    assert not broken_limits(check_valid(prob, out.batchings))
    assert out.report.status is Status.TIME_LIMIT_FEASIBLE
    assert any("the time limit ran out before the MIP found a plan" in n and "packer's plan" in n
               for n in out.report.notes), out.report.notes


def test_a_first_lp_without_duals_still_leaves_the_floor_bound(monkeypatch):
    """On a loaded host the first LP relaxation of column generation ran out of its time: the run then reported
    no lower bound at all (``solve`` printed no gap).  The own-box floor needs no LP: it is the bound then."""
    real = highs.BACKEND.solve

    def no_lp(model, options: SolveOptions) -> BackendResult:
        if options.relax:
            return BackendResult(Status.TIME_LIMIT_NO_SOLUTION, None, None, None, None, 0.0, "highs", "test", "")
        return real(model, options)

    monkeypatch.setattr(highs.BACKEND, "solve", no_lp)
    prob = two_buckets(60)
    out = plan_mip(prob, time_limit=5)
    cost = sum(r.metrics.cost for r in check_valid(prob, out.batchings))
    assert out.report.bound is not None and np.isfinite(out.report.bound) and out.report.bound <= cost
    assert out.report.gap is not None
