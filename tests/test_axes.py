"""The pictures' shared axis helpers: readable log ticks and tick labels."""

from __future__ import annotations

from model.base.axes import nice_ticks, plain_number


def test_tick_labels_are_plain_and_exact_for_lengths():
    assert [plain_number(v) for v in (16384, 2048.0, 0.5, 27.41, 123456, 3.2e6, 0)] == [
        "16384", "2048", "0.5", "27.41", "123.5k", "3.2M", "0"]


def test_log_ticks_are_powers_of_two_for_lengths_and_1_2_5_for_times():
    assert nice_ticks(32, 16384, most=10) == [2.0**k for k in range(5, 15)]
    assert nice_ticks(0.77, 333) == [2.0**k for k in range(9)]
    assert nice_ticks(20, 200, twos=False) == [20.0, 50.0, 100.0, 200.0]
    assert nice_ticks(19, 70, twos=False) == [20.0, 30.0, 40.0, 50.0, 60.0]  # within a decade: finer steps
    assert nice_ticks(1, 3e6, twos=False) == [10.0**k for k in range(7)]
