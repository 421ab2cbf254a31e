"""The pricing kernels every device-mode certificate rests on, against plain enumerations on small random boxes:
``shape_lp.least_reduced_costs`` (each box's most negative batch) and ``rider_chain.rider_units`` (per gen, the
largest rider prices one per request).  Both share work between the boxes of one gen, which these checks must
not be able to tell from box by box."""

from __future__ import annotations

import numpy as np
import pytest

from model.planning import shape_lp
from model.planning.rider_chain import rider_units
from model.planning.shape_lp import Boxes, Cells, least_reduced_costs


def random_case(rng: np.random.Generator) -> tuple[Cells, Boxes, np.ndarray, float]:
    m, nb, ns = int(rng.integers(1, 25)), int(rng.integers(1, 20)), int(rng.integers(1, 4))
    cells = Cells(rng.integers(0, ns, m), rng.integers(1, 12, m), rng.integers(1, 4, m))
    lo = rng.integers(0, 4, nb)
    boxes = Boxes(rng.integers(int(cells.j.min()), ns, nb), rng.integers(1, 14, nb), rng.uniform(0, 40, nb),
                  rng.uniform(0, 8, nb), lo, lo + rng.integers(0, 8, nb), rng.random(nb) < 0.5)
    pi = np.round(rng.normal(4, 5, m), int(rng.integers(0, 3)))  # rounded now and then: ties between cells
    return cells, boxes, pi, float(rng.choice([0.0, 2.5]))


def enumerated(cells: Cells, boxes: Boxes, pi: np.ndarray, mu: float) -> np.ndarray:
    """Per box, the least over n in its size range of fixed + n * (per + mu * over) less the n largest prices of
    its eligible requests (inf where it cannot be filled)."""
    out = np.full(len(boxes.i), np.inf)
    for k in range(len(boxes.i)):
        ok = (cells.j <= boxes.i[k]) & (cells.G <= boxes.g[k])
        prices = np.sort(np.repeat(pi[ok], cells.n[ok]))[::-1]
        pe = boxes.per[k] + mu * boxes.over[k]
        for n in range(max(1, int(boxes.lo[k])), int(boxes.hi[k]) + 1):
            if n <= len(prices):
                out[k] = min(out[k], boxes.fixed[k] + n * pe - prices[:n].sum())
        if boxes.lo[k] == 0 and boxes.hi[k] >= 0:  # an empty batch's size is 0 where the range allows it
            out[k] = min(out[k], boxes.fixed[k])
    return out


@pytest.mark.parametrize("block", [2_000_000, 3])
def test_the_least_reduced_costs_are_each_boxs_most_negative_batch(monkeypatch, block):
    monkeypatch.setattr(shape_lp, "PRICE_BLOCK", block)  # several blocks of gens per shape too
    rng = np.random.default_rng(block)
    for _ in range(300):
        cells, boxes, pi, mu = random_case(rng)
        got, want = least_reduced_costs(cells, boxes, pi, mu), enumerated(cells, boxes, pi, mu)
        assert np.all(np.isinf(want) == np.isinf(got))
        # the kernel prices one size per box (the largest worth its time, clipped to the range): never below the
        # enumeration, and equal to it (the batch cost is convex in the size), within float sums
        fin = np.isfinite(want)
        assert np.allclose(got[fin], want[fin], rtol=1e-12, atol=1e-9)


def test_the_riders_units_are_the_largest_prices_per_gen():
    rng = np.random.default_rng(7)
    for _ in range(300):
        r = int(rng.integers(0, 12))
        p = np.sort(rng.normal(3, 4, r))[::-1]
        n, G = rng.integers(1, 4, r), rng.integers(1, 9, r)
        gens, most = np.unique(rng.integers(1, 10, int(rng.integers(1, 6)))), int(rng.integers(0, 7))
        units, count = rider_units(p, n, G, gens, most)
        for row, g in enumerate(gens):
            prices = np.repeat(p[G <= g], n[G <= g])  # already in descending order
            assert count[row] == (len(prices) if r and most >= 1 else 0)
            want = np.zeros(max(most, 0))
            want[:min(most, len(prices))] = prices[:most]
            assert np.array_equal(units[row], want)
