"""Plans by cells: coarsening from counts, runs from a solution, runs judged exactly, and the planner on
histograms alone -- each checked against the request-level path it must agree with."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import plan_cells, plan_mip

from model.cost.device import DeviceProfile
from model.cost.model import DeviceCost, StrictCost
from model.domain.schema import Batching, Bucket, CellRuns, Limits
from model.evaluation.cell_judge import evaluate_runs, run_metrics
from model.evaluation.validate import evaluate_plans
from model.expand.assemble import assemble_all
from model.histogram.cells import Histogram, build_histogram, coarsen, from_counts
from model.planning.cell_runs import batching_of_runs, box_runs, deal
from tests.helpers import bucket, mode_cost, problem

DEVICE = DeviceProfile(name="t", prefill=(2.0, 0.01, 1e-5), decode=(5.0, 1e-4, 0.02), decode_large=(4.0, 2e-4, 0.01),
                       decode_large_from=4, batch_overhead_ms=3.0, compile_ms=900.0, kv_capacity_tokens=400_000)


def random_bucket(rng: np.random.Generator, n: int, name: str = "b") -> Bucket:
    return bucket(rng.integers(1, 700, n).tolist(), rng.integers(1, 60, n).tolist(), name)


def runs_of_batching(hist: Histogram, bt: Batching) -> CellRuns:
    """A request-level batching as runs (what the batching is by cells)."""
    key = hist.cell_of * len(bt.shape_of) + bt.batch_of
    uniq, count = np.unique(key, return_counts=True)
    return CellRuns(uniq // len(bt.shape_of), uniq % len(bt.shape_of), count, np.asarray(bt.shape_of))


def fields(m) -> dict:
    return {k: getattr(m, k) for k in ("cost", "prefill_cost", "decode_cost", "overhead_cost", "compile_cost",
                                       "pad_tokens", "real_tokens", "p95_latency_ms", "sequential_ms",
                                       "n_requests", "n_batches", "shapes")}


def same(got, want) -> None:
    """Equal metrics: integers and shapes exactly, floats to rounding (sums taken in another order)."""
    g, w = fields(got), fields(want)
    for k in g:
        if isinstance(w[k], float):
            assert g[k] == pytest.approx(w[k], rel=1e-12, abs=1e-9), k
        else:
            assert g[k] == w[k], k


def test_coarsen_from_counts_matches_coarsening_requests():
    rng = np.random.default_rng(3)
    b = random_bucket(rng, 400)
    fine = build_histogram(b)
    for k in (3, 7, 20):
        direct, via = build_histogram(b, k), coarsen(fine, k)
        for f in ("S", "G", "count", "prompt_sum", "gen_sum", "cell_of", "gen_min"):
            assert np.array_equal(getattr(direct, f), getattr(via, f)), f
        assert np.array_equal(via.of_fine[fine.cell_of], via.cell_of)
    counted = from_counts("b", fine.S[::-1], fine.G[::-1], fine.count[::-1], fine.prompt_sum[::-1])
    for f in ("S", "G", "count", "prompt_sum", "gen_sum", "gen_min"):
        assert np.array_equal(getattr(counted, f), getattr(fine, f)), f
    assert counted.cell_of is None
    with pytest.raises(ValueError, match="repeat"):
        from_counts("b", [64, 64], [5, 5], [1, 2], [10, 20])


def test_deal_sends_short_gens_to_small_boxes_and_checks_totals():
    fine = from_counts("b", [64, 64, 64, 64], [3, 5, 6, 9], [2, 3, 1, 1], [100, 150, 50, 60])
    coarse = coarsen(fine, 2)  # edges 3 and 9: cells (64, 3) and (64, 9) <- gens 5, 6, 9
    assert coarse.G.tolist() == [3, 9] and coarse.of_fine.tolist() == [0, 1, 1, 1]
    cell, box, count = deal(fine, coarse, np.array([1, 1, 0]), np.array([7, 2, 2]), np.array([2, 3, 2]))
    # coarse cell 1 (gens 5, 5, 5, 6, 9): box 2 takes the first 3, box 7 the rest
    assert list(zip(cell.tolist(), box.tolist(), count.tolist(), strict=True)) == [(0, 2, 2), (1, 2, 3), (2, 7, 1), (3, 7, 1)]
    with pytest.raises(RuntimeError, match="exactly once"):
        deal(fine, coarse, np.array([0, 1]), np.array([7, 7]), np.array([2, 4]))


def test_box_runs_cut_by_cap_and_by_batches():
    fine = from_counts("b", [64, 128, 128], [4, 4, 8], [3, 2, 2], [150, 200, 220])
    cell, box, count = np.array([0, 1, 2]), np.array([0, 0, 0]), np.array([3, 2, 2])
    capped = box_runs(fine, cell, box, count, np.full(3, 128), StrictCost(), 3)
    assert capped.shape_of.tolist() == [128, 128, 128]
    assert np.bincount(capped.batch, weights=capped.count).tolist() == [3, 3, 1]
    dev = box_runs(fine, cell, box, count, np.full(3, 128), DeviceCost(DEVICE), None, np.full(3, 2))
    assert np.bincount(dev.batch, weights=dev.count).tolist() == [4, 3]  # gens ascending: 4,4,4,4,4 | 8,8
    with pytest.raises(ValueError, match="does not cover"):
        box_runs(fine, cell, box, count, np.full(3, 64), StrictCost(), None)


@pytest.mark.parametrize("mode", ["reference", "strict", "device"])
@pytest.mark.parametrize("seed", range(6))
def test_run_metrics_equal_the_expanded_plan(mode, seed):
    """Metrics of runs = metrics of the plan expanded request by request (spikes placed by the same rule)."""
    rng = np.random.default_rng(seed)
    b = random_bucket(rng, int(rng.integers(5, 120)))
    hist = build_histogram(b)
    nb = int(rng.integers(1, 9))
    batch_of = rng.integers(0, nb, len(b))
    batch_of = np.unique(batch_of, return_inverse=True)[1]
    nb = int(batch_of.max()) + 1
    need = np.zeros(nb, np.int64)
    np.maximum.at(need, batch_of, hist.S[hist.cell_of])
    cost = mode_cost(mode, DEVICE)
    shape_of = need + 64 * rng.integers(0, 2, nb) if cost.pads_to_shape else np.full(nb, need.max())
    lat = float(rng.choice([1e3, 3e3, 1e5]))
    limits = Limits(max_p95_latency_ms=lat, max_sequential_ms=float(rng.choice([1e4, 1e7])))
    prob = problem(b, k=8, limits=limits, cost=cost)
    runs = runs_of_batching(hist, Batching(batch_of, shape_of))
    metrics, _, takes = run_metrics(hist, runs, cost, limits)
    assert takes.sum() == len(np.unique(shape_of))
    plans = assemble_all(prob, (batching_of_runs(hist.cell_of, runs),))
    want = evaluate_plans(prob, plans)[0][0].metrics
    same(metrics, want)


def two_buckets(n_a: int, n_c: int) -> tuple[Bucket, Bucket]:
    rng = np.random.default_rng(11)
    return random_bucket(rng, n_a, "a"), random_bucket(rng, n_c, "c")


def counted_hists(buckets) -> tuple[list[Histogram], list[Histogram]]:
    """Each bucket's exact histogram, and the same cells as counts alone (what a group-by gives)."""
    fine = [build_histogram(b) for b in buckets]
    return fine, [from_counts(h.name, h.S, h.G, h.count, h.prompt_sum) for h in fine]


def test_planning_from_histograms_evaluates_as_its_requests():
    """Runs planned from counts alone, dealt to the requests, evaluate to exactly what the cell judge said."""
    buckets = two_buckets(600, 400)
    prob = problem(*buckets, k=4, limits=Limits(max_pad_ratio=0.5, max_p95_latency_ms=1e6))
    fine, counted = counted_hists(buckets)
    cells = plan_cells(prob, counted, time_limit=3)
    assert cells.evaluation.ok and cells.report.bound <= cells.report.objective * (1 + 1e-9)
    batchings = tuple(batching_of_runs(h.cell_of, r) for h, r in zip(fine, cells.runs, strict=True))
    results, global_problems = evaluate_plans(prob, assemble_all(prob, batchings))
    assert not global_problems and all(r.ok for r in results)
    for got, want in zip(cells.evaluation.results, results, strict=True):
        same(got.metrics, want.metrics)
    again, _ = evaluate_runs(prob, counted, list(cells.runs))
    assert again.total_cost == cells.evaluation.total_cost


@pytest.mark.slow
@pytest.mark.parametrize(("mode", "limits"), [("reference", Limits(max_pad_ratio=0.085)),
                                             ("strict", Limits(max_pad_ratio=0.3))])
def test_planning_from_histograms_is_as_good_as_the_request_planner(mode, limits):
    """Within 0.5 % of the request-level planner's cost on the same problem."""
    buckets = two_buckets(1200, 800)
    prob = problem(*buckets, k=4, limits=limits, mode=mode)
    _, counted = counted_hists(buckets)
    cells = plan_cells(prob, counted, time_limit=4)
    ref = plan_mip(prob, time_limit=4)
    assert cells.evaluation.ok
    assert cells.report.objective <= 1.005 * ref.report.objective


def test_planning_from_histograms_refuses_device_mode():
    b = bucket([100, 200], [5, 6])
    prob = problem(b, params=DEVICE, mode="device")
    h = build_histogram(b)
    with pytest.raises(Exception, match="device mode"):
        plan_cells(prob, [from_counts("b", h.S, h.G, h.count, h.prompt_sum)], time_limit=5)
