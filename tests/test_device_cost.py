"""Device mode arithmetic: the worked example of shared/cost_model.md, the linear split, the KV check."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from model.cost.device import (
    DeviceProfile,
    batch_breakdown,
    batch_time,
    decode_ms,
    device_hours,
    fixed_ms,
    is_large,
    kv_fits,
    kv_tokens,
    linear_parts,
    max_members,
    per_member_ms,
    prefill_ms,
)

# The shared example profile (shared/profiles/opt13b-a100-tp1.toml), built in code so
# these tests do not depend on the loader.
OPT13B = DeviceProfile(
    name="opt13b",
    prefill=(18.10254647486372, 0.1019122572698738, 7.122264314252114e-06),
    decode=(19.934702624895458, 0.0006269356524350583, 0.03850697740828398),
    decode_large=(7.1661889468253595, 0.0005798000403396046, 0.15831096191764046),
    decode_large_from=95, batch_overhead_ms=0.0, compile_ms=20000.0, kv_capacity_tokens=66144)


@pytest.mark.parametrize("n, s, g, want", [
    (2, 128, 53, 1115.280543008088),      # "b-2"
    (1, 128, 16, 352.19455671527135),     # "b-10"
    (2, 768, 300, 6531.684589074276),     # "b-3"
])
def test_worked_example_batch_times(n, s, g, want):
    assert float(batch_time(n, s, g, OPT13B)) == pytest.approx(want, rel=1e-12, abs=0)


def test_worked_example_vectorised_and_bucket_totals():
    """The three batches at once; the bucket cost adds compile_ms per distinct shape (two here)."""
    t = batch_time(np.array([2, 1, 2]), np.array([128, 128, 768]), np.array([53, 16, 300]), OPT13B)
    np.testing.assert_allclose(t, [1115.280543008088, 352.19455671527135, 6531.684589074276], rtol=1e-12)
    assert t.sum() + 2 * OPT13B.compile_ms == pytest.approx(47999.159688797634, rel=1e-12)
    b = batch_breakdown(np.array([2, 1, 2]), np.array([128, 128, 768]), np.array([53, 16, 300]), OPT13B)
    np.testing.assert_allclose(b.total, t, rtol=1e-13)
    np.testing.assert_allclose(b.prefill + b.decode + b.overhead, t, rtol=1e-13)


def _random_batches(rng: np.random.Generator, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n = rng.integers(1, 400, size)
    s = 64 * rng.integers(1, 65, size)
    g = rng.integers(0, 4000, size)
    return n, s, g


@pytest.mark.parametrize("prof", [OPT13B, replace(OPT13B, decode_large=None, decode_large_from=None),
                                  replace(OPT13B, batch_overhead_ms=8.5)], ids=["split", "one-regime", "overhead"])
def test_linear_split_equals_batch_time(prof):
    """T = fixed + n * per_member in the regime n falls in, on random batches of both regimes."""
    rng = np.random.default_rng(7)
    n, s, g = _random_batches(rng, 20_000)
    large = is_large(n, prof)
    if prof.decode_large is not None:
        assert large.any() and (~large).any()
    fixed, per_member = linear_parts(s, g, large, prof)
    np.testing.assert_array_equal(fixed, fixed_ms(s, g, large, prof))
    np.testing.assert_array_equal(per_member, per_member_ms(s, g, large, prof))
    np.testing.assert_allclose(fixed + n * per_member, batch_time(n, s, g, prof), rtol=1e-12, atol=0)
    np.testing.assert_allclose(batch_breakdown(n, s, g, prof).total, batch_time(n, s, g, prof), rtol=1e-12)
    np.testing.assert_allclose(prefill_ms(n, s, prof) + decode_ms(n, s, g, prof) + prof.batch_overhead_ms,
                               batch_time(n, s, g, prof), rtol=1e-12)


def test_regime_switch_uses_decode_large():
    """n = 94 runs decode, n = 95 decode_large; each regime's split holds on both sides of the switch."""
    s, g = np.array([512, 512]), np.array([100, 100])
    n = np.array([94, 95])
    t = batch_time(n, s, g, OPT13B)
    for large in (False, True):
        fixed, per = linear_parts(s, g, large, OPT13B)
        k = int(large)
        assert fixed[k] + n[k] * per[k] == pytest.approx(t[k], rel=1e-12)
    d_small = OPT13B.decode
    expected_94 = (OPT13B.prefill[0] + OPT13B.prefill[1] * 94 * 512 + OPT13B.prefill[2] * 94 * 512**2
                   + 100 * d_small[0] + d_small[1] * 94 * sum(512 + k for k in range(100)) + d_small[2] * 94 * 100)
    assert t[0] == pytest.approx(expected_94, rel=1e-12)


def test_large_regime_without_coefficients_is_an_error():
    prof = replace(OPT13B, decode_large=None, decode_large_from=None)
    with pytest.raises(ValueError, match="no decode_large"):
        linear_parts(np.array([128]), np.array([10]), True, prof)


def test_profile_consistency_checks():
    with pytest.raises(ValueError, match="go together"):
        replace(OPT13B, decode_large=None)
    with pytest.raises(ValueError, match="three"):
        replace(OPT13B, prefill=(1.0, 2.0))
    with pytest.raises(ValueError, match="positive integer"):
        replace(OPT13B, kv_capacity_tokens=0)


def test_kv_check():
    n, s, g = np.array([1, 50, 51, 100]), np.array([1024, 1024, 1024, 512]), np.array([300, 298, 300, 150])
    np.testing.assert_array_equal(kv_tokens(n, s, g), [1324, 66100, 67524, 66200])
    np.testing.assert_array_equal(kv_fits(n, s, g, OPT13B), [True, True, False, False])
    np.testing.assert_array_equal(max_members(s, g, OPT13B), [49, 50, 49, 99])
    unlimited = replace(OPT13B, kv_capacity_tokens=None)
    assert kv_fits(n, s, g, unlimited).all() and max_members(s, g, unlimited) is None
    # max_members is the largest n that fits, and one more never does
    m = max_members(s, g, OPT13B)
    assert kv_fits(m, s, g, OPT13B).all() and not kv_fits(m + 1, s, g, OPT13B).any()


def test_device_hours():
    assert float(device_hours(3_600_000.0)) == 1.0
    np.testing.assert_allclose(device_hours(np.array([0.0, 1800_000.0])), [0.0, 0.5])
