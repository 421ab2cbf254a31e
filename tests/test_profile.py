"""Device-profile TOML: the shared profile loads; every bad one names file, line and key; no crash on garbage."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from model.base.errors import InputError
from model.cost.device import DeviceProfile
from model.load.profile import device_key_line, load_profile, profile_from_table

REPO = Path(__file__).resolve().parents[1]
BUNDLED = REPO / "data" / "profiles" / "opt13b-a100-tp1.toml"  # a copy of shared/profiles/ (a bare clone tests itself)

GOOD_LINES = [
    "# a profile",                                      # 1
    "[device]",                                         # 2
    'name = "test device"',                             # 3
    "prefill = [18.1, 0.1, 7e-06]",                     # 4
    "decode = [19.9, 0.0006, 0.0385]",                  # 5
    "decode_large = [7.17, 0.00058, 0.158]",            # 6
    "decode_large_from = 95",                           # 7
    "batch_overhead_ms = 0.0",                          # 8
    "compile_ms = 20000.0",                             # 9
    "kv_capacity_tokens = 66144",                       # 10
]
GOOD = "\n".join(GOOD_LINES) + "\n"


def edit(line: int, new: str | None) -> str:
    """GOOD with 1-based line ``line`` replaced (None: blanked, so later line numbers stay put)."""
    lines = list(GOOD_LINES)
    lines[line - 1] = "" if new is None else new
    return "\n".join(lines) + "\n"


def plus(*extra: str) -> str:
    """GOOD with lines appended (they start at line 11)."""
    return GOOD + "\n".join(extra) + "\n"


@dataclass(frozen=True)
class Bad:
    id: str
    text: str | bytes
    line: int | None
    field: str | None
    message: str  # a fragment of the message


BAD = [
    Bad("missing-prefill", edit(4, None), 2, "device.prefill", "missing (required)"),
    Bad("missing-decode", edit(5, None), 2, "device.decode", "missing (required)"),
    Bad("missing-compile", edit(9, None), 2, "device.compile_ms", "missing (required)"),
    Bad("short-list", edit(4, "prefill = [18.1, 0.1]"), 4, "device.prefill", "expected 3 numbers [p0, p1, p2], got 2"),
    Bad("long-list", edit(5, "decode = [1, 2, 3, 4]"), 5, "device.decode", "got 4 values"),
    Bad("not-a-list", edit(4, 'prefill = "18.1"'), 4, "device.prefill", "expected 3 numbers"),
    Bad("non-numeric", edit(5, 'decode = [19.9, "x", 0.03]'), 5, "device.decode", "value 2 of [d0, d1, d2]"),
    Bad("boolean-coeff", edit(6, "decode_large = [7.1, 0.0005, true]"), 6, "device.decode_large", "got true"),
    Bad("negative-coeff", edit(4, "prefill = [-1.0, 0.1, 0.0]"), 4, "device.prefill", "got -1.0"),
    Bad("nan-coeff", edit(4, "prefill = [nan, 0.1, 0.0]"), 4, "device.prefill", "got nan"),
    Bad("inf-compile", edit(9, "compile_ms = inf"), 9, "device.compile_ms", "finite non-negative number, got inf"),
    Bad("nan-overhead", edit(8, "batch_overhead_ms = nan"), 8, "device.batch_overhead_ms", "got nan"),
    Bad("negative-overhead", edit(8, "batch_overhead_ms = -8"), 8, "device.batch_overhead_ms", "got -8"),
    Bad("bool-compile", edit(9, "compile_ms = true"), 9, "device.compile_ms", "got true"),
    Bad("string-compile", edit(9, 'compile_ms = "20 s"'), 9, "device.compile_ms", "got '20 s'"),
    Bad("negative-price", plus("cost_per_device_hour = -2.5"), 11, "device.cost_per_device_hour", "got -2.5"),
    Bad("unknown-key", plus("decode_larg = [1, 2, 3]"), 11, "device.decode_larg", "unknown device-profile key"),
    Bad("large-without-from", edit(7, None), 6, "device.decode_large_from", "decode_large is given"),
    Bad("from-without-large", edit(6, None), 7, "device.decode_large", "decode_large_from is given"),
    Bad("from-zero", edit(7, "decode_large_from = 0"), 7, "device.decode_large_from", "positive integer, got 0"),
    Bad("from-float", edit(7, "decode_large_from = 95.0"), 7, "device.decode_large_from", "got 95.0"),
    Bad("from-bool", edit(7, "decode_large_from = true"), 7, "device.decode_large_from", "got true"),
    Bad("kv-negative", edit(10, "kv_capacity_tokens = -5"), 10, "device.kv_capacity_tokens", "got -5"),
    Bad("kv-string", edit(10, 'kv_capacity_tokens = "66144"'), 10, "device.kv_capacity_tokens", "got '66144'"),
    Bad("kv-huge", edit(10, "kv_capacity_tokens = 99999999999999999999"), 10, "device.kv_capacity_tokens",
        "positive integer"),
    Bad("name-not-string", edit(3, "name = 3"), 3, "device.name", "must be a string, got 3"),
    Bad("subtable", plus("[device.extra]", "x = 1"), 11, "device.extra", "unknown device-profile key"),
    Bad("dotted-key", "device.prefill = [1, 2]\ndevice.decode = [1, 2, 3]\ndevice.compile_ms = 1\n", 1,
        "device.prefill", "got 2 values"),
    Bad("malformed", edit(5, "decode = = [19.9, 0.0006, 0.03]"), 5, None, "malformed TOML"),
    Bad("duplicate-key", plus("compile_ms = 1.0"), 11, None, "malformed TOML"),
    Bad("top-level-key", "mode = 1\n" + GOOD, 1, "mode", "unknown key (a profile holds a [device] table and an optional [server]"),
    Bad("other-table", plus("[cost_model]", "Kp_attn = 1"), 11, "cost_model", "unknown key"),
    Bad("no-device", "# nothing\n", None, "device", "missing [device] table"),
    Bad("device-not-table", "device = 3\n", 1, "device", "must be a table, got 3"),
    Bad("device-array", "[[device]]\nprefill = [1, 2, 3]\n", 1, "device", "must be a table"),
    Bad("not-utf8", GOOD.encode() + b"# \xff\n", 11, None, "not UTF-8 text (byte 0xff at column 3)"),
    # valid TOML integers no float64 holds: refused like inf (they passed the range check, then float() raised)
    Bad("compile-400-digits", edit(9, "compile_ms = 1" + "0" * 400), 9, "device.compile_ms",
        "must be a finite non-negative number, got 1000"),
    Bad("compile-1e308", edit(9, "compile_ms = 1e308"), 9, "device.compile_ms", "must be at most 1e+12, got 1e+308"),
    Bad("coeff-1e300", edit(4, "prefill = [1.0, 0.1, 1e300]"), 4, "device.prefill",
        "value 3 of [p0, p1, p2] must be at most 1e+12, got 1e+300"),
    Bad("coeff-400-digits", edit(5, f"decode = [1, 1{'0' * 400}, 1]"), 5, "device.decode",
        "value 2 of [d0, d1, d2] must be a finite non-negative number, got 1000"),
    Bad("nested-too-deeply", "a = " + "[" * 100_000 + "\n", None, None, "malformed TOML: nested too deeply"),  # was
    # a RecursionError traceback
]


@pytest.mark.parametrize("case", BAD, ids=[c.id for c in BAD])
def test_bad_profile_names_file_line_and_key(tmp_path: Path, case: Bad):
    path = tmp_path / "profile.toml"
    if isinstance(case.text, bytes):
        path.write_bytes(case.text)
    else:
        path.write_text(case.text)
    with pytest.raises(InputError) as info:
        load_profile(path)
    err = info.value
    assert (err.file, err.line, err.field) == (str(path), case.line, case.field), err.render()
    assert case.message in err.message, err.render()
    where = str(path) if case.line is None else f"{path}:{case.line}"
    assert err.render().startswith(f"{where}:")


def test_missing_file_and_directory(tmp_path: Path):
    with pytest.raises(InputError, match="cannot read") as info:
        load_profile(tmp_path / "absent.toml")
    assert info.value.file == str(tmp_path / "absent.toml") and info.value.line is None
    with pytest.raises(InputError, match="is a directory") as info:
        load_profile(tmp_path)
    assert info.value.file == str(tmp_path)


def test_bundled_profile_loads_exactly():
    prof = load_profile(BUNDLED)
    assert prof == DeviceProfile(
        name="opt-13b / A100-80GB / TP1 (DistServe fit), 20 s compile per shape",
        prefill=(18.10254647486372, 0.1019122572698738, 7.122264314252114e-06),
        decode=(19.934702624895458, 0.0006269356524350583, 0.03850697740828398),
        decode_large=(7.1661889468253595, 0.0005798000403396046, 0.15831096191764046),
        decode_large_from=95, batch_overhead_ms=0.0, compile_ms=20000.0, kv_capacity_tokens=66144,
        cost_per_device_hour=5.12)
    bundled = BUNDLED.read_text()
    assert "DistServe" in bundled and "Apache-2.0" in bundled and "shared/profiles/opt13b-a100-tp1.toml" in bundled


def test_optional_keys_default(tmp_path: Path):
    path = tmp_path / "small.toml"
    path.write_text("[device]\nprefill = [1, 0, 0]\ndecode = [2, 0, 0]\ncompile_ms = 5\n")
    prof = load_profile(path)
    assert prof.name == "small" and prof.decode_large is None and prof.decode_large_from is None
    assert prof.batch_overhead_ms == 0.0 and prof.kv_capacity_tokens is None and prof.cost_per_device_hour is None
    assert prof.prefill == (1.0, 0.0, 0.0) and isinstance(prof.compile_ms, float)


def test_inline_table_in_a_scenario_points_at_its_lines():
    """A scenario's [device] table is checked by the same code, lines counted in the scenario."""
    import tomllib

    text = ("max_shapes = 8\n\n[device]\nprefill = [1, 2, 3]\ndecode = [1, 2]\ncompile_ms = 1\n\n"
            "[[bucket]]\nname = \"a\"\nrequests = \"a.jsonl\"\n")
    table = tomllib.loads(text)["device"]
    with pytest.raises(InputError) as info:
        profile_from_table(table, "scenario.toml", text)
    assert (info.value.file, info.value.line, info.value.field) == ("scenario.toml", 5, "device.decode")
    good = text.replace("decode = [1, 2]", "decode = [1, 2, 0.5]")
    prof = profile_from_table(tomllib.loads(good)["device"], "scenario.toml", good, default_name="inline")
    assert prof.decode == (1.0, 2.0, 0.5) and prof.name == "inline"
    assert device_key_line(good, "device") == 3 and device_key_line(good, "compile_ms") == 6
    assert device_key_line(good, "name") is None  # bucket keys are not the device's


MUTATION = st.tuples(st.sampled_from(["replace", "insert", "delete"]), st.integers(0, len(GOOD) - 1),
                     st.sampled_from(list(b"0123456789.-+e[]=\",#\n \\tfnaix_\xff\x00")))


@settings(max_examples=300, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mutations=st.lists(MUTATION, min_size=1, max_size=4))
def test_mutated_profile_loads_or_raises_input_error(tmp_path: Path, mutations):
    """Random byte edits of a good profile: either a profile or an InputError, never another exception."""
    data = bytearray(GOOD.encode())
    for op, at, byte in mutations:
        at = min(at, len(data))
        if op == "replace" and at < len(data):
            data[at] = byte
        elif op == "insert":
            data[at:at] = bytes([byte])
        elif at < len(data):
            del data[at]
    path = tmp_path / "mutated.toml"
    path.write_bytes(bytes(data))
    try:
        prof = load_profile(path)
    except InputError as exc:
        assert exc.file == str(path) and "\n" not in exc.render()
    else:
        assert isinstance(prof, DeviceProfile) and len(prof.prefill) == 3
