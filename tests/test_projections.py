"""``projections.greatest_convex`` behind every device-mode dual, and both its methods (the alternating rounds, the
one pass), against a hand example and an LP: on random small instances each value is the most that level can
have over every feasible convex V."""

from __future__ import annotations

import numpy as np
import pytest
from ortools.linear_solver import pywraplp

from model.planning import projections
from model.planning.projections import greatest_convex

METHODS = {
    "chosen": greatest_convex,
    "one pass": projections.one_pass,
    "rounds": lambda N, V0, T: projections.alternated(N, V0, T, rounds=projections.ROUNDS * 500),
}


def random_case(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Levels of 1-4 members, a start V0 (cumulative single prices, some cut lower) and window limits T that
    grow with the level and the size, a share of them inf (no batch of that size there)."""
    L, top = int(rng.integers(1, 8)), int(rng.integers(0, 7))
    c = rng.integers(1, 5, L).astype(np.float64)
    N = np.r_[0.0, np.cumsum(c)]
    fixed, per = rng.uniform(0, 20), rng.uniform(-2, 5)  # per < 0: prices may come out negative
    g = np.cumsum(rng.uniform(0, 3, L))
    n = np.arange(1, top + 1)
    T = fixed + g[:, None] + per * n[None, :] + rng.uniform(0, 4, (L, top))
    T = np.where((rng.random((L, top)) < 0.25) | (n[None, :] > N[1:, None]), np.inf, T)
    single = np.where(rng.random(L) < 0.2, rng.uniform(-5, 5, L), fixed + g + per)
    return N, np.r_[0.0, np.cumsum(c * single)], T


def lp_most(N: np.ndarray, V0: np.ndarray, T: np.ndarray, level: int) -> float:
    """max V[level] over every convex V with V[0] = V0[0], V <= V0 and every window limit (GLOP)."""
    L = len(N) - 1
    lp = pywraplp.Solver.CreateSolver("GLOP")
    V = [V0[0]] + [lp.NumVar(-lp.infinity(), lp.infinity(), f"v{i}") for i in range(1, L + 1)]

    def at(x: float):
        j = max(1, int(np.searchsorted(N, x, side="left")))
        w = (x - N[j - 1]) / (N[j] - N[j - 1])
        return (1 - w) * V[j - 1] + w * V[j]

    c = np.diff(N)
    for i in range(1, L + 1):
        lp.Add(V[i] <= V0[i])
        if i < L:
            lp.Add((V[i + 1] - V[i]) * (1 / c[i]) >= (V[i] - V[i - 1]) * (1 / c[i - 1]))
        for k in range(T.shape[1]):
            if np.isfinite(T[i - 1, k]):
                lp.Add(V[i] - at(max(N[i] - (k + 1), 0.0)) <= T[i - 1, k])
    lp.Maximize(V[level])
    assert lp.Solve() == pywraplp.Solver.OPTIMAL
    return V[level].solution_value()


@pytest.mark.parametrize("method", METHODS)
def test_a_level_priced_below_the_one_under_it_shares_its_price(method):
    # one member per level: alone the first may take 8, but the two together at most 10 (V0), so convexity
    # leaves each 5
    V = METHODS[method](np.array([0.0, 1.0, 2.0]), np.array([0.0, 10.0, 10.0]), np.array([[8.0], [np.inf]]))
    assert np.allclose(V, [0.0, 5.0, 10.0])


@pytest.mark.parametrize("method", METHODS)
def test_each_value_is_the_most_any_feasible_convex_v_has_there(method):
    rng = np.random.default_rng(22)
    for _ in range(150):
        N, V0, T = random_case(rng)
        V = METHODS[method](N, V0, T)
        scale = 1.0 + np.abs(V0).max() + np.abs(np.where(np.isfinite(T), T, 0)).max(initial=0)
        # feasible: at most V0, convex, every window within its limit
        assert V[0] == V0[0] and np.all(V <= V0 + 1e-9 * scale)
        assert np.all(np.diff(np.diff(V) / np.diff(N)) >= -1e-9 * scale)
        n = np.arange(1, T.shape[1] + 1)
        sums = V[1:, None] - np.interp(np.maximum(N[1:, None] - n[None, :], 0.0), N, V)
        assert np.all(np.where(np.isfinite(T), sums - T, -np.inf) <= 1e-9 * scale)
        # greatest: no feasible V is above it anywhere
        for level in range(1, len(N)):
            assert V[level] == pytest.approx(lp_most(N, V0, T, level), rel=1e-7, abs=1e-7 * scale)


def test_the_rounds_hand_over_to_the_one_pass_where_they_have_not_settled(monkeypatch):
    rng = np.random.default_rng(5)
    cases = [random_case(rng) for _ in range(60)]
    assert any(projections.alternated(*case, rounds=1) is None for case in cases)
    monkeypatch.setattr(projections, "ROUNDS", 1)
    for case in cases:
        assert np.allclose(greatest_convex(*case), projections.one_pass(*case), rtol=1e-9, atol=1e-9)
