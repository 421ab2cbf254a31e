"""Device mode end to end: the planner against brute-force optima, KV capacity everywhere, the start and the CLI.

The toy profile below makes every part of the batch time matter on a handful of
requests: a per-step cost that batching amortises (d0), members that cost per token
(p1, d1, d2), a decode_large regime from 3 members, and a compile time small enough
that a second shape can pay.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from helpers import REPO, brute_force, bucket, check_valid, cli, plan_mip, problem

from model import pipeline
from model.base.errors import InfeasibleError
from model.base.runtime import Deadline
from model.cost.device import DeviceProfile, batch_time
from model.cost.model import DeviceCost
from model.domain.schema import Limits, Problem
from model.histogram.cells import build_histogram
from model.packers import PACKERS
from model.planning.device_search import shape_relaxation
from model.planning.exact_runs import IntervalRuns, device_start, improve_shapes
from model.planning.run_cuts import optimal_runs
from model.planning.window_bound import whole_trace_bound

TOY = DeviceProfile(name="toy", prefill=(2.0, 0.01, 1e-5), decode=(5.0, 1e-4, 0.02),
                    decode_large=(3.0, 1e-4, 0.05), decode_large_from=3, compile_ms=40.0)
PROFILE = REPO / "data" / "profiles" / "opt13b-a100-tp1.toml"


def device(*buckets, k: int = 8, limits: Limits = Limits(), prof: DeviceProfile = TOY, **kw) -> Problem:
    return problem(*buckets, k=k, limits=limits, params=prof, mode="device", **kw)


SIX = bucket([60, 100, 130, 64, 250, 190], [10, 30, 20, 40, 10, 200])
FIVE = bucket([51, 100, 130, 700, 64], [19, 53, 20, 300, 16])


@pytest.mark.parametrize("prob", [
    device(SIX, k=1), device(SIX, k=2), device(SIX, k=3), device(FIVE, k=2), device(SIX, k=2, max_batch_size=2),
    # 750 ms: one batch meets it but its compile spike does not; two spike-safe batches do (a false
    # "infeasible" once); 700 ms: only the spike-safe split meets it
    device(SIX, k=2, limits=Limits(max_p95_latency_ms=750.0)),
    device(SIX, k=2, limits=Limits(max_p95_latency_ms=700.0)),
    device(FIVE, k=2, limits=Limits(max_pad_ratio=0.9)),
    device(SIX, k=2, limits=Limits(max_sequential_ms=800.0)),
    # graphs (compiled batch sizes): a run of n in its graph's T(B), a compile per graph, the graph cap
    device(FIVE, k=2, prof=replace(TOY, batch_buckets=(1, 4))),
    device(SIX, k=2, prof=replace(TOY, batch_buckets=(2, 4)), limits=Limits(max_p95_latency_ms=900.0)),
    device(SIX, k=3, prof=replace(TOY, batch_buckets=(1, 2, 3, 6)), max_graphs=2),
    device(FIVE, k=2, prof=replace(TOY, batch_buckets=(1, 2, 4)), limits=Limits(max_pad_ratio=1.5)),
], ids=["six K=1", "six K=2", "six K=3", "five K=2", "six K=2 B=2", "six P95 750", "six P95 700", "five pad",
        "six seq", "five graphs 1,4", "six graphs 2,4 P95", "six graphs cap 2", "five graphs pad"])
def test_plan_mip_hits_the_brute_force_optimum_and_bounds_it(prob):
    best = brute_force(prob)
    planned = plan_mip(prob, time_limit=20)
    results = check_valid(prob, planned.batchings)
    cost = sum(r.metrics.cost for r in results)
    assert all(r.ok for r in results)
    assert cost == pytest.approx(best.cost, rel=1e-9)
    assert planned.report.bound <= best.cost * (1 + 1e-9)


def test_p95_limit_no_plan_meets_is_not_reported_as_a_plan():
    prob = device(SIX, k=2, limits=Limits(max_p95_latency_ms=1.0))
    # a member's latency is its batch's time T, and every T includes the fixed prefill term p0 (2 ms) > 1 ms
    assert TOY.prefill[0] > 1.0 and float(batch_time(1, 64, 1, TOY)) > TOY.prefill[0]
    with pytest.raises(InfeasibleError):
        plan_mip(prob, time_limit=2)


def test_optimal_runs_is_the_exact_cut_and_matches_batch_time():
    rng = np.random.default_rng(3)
    gens = np.sort(rng.integers(1, 60, 9))
    cost, batch = optimal_runs(gens, 128, DeviceCost(TOY), None)
    sizes = np.bincount(batch)
    assert cost == pytest.approx(float(sum(batch_time(n, 128, gens[batch == k].max(), TOY)
                                           for k, n in enumerate(sizes))), rel=1e-12)
    # against every composition of the sorted list into consecutive runs
    best = np.inf
    for mask in range(1 << (len(gens) - 1)):
        cuts = [0] + [i + 1 for i in range(len(gens) - 1) if mask >> i & 1] + [len(gens)]
        total = sum(float(batch_time(b - a, 128, gens[b - 1], TOY)) for a, b in zip(cuts, cuts[1:], strict=False))
        best = min(best, total)
    assert cost == pytest.approx(best, rel=1e-12)


def test_interval_runs_cost_is_what_the_evaluator_charges_their_batching():
    """The start's cached costs, its local search and its final batching agree with the exact evaluator:
    two buckets, a P95 limit, and shape sets costed in any order (the cache must not mix intervals)."""
    rng = np.random.default_rng(5)
    a = bucket(rng.integers(20, 900, 120).tolist(), rng.integers(1, 300, 120).tolist(), name="a")
    b = bucket(rng.integers(20, 500, 80).tolist(), rng.integers(1, 300, 80).tolist(), name="b")
    prob = device(a, b, k=3, limits=Limits(max_p95_latency_ms=2500.0))
    runs = IntervalRuns(prob)
    for shapes in ([1024], [256, 1024], [128, 512, 1024], [256, 1024]):
        sh = np.asarray(shapes, dtype=np.int64)
        batchings = runs.batching(sh)
        results = check_valid(prob, batchings)
        assert all(set(np.unique(bt.shape_of)) <= set(shapes) for bt in batchings)
        assert runs.total(sh) == pytest.approx(sum(r.metrics.cost for r in results), rel=1e-12)
    cands = np.arange(64, 1025, 64)
    better = improve_shapes(runs, np.asarray([1024]), cands, deadline=float("inf"))
    assert better[-1] == 1024 and runs.total(better) <= runs.total(np.asarray([1024]))
    assert IntervalRuns(prob).total(np.asarray([512, 1024]), deadline=0.0) == np.inf


def test_device_start_past_its_deadline_costs_nothing_unless_a_start_is_required():
    """A start is costed past the deadline only when the caller has none (no greedy plan): a short time limit
    then keeps the greedy plan instead of spending seconds on exact batching."""
    rng = np.random.default_rng(6)
    prob = device(bucket(rng.integers(20, 900, 60).tolist(), rng.integers(1, 300, 60).tolist()), k=2)
    shapes = [np.asarray([1024])]
    cands = np.arange(64, 1025, 64)
    assert device_start(prob, shapes, cands, cands, deadline=0.0, required=False) is None
    start = device_start(prob, shapes, cands, cands, deadline=0.0, required=True)
    assert all(r.ok for r in check_valid(prob, start))


@pytest.mark.parametrize("levels", [4, 400], ids=["coarse levels", "exact levels"])
def test_a_start_s_flows_satisfy_every_conservation_row(levels):
    """The warm start's flows are built by paths, not by an LP: rebuild each bucket's conservation rows from
    the start vector and check the residual is zero, with the bounds held (coarse grids included)."""
    from model.formulation.device_flow import build_flow_model
    from model.planning.device_search import flow_levels, warm_vector
    from model.planning.options import PlannerOptions
    from model.planning.stages import bucket_models

    rng = np.random.default_rng(9)
    a = bucket(rng.integers(20, 900, 150).tolist(), rng.integers(1, 300, 150).tolist(), name="a")
    b = bucket(rng.integers(20, 400, 90).tolist(), rng.integers(1, 300, 90).tolist(), name="b")
    prob = device(a, b, k=3)
    start = PACKERS["dpfill"](prob)
    hists = [build_histogram(x) for x in prob.buckets]
    opts = PlannerOptions(flow_shape_levels=levels, flow_gen_levels=levels)
    lv = flow_levels(prob, hists, opts, "ceil", start)
    model, blocks = build_flow_model(bucket_models(prob, hists), lv, prob.max_shapes, prob.max_batch_size)
    x = warm_vector(prob, hists, bucket_models(prob, hists), lv, blocks, model.n_cols, start)
    assert x is not None
    assert (x >= model.lb - 1e-9).all() and (x <= model.ub + 1e-9).all()
    for bkt in range(2):
        rows = model.block("row", "flow", bkt)
        sel = (model.rows >= rows.start) & (model.rows < rows.stop)
        lhs = np.zeros(model.n_rows)
        np.add.at(lhs, model.rows[sel], model.vals[sel] * x[model.cols[sel]])
        assert np.abs(lhs[rows.slice()] - model.row_lo[rows.slice()]).max() < 1e-9
        assert x[blocks[bkt].w.slice()].sum() == len(prob.buckets[bkt])


def small_kv_problem(k: int = 3) -> Problem:
    rng = np.random.default_rng(11)
    b = bucket(rng.integers(20, 900, 300).tolist(), rng.integers(1, 400, 300).tolist())
    prof = DeviceProfile(name="kv", prefill=TOY.prefill, decode=TOY.decode, compile_ms=500.0, kv_capacity_tokens=4000)
    return device(b, k=k, prof=prof)


@pytest.mark.parametrize("name", list(PACKERS))
def test_every_packer_respects_kv_capacity(name):
    prob = small_kv_problem()
    results = check_valid(prob, PACKERS[name](prob))  # the evaluator's kv-capacity rule included
    assert all(not r.violations for r in results)


def test_the_mip_respects_kv_and_is_never_costlier_than_dpfill():
    prob = small_kv_problem()
    planned = plan_mip(prob, time_limit=1)  # dpfill's plan is a candidate whatever the MIP reaches in time
    mine = sum(r.metrics.cost for r in check_valid(prob, planned.batchings))
    theirs = sum(r.metrics.cost for r in check_valid(prob, PACKERS["dpfill"](prob)))
    assert mine <= theirs * (1 + 1e-12)
    assert planned.report.bound <= mine


def test_a_request_too_long_for_the_kv_cache_is_named():
    prof = DeviceProfile(name="tiny", prefill=TOY.prefill, decode=TOY.decode, compile_ms=1.0, kv_capacity_tokens=100)
    prob = device(bucket([60, 90], [10, 50]), prof=prof)
    with pytest.raises(InfeasibleError, match="does not fit"):
        PACKERS["dpfill"](prob)


@pytest.mark.parametrize("solver", ["mip", "dpfill"])
def test_every_planner_names_a_request_the_kv_cache_cannot_hold(solver):
    """The MIP raised ValueError from its exact-runs DP ("a request does not fit one batch at shape ..."): the
    capacity is checked once, before any planner runs, and the answer is a proof naming the request."""
    prof = DeviceProfile(name="tiny", prefill=TOY.prefill, decode=TOY.decode, compile_ms=1.0, kv_capacity_tokens=100)
    prob = device(bucket([60, 10], [10, 20]), prof=prof)  # the first: 64 + 10 fits; the second: 64 + 20 fits
    pipeline.plan(prob, solver, time_limit=5)
    tight = device(bucket([60, 90], [10, 50]), prof=prof)  # 128 + 50 > 100
    with pytest.raises(InfeasibleError, match=r"request 'b-r1' .* does not fit one batch at its smallest shape 128"):
        pipeline.plan(tight, solver, time_limit=5)


@pytest.mark.parametrize("extra", [[], ["--window", "1"]])
def test_cli_kv_capacity_below_a_request_exits_3_with_one_line(tmp_path: Path, extra):
    reqs = tmp_path / "r.jsonl"
    reqs.write_text('{"request_id": "a", "prompt_len": 900, "gen_len": 200, "arrival_s": 0}\n'
                    '{"request_id": "b", "prompt_len": 50, "gen_len": 20, "arrival_s": 0.5}\n')
    prof = tmp_path / "p.toml"
    prof.write_text(PROFILE.read_text().replace("kv_capacity_tokens = 66144", "kv_capacity_tokens = 1000"))
    assert "kv_capacity_tokens = 1000" in prof.read_text()
    for module in ("model.solve", "model.sweep"):
        argv = [str(reqs), "--device-profile", str(prof), "--time-limit", "5", *extra]
        if extra:
            argv += ["--time-column", "arrival_s"]
        argv += ["--out", str(tmp_path / ("o.csv" if module == "model.sweep" else "o")), "--quiet"]
        if module == "model.sweep":
            argv += ["--k", "1", "--solvers", "mip"]
        done = cli(module, *argv, cwd=tmp_path)
        assert "Traceback" not in done.stderr, done.stderr
        if module == "model.solve":
            assert done.returncode == 3 and "request 'a'" in done.stderr and "KV capacity 1000" in done.stderr
            assert len(done.stderr.strip().splitlines()) == 1 and not (tmp_path / "o").exists()



def test_cli_device_mode_solve_then_evaluate(tmp_path: Path):
    reqs = tmp_path / "r.jsonl"
    rng = np.random.default_rng(5)
    reqs.write_text("".join(f'{{"request_id": "q{i}", "prompt_len": {int(p)}, "gen_len": {int(g)}}}\n'
                            for i, (p, g) in enumerate(zip(rng.integers(10, 2000, 200), rng.integers(1, 300, 200),
                                                           strict=True))))
    out = tmp_path / "out"
    done = cli("model.solve", str(reqs), "--cost-model", "device", "--device-profile", str(PROFILE),
               "--time-limit", "2", "--out", str(out), "--quiet", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "device" in done.stdout
    judged = cli("model.evaluate", str(reqs), str(out / "plan_r.jsonl"), "--device-profile", str(PROFILE),
                 cwd=tmp_path)
    assert judged.returncode == 0, judged.stdout + judged.stderr


@pytest.mark.parametrize("argv, message", [
    (["--cost-model", "device"], "needs --device-profile"),
    (["--device-profile", "PROFILE", "--cost-model", "strict"], "device mode"),
    (["--device-profile", "missing.toml"], "missing.toml"),
])
def test_cli_device_flags_conflicts_exit_2(tmp_path: Path, argv, message):
    reqs = tmp_path / "r.jsonl"
    reqs.write_text('{"request_id": "a", "prompt_len": 10, "gen_len": 5}\n')
    argv = [str(PROFILE) if a == "PROFILE" else a for a in argv]
    done = cli("model.solve", str(reqs), *argv, "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert not (tmp_path / "out").exists()


def test_evaluate_rejects_a_batch_over_kv_capacity(tmp_path: Path):
    reqs = tmp_path / "r.jsonl"
    reqs.write_text('{"request_id": "a", "prompt_len": 700, "gen_len": 300}\n'
                    '{"request_id": "b", "prompt_len": 130, "gen_len": 20}\n')
    plan = tmp_path / "plan.jsonl"
    shape = '"shape": {"seq_align": 768, "heads_align": 32, "hidden_align": 4096}'
    plan.write_text(f'{{"request_id": "a", "batch_id": "b-3", {shape}}}\n{{"request_id": "b", "batch_id": "b-3", '
                    f'{shape}}}\n')
    prof = tmp_path / "p.toml"
    prof.write_text(PROFILE.read_text().replace("kv_capacity_tokens = 66144", "kv_capacity_tokens = 2000"))
    done = cli("model.evaluate", str(reqs), str(plan), "--device-profile", str(prof), cwd=tmp_path)
    assert done.returncode == 1
    assert "kv-capacity" in done.stdout and "'b-3' holds 2136 KV tokens" in done.stdout


def test_scenario_device_profile_by_path_or_inline_table(tmp_path: Path):
    (tmp_path / "r.jsonl").write_text('{"request_id": "a", "prompt_len": 10, "gen_len": 5}\n')
    (tmp_path / "dev.toml").write_text(PROFILE.read_text())
    by_path = tmp_path / "s1.toml"
    by_path.write_text('max_shapes = 2\nmode = "device"\ndevice = "dev.toml"\n\n[[bucket]]\nname = "r"\n'
                       'requests = "r.jsonl"\n')
    inline = tmp_path / "s2.toml"
    inline.write_text('max_shapes = 2\n\n[[bucket]]\nname = "r"\nrequests = "r.jsonl"\n\n'
                      + PROFILE.read_text().split("[device]", 1)[0].replace("#", "# ") + "[device]"
                      + PROFILE.read_text().split("[device]", 1)[1])
    for scenario in (by_path, inline):
        prob, _ = pipeline.load_problem(pipeline.InputSpec(scenario=scenario))
        assert prob.cost.name == "device" and prob.cost.params.compile_ms == 20000.0
    bad = tmp_path / "s3.toml"
    bad.write_text('max_shapes = 2\nmode = "strict"\ndevice = "dev.toml"\n\n[[bucket]]\nname = "r"\n'
                   'requests = "r.jsonl"\n')
    done = cli("model.solve", "--scenario", str(bad), "--out", str(tmp_path / "o"), cwd=tmp_path)
    assert done.returncode == 2 and "s3.toml:3" in done.stderr, done.stderr


TWO = (bucket([64, 128, 128], [1, 2, 1], name="a"), bucket([64, 128, 200], [300, 300, 40], name="c"))


@pytest.mark.parametrize("prob", [device(SIX, k=1), device(SIX, k=2), device(FIVE, k=2),
                                  device(SIX, k=2, max_batch_size=2), device(*TWO, k=2), device(*TWO, k=3)],
                         ids=["six K=1", "six K=2", "five K=2", "B=2", "two buckets K=2", "two buckets K=3"])
def test_the_lp_price_bound_is_below_the_brute_force_optimum(prob):
    best = brute_force(prob).cost * (1 + 1e-12)
    full = whole_trace_bound(prob, Deadline.after(30))
    cut = whole_trace_bound(prob, Deadline(0.0))  # every shape priced by per-request floors
    assert cut <= full <= best


@pytest.mark.slow  # the main job's test covers the default scenario in device mode by default
def test_the_lp_price_bound_tightens_the_default_scenario_and_plan_mip_reports_it():
    """On the embedded default (P95-limited, small batches) it is above the shape relaxation, so it is used."""
    prob, _ = pipeline.load_problem(pipeline.InputSpec(scenario=pipeline.DEFAULT_SCENARIO, max_shapes=8))
    lp = whole_trace_bound(prob, Deadline.after(30))
    assert lp > 1.2 * shape_relaxation(prob, [build_histogram(b) for b in prob.buckets]).bound
    assert plan_mip(prob, time_limit=2).report.bound >= lp * (1 - 1e-12)


def test_a_flow_model_is_not_built_once_its_deadline_has_passed(monkeypatch):
    """Building the flow model takes half a second at 4 x 10^5 columns: with the deadline already past nothing
    is built and no solver runs, and the search reports the time limit without a solution."""
    import model.planning.device_search as ds
    from model.planning.options import PlannerOptions
    from solvers.backends import get_backend
    from solvers.backends.result import Status

    def never(*args, **kwargs):
        raise AssertionError("the flow model was built")

    monkeypatch.setattr(ds, "build_flow_model", never)
    rng = np.random.default_rng(3)
    prob = problem(bucket(rng.integers(1, 300, 6).tolist(), rng.integers(1, 200, 6).tolist()), k=2,
                   params=TOY, mode="device")
    hists = [build_histogram(b) for b in prob.buckets]
    options = PlannerOptions()
    levels = ds.flow_levels(prob, hists, options, "ceil")
    model, blocks, result = ds.solve_levels(prob, hists, ds.bucket_models(prob, hists), levels,
                                            get_backend("highs"), Deadline.after(-1.0), None, True, options)
    assert model is None and blocks is None and result.status is Status.TIME_LIMIT_NO_SOLUTION
