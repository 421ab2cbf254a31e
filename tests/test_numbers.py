"""The one reader of numbers (``model.base.numbers``): ASCII spelling, finite as a float64, in range, one line."""

from __future__ import annotations

import math

import pytest

from model.base.errors import InputError
from model.base.numbers import (
    Where,
    as_float,
    as_integer,
    decimal_text,
    float_flag,
    int_flag,
    integer_text,
    read_count,
    read_number,
    shown,
)

HERE = Where("f.toml", 3, "k")


@pytest.mark.parametrize("text", ["1_0", "\u0661\u0660", "\uff11", " 5", "5 ", "+5", "0x10", "1e3", "", "1.5"])
def test_integer_text_is_ascii_digits_only(text):
    assert integer_text(text) is None


@pytest.mark.parametrize("text, value", [("0", 0), ("-12", -12), ("007", 7), ("1" + "0" * 30, 10**30)])
def test_integer_text_reads_plain_digits_exactly(text, value):
    assert integer_text(text) == value


@pytest.mark.parametrize("text", ["1_0.5", "\u0661.5", " 1.5", "1.5 ", "1,5", "0x1p3", "e3", ".", "-", "1e", "++1"])
def test_decimal_text_refuses_what_float_would_take_or_nothing_means(text):
    assert decimal_text(text) is None


def test_decimal_text_names_non_finite_words_and_overflow_as_floats():
    assert math.isnan(decimal_text("nan")) and decimal_text("-inf") == -math.inf
    assert decimal_text("1e400") == math.inf and decimal_text(".5") == 0.5 and decimal_text("2.") == 2.0


def test_typed_values_booleans_and_huge_integers():
    assert as_float(True) is None and as_integer(False) is None and as_integer(8.0) is None
    assert as_float(10**400) == math.inf and as_float(-(10**400)) == -math.inf
    assert as_float("12") is None and as_float("12", text=True) == 12.0  # in TOML a string is no number
    assert as_integer("12") is None and as_integer("12", text=True) == 12


def test_read_number_refuses_a_huge_integer_in_one_short_line():
    with pytest.raises(InputError) as info:
        read_number(10**400, HERE)
    assert (info.value.file, info.value.line, info.value.field) == ("f.toml", 3, "k")
    assert info.value.message == f"must be a finite non-negative number, got {shown(10**400)}"
    assert len(shown(10**400)) == 60 and "\n" not in info.value.render()


def test_read_number_and_count_ranges():
    assert read_number(0, HERE) == 0.0 and read_number("2.5", HERE, text=True) == 2.5
    with pytest.raises(InputError, match="must be positive"):
        read_number(0.0, HERE, above=True, message="must be positive, got {got}")
    with pytest.raises(InputError, match="must be at most 10, got 11"):
        read_number(11, HERE, high=10, too_big="must be at most {high}, got {got}")
    assert read_count(5, HERE, 1, 5) == 5
    with pytest.raises(InputError, match=r"must be at most 5, got 6$"):
        read_count(6, HERE, 1, 5, too_big="must be at most {high}, got {got}")
    with pytest.raises(InputError, match="got true"):
        read_count(True, HERE)


def test_flag_types_raise_one_line_naming_the_flag():
    assert float_flag("--x")("1e-3") == 0.001 and math.isinf(float_flag("--x")("inf"))
    assert int_flag("--n")("12") == 12
    with pytest.raises(InputError) as info:
        int_flag("--n")("1_0")
    assert info.value.render() == "--n: expected an integer, got '1_0'"
    with pytest.raises(InputError) as info:
        float_flag("--x")("\u0661")
    assert info.value.render() == "--x: expected a number, got '\u0661'"
