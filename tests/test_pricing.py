"""The pricing sweep against the dense pass it replaces: every box's value and every arc, on random buckets.

The sweep (``model.formulation.pricing._sweep``) sums each cell over the boxes it reaches with
difference rows; the dense pass builds the (boxes x cells) matrix.  Both price the same Lagrangian,
so they must agree to rounding -- and the sweep may only ever be LOWER (its rounding allowance), so a
bound computed from it stays a bound.
"""

from __future__ import annotations

import numpy as np
import pytest

from model.cost.model import cost_model
from model.domain.schema import Bucket, Limits
from model.formulation import pricing
from model.formulation.boxes import box_unit_cost, bucket_model, candidate_grid
from model.histogram.cells import build_histogram


def arcs(found) -> set[tuple[int, int]]:
    """(cell, box position) pairs of an arc list."""
    cells, pos = found
    return set(zip(cells.tolist(), pos.tolist(), strict=True))


def random_case(seed: int):
    """A random bucket model, grid and multipliers (every multiplier sometimes zero)."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 60))
    p, g = rng.integers(1, 700, n), rng.integers(1, 60, n)
    b = Bucket("b", "b", np.arange(n).astype(str).astype(object), p, g, np.arange(1, n + 1))
    mode = ("reference", "strict")[seed % 2]
    lim = Limits(max_p95_latency_ms=float(rng.uniform(500, 5000)) if rng.random() < 0.5 else None,
                 max_pad_ratio=0.2 if rng.random() < 0.5 else None)
    max_batch = int(rng.integers(1, 5)) if rng.random() < 0.4 else None
    h = build_histogram(b, int(rng.integers(3, 20)) if rng.random() < 0.3 else None)
    bm = bucket_model(h, h.gen_min, lim, cost_model(mode), 0, max_batch)
    shapes = np.unique(np.r_[h.S, rng.integers(1, 12, 3) * 64]) if bm.cost.pads_to_shape else None
    grid = candidate_grid(bm, shapes)
    pi = box_unit_cost(bm, h.S, h.G) * rng.uniform(0.5, 3.0, len(h)) + rng.uniform(0, 3e7, len(h))
    on = rng.random(4) < 0.5
    d = pricing.Duals(pi, mu=float(rng.uniform(0, 1e4)) * on[0], rho=float(rng.uniform(0, 1e7)) * on[1],
                      lam=float(rng.uniform(0, 1e9)) * on[2], gam=float(rng.uniform(0, 2)) * on[3])
    return rng, bm, grid, d, max_batch


@pytest.mark.parametrize("seed", range(80))
def test_the_sweep_prices_every_box_as_the_dense_pass_does(seed):
    _, bm, grid, d, max_batch = random_case(seed)
    assert pricing._field(bm, grid, d, max_batch) is not None  # the analytic cost model is monotone
    for amortise, cap in ((True, max_batch), (False, None)):
        sweep = pricing.grid_values(bm, grid, d, cap, amortise)
        dense = pricing.dense_values(bm, grid, d, cap, amortise)
        finite = np.isfinite(dense)
        assert (np.isfinite(sweep) == finite).all()
        scale = float(np.abs(dense[finite]).max(initial=0.0)) + 1.0
        assert np.allclose(sweep[finite], dense[finite], rtol=0, atol=1e-10 * scale)
        assert (sweep[finite] <= dense[finite] + 1e-14 * scale).all()  # never above: the bound stays a bound


@pytest.mark.parametrize("seed", range(80))
def test_the_sweep_finds_the_arcs_the_dense_pass_finds(seed):
    rng, bm, grid, d, _ = random_case(seed)
    boxes = np.unique(rng.integers(0, len(grid), int(rng.integers(1, len(grid) + 1))))
    for slack, most in ((0.0, None), (1e8, 3), (0.0, 2), (-1e6, None)):
        fast = pricing.box_arcs(bm, grid, d, boxes, slack, most)
        dense = pricing._dense_arcs(bm, grid, d, boxes, slack, most, None)
        assert arcs(fast) == arcs(dense)


def test_near_arcs_are_each_cells_cheapest_boxes():
    """``near`` keeps, per cell, its smallest shapes and gens only: a subset of the full arcs, own boxes kept."""
    rng, bm, grid, d, _ = random_case(3)
    boxes = np.arange(len(grid))
    full = arcs(pricing.box_arcs(bm, grid, d, boxes, 1e12))
    near = arcs(pricing.box_arcs(bm, grid, d, boxes, 1e12, near=2))
    assert near <= full and len(near) < len(full)
    own = pricing._tight(bm, *grid.box(boxes))
    assert {(int(c), int(k)) for k, c in enumerate(own) if c >= 0} <= near
