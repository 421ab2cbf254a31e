"""Under a KV capacity a short prompt with a long gen may fit its own shape only: no planner may assume a request
runs at every larger shape.  The fewest shapes any plan needs (``shapeset.shapes_needed``) against a brute force
over shape sets, the proof when K is below it (library and CLI), and the planner and the bounds on an instance
where a request cannot ride up (the review's case: the fixed-set bound crashed there, the exact-runs start
raised)."""

from __future__ import annotations

import itertools
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from helpers import REPO, brute_force, bucket, cli, plan_mip, problem
from test_shape_lp import TOY, best_on_shapes

from model import pipeline
from model.base.errors import InfeasibleError, NoPlanFound
from model.cost.common import align
from model.cost.model import cost_model
from model.domain.shapeset import shapes_needed
from model.planning.fixed_set import fixed_set_bound
from model.planning.rider_chain import chain_bound

KV600 = replace(TOY, kv_capacity_tokens=600)
PROMPTS, GENS = [128, 512], [450, 50]  # 128 + 450 fits 600, 256 + 450 does not: the first stays at 128
OPTIMUM = 2621.73028  # brute force, K >= 2 (checked below)


def fewest_by_brute_force(prob) -> int:
    """The smallest set of grid shapes at which every request fits one batch alone at some shape >= its own."""
    P = np.concatenate([align(b.prompt_len) for b in prob.buckets])
    G = np.concatenate([b.gen_len for b in prob.buckets])
    allowed = prob.allowed_shapes
    grid = list(allowed) if allowed is not None else list(range(64, int(P.max()) + 1, 64))
    for k in range(1, len(grid) + 1):
        for set_ in itertools.combinations(grid, k):
            if all(any(s >= p and prob.cost.batch_fits(1, s, int(g)) for s in set_) for p, g in zip(P, G, strict=True)):
                return k
    return 10**9


@pytest.mark.parametrize("seed", range(25))
def test_the_fewest_shapes_match_a_brute_force_over_shape_sets(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 8))
    prompts, kv = rng.integers(1, 640, n), int(rng.integers(700, 1400))
    allowed = None if seed % 2 else tuple(sorted({64 * int(v) for v in rng.integers(1, 11, 4)} | {640}))
    start = align(prompts) if allowed is None else np.asarray(allowed)[np.searchsorted(allowed, align(prompts))]
    gens = rng.integers(1, kv - start + 1)  # each fits its own smallest shape (else check_kv_fits' case)
    prob = problem(bucket(prompts.tolist(), gens.tolist()), params=replace(TOY, kv_capacity_tokens=kv),
                   mode="device", allowed_shapes=allowed)
    cover = shapes_needed(prob)
    assert cover.count == fewest_by_brute_force(prob) == len(cover.requests) == len(cover.ranges)
    grid = np.arange(64, align(prompts).max() + 1, 64) if allowed is None else np.asarray(allowed)
    for k, (lo, hi) in zip(cover.requests, cover.ranges, strict=True):  # its own range up to the longest prompt
        fits = [int(s) for s in grid if s >= align(prompts[k]) and prob.cost.batch_fits(1, int(s), int(gens[k]))]
        assert (lo, hi) == (min(fits), max(fits))
    for (_, hi), (lo, _) in itertools.pairwise(cover.ranges):  # the certificate: pairwise disjoint ranges
        assert hi < lo


def test_no_kv_capacity_needs_one_shape():
    assert shapes_needed(problem(bucket([64, 5000], [10, 10]), mode="device", params=TOY)).count == 1
    pipeline.plan(problem(bucket([64, 5000], [10, 10]), k=1, mode="device", params=TOY), "dpfill")  # no proof


def test_below_the_fewest_shapes_every_planner_is_told_it_is_a_proof():
    prob = problem(bucket(PROMPTS, GENS), k=1, params=KV600, mode="device")
    assert brute_force(prob).cost == np.inf
    with pytest.raises(InfeasibleError, match=r"at least 2 shapes, more than the cap K = 1: no shape serves two of "
                                              r"the requests 'b-r0' \(<b>:1, prompt 128, gen 450: shapes 128..128\), "
                                              r"'b-r1' \(<b>:2, prompt 512, gen 50: shapes 512..512\)"):
        pipeline.plan(prob, "dpfill")


def test_the_graph_cap_counts_too_each_shape_runs_a_graph():
    prob = problem(bucket(PROMPTS, GENS), k=2, params=KV600, mode="device", max_graphs=1)
    assert brute_force(prob).cost == np.inf
    with pytest.raises(InfeasibleError, match="at least 2 shapes, more than the graph cap 1"):
        pipeline.plan(prob, "mip", time_limit=5)


@pytest.mark.parametrize("allowed", [None, (128, 256, 512)])
def test_the_planner_and_its_bounds_where_a_request_cannot_ride_up(allowed):
    prob = problem(bucket(PROMPTS, GENS), k=2, params=KV600, mode="device", allowed_shapes=allowed)
    assert brute_force(prob).cost == pytest.approx(OPTIMUM, rel=1e-8)
    rep = plan_mip(prob, time_limit=10).report
    assert rep.objective == pytest.approx(OPTIMUM, rel=1e-8)
    assert rep.bound <= OPTIMUM * (1 + 1e-9)
    if allowed is not None:
        assert fixed_set_bound(prob) <= OPTIMUM * (1 + 1e-9)


def test_the_chain_prices_an_interval_where_no_batch_fits():
    """At (256, 512) the 128-prompt request fits nowhere: the chain still returns (no plan exists, any bound is
    valid); at (128, 256, 512) it stays below the best plan on those shapes."""
    cost = cost_model("device", KV600)
    S, G = np.array(PROMPTS), np.array(GENS)
    assert best_on_shapes(cost, S, G, [256, 512], None, None) == np.inf
    assert np.isfinite(chain_bound(cost, S, G, [256, 512]).bound)
    best = best_on_shapes(cost, S, G, [128, 256, 512], None, None)
    assert chain_bound(cost, S, G, [128, 256, 512]).bound <= best * (1 + 1e-9)


def test_a_packer_whose_rule_cannot_hold_a_request_claims_no_proof():
    """pow2 puts the 128-prompt request at 128 and the 520-prompt one at 1024, but a third request (prompt 600,
    gen 500) fits 640 and not 1024: pow2 has no plan, the MIP has one, so pow2's failure is no plan found."""
    prob = problem(bucket([128, 520, 600], [450, 50, 500]), k=3, params=replace(TOY, kv_capacity_tokens=1150),
                   mode="device")
    assert np.isfinite(brute_force(prob).cost)
    with pytest.raises(NoPlanFound, match="not proven infeasible"):
        pipeline.plan(prob, "pow2")


def test_the_cli_names_the_requests_and_exits_3(tmp_path: Path):
    reqs = tmp_path / "reqs.jsonl"
    reqs.write_text('{"request_id": "long", "prompt_len": 60, "gen_len": 66000}\n'
                    '{"request_id": "wide", "prompt_len": 1000, "gen_len": 10}\n')
    done = cli("model.solve", str(reqs), "--device-profile", str(REPO / "data" / "profiles" / "opt13b-a100-tp1.toml"),
               "--limit-shapes", "1", "--quiet", "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert done.returncode == 3, done.stderr
    assert "at least 2 shapes" in done.stderr and "'long'" in done.stderr and "reqs.jsonl:1" in done.stderr
    assert not (tmp_path / "out").exists()


def long_gen_rows(path: Path, windows: bool) -> Path:
    """Requests of 130 tokens with a 65,900-token gen (they fit shape 192, not pow2's 256, under the profile's
    66,144-token capacity) beside short-gen long prompts; with arrival times for windows of 60 s."""
    rows = []
    for i in range(8):
        rows += [(f"l{i}", 130, 65900, 10 * i), (f"w{i}", 1000, 10, 10 * i + 5)]
    path.write_text("".join(f'{{"request_id": "{r}", "prompt_len": {p}, "gen_len": {g}'
                            + (f', "arrival_s": {t}' if windows else "") + "}\n" for r, p, g, t in rows))
    return path


@pytest.mark.parametrize("flags", [["--holdout", "0.5"], ["--window", "60", "--time-column", "arrival_s"]])
def test_a_pow2_rule_with_no_plan_is_said_and_the_run_goes_on(tmp_path: Path, flags):
    """The hold-out check and the windowed devices table compare against pow2, which cannot plan these: the run
    still ends with exit 0 and says why pow2 is missing (it aborted with exit 4 once pow2 said no plan)."""
    reqs = long_gen_rows(tmp_path / "reqs.jsonl", "--window" in flags)
    done = cli("model.solve", str(reqs), "--device-profile", str(REPO / "data" / "profiles" / "opt13b-a100-tp1.toml"),
               "--limit-shapes", "2", "--time-limit", "10", "--out", str(tmp_path / "out"), *flags, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "does not fit one batch at shape 256" in done.stdout + done.stderr
