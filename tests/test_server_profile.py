"""The profile's serving settings: ``runtime_compile_ms`` in [device], the [server] table, flags over it, and
``model.calibrate`` writing the table (or its skeleton).  Every bad value names file, line and ``server.KEY``
(or the flag that gave it)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from test_calibrate import run_cli, write_csv

from model.base.errors import InputError
from model.domain.server import ServerSettings
from model.load.profile import load_profile, load_profile_file
from model.load.server import server_settings

DEVICE = "[device]\nprefill = [10.0, 0.01, 1e-5]\ndecode = [20.0, 0.001, 0.5]\ncompile_ms = 10000\n"  # lines 1-4
SERVER = ('[server]\nstack = "gaudi"\nmax_num_seqs = 4\nmax_num_batched_tokens = 1024\nblock_size = 128\n')  # 5-9


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "p.toml"
    path.write_text(text)
    return path


def test_a_server_table_loads_and_the_planner_still_reads_the_profile(tmp_path):
    path = write(tmp_path, DEVICE + SERVER)
    profile, table = load_profile_file(path)
    assert load_profile(path) == profile and profile.runtime_compile == 10000.0  # default: compile_ms
    assert server_settings(table, {}) == ServerSettings(stack="gaudi", max_num_seqs=4, max_num_batched_tokens=1024)
    assert load_profile_file(write(tmp_path, DEVICE))[1] is None


def test_runtime_compile_ms_is_read_and_checked(tmp_path):
    assert load_profile(write(tmp_path, DEVICE + "runtime_compile_ms = 2500\n")).runtime_compile == 2500.0
    with pytest.raises(InputError) as info:
        load_profile(write(tmp_path, DEVICE + "runtime_compile_ms = -1\n"))
    assert (info.value.line, info.value.field) == (5, "device.runtime_compile_ms")


BAD = [
    ("stack", 'stack = "tpu"', "must be one of gaudi, nxdi"),
    ("stack", "stack = 1", "must be one of gaudi, nxdi, got 1"),
    ("max_num_seqs", "max_num_seqs = 0", "positive integer"),
    ("max_num_seqs", "max_num_seqs = -4", "got -4"),
    ("max_num_seqs", "max_num_seqs = 4.0", "got 4.0"),
    ("max_num_seqs", "max_num_seqs = true", "got true"),
    ("max_num_batched_tokens", 'max_num_batched_tokens = "1024"', "got '1024'"),
    ("max_num_batched_tokens", "max_num_batched_tokens = 99999999999999", "up to 2147483647"),
    ("block_size", "block_size = 0", "positive integer"),
    ("block_size", "block_size = 2000000", "up to 1048576"),
]


@pytest.mark.parametrize("key,line,message", BAD, ids=[f"{k}:{v}" for k, v, _ in BAD])
def test_a_bad_server_value_names_its_line_and_key(tmp_path, key, line, message):
    text = DEVICE + "\n".join(line if row.startswith(f"{key} =") else row for row in SERVER.splitlines()) + "\n"
    path = write(tmp_path, text)
    with pytest.raises(InputError) as info:
        load_profile(path)  # the planner sees a bad [server] table too
    want_line = 1 + text.splitlines().index(line)
    assert (info.value.file, info.value.line, info.value.field) == (str(path), want_line, f"server.{key}")
    assert message in info.value.message, info.value.render()


@pytest.mark.parametrize("extra,key,message", [
    ("max_num_seq = 4", "max_num_seq", "unknown server key"),
    ("ctx_batch_size = 2", "ctx_batch_size", "setting of the nxdi stack, and this table's stack is gaudi"),
])
def test_unknown_and_misplaced_keys(tmp_path, extra, key, message):
    path = write(tmp_path, DEVICE + SERVER + extra + "\n")
    with pytest.raises(InputError) as info:
        load_profile_file(path)
    assert (info.value.line, info.value.field) == (10, f"server.{key}") and message in info.value.message


def test_a_server_table_that_is_not_a_table(tmp_path):
    with pytest.raises(InputError) as info:
        load_profile_file(write(tmp_path, "server = 3\n" + DEVICE))
    assert (info.value.line, info.value.field) == (1, "server")


def test_flags_replace_keys_and_errors_name_the_flag(tmp_path):
    _, table = load_profile_file(write(tmp_path, DEVICE + SERVER))
    assert server_settings(table, {"max_num_seqs": 8}).max_num_seqs == 8
    # switching the stack by flag drops the table's own gaudi-only keys (its block_size), not an error
    assert server_settings(table, {"stack": "nxdi", "ctx_batch_size": 2}) == ServerSettings(
        stack="nxdi", max_num_seqs=4, max_num_batched_tokens=1024, ctx_batch_size=2)
    for flags, flag, message in (({"max_num_seqs": 0}, "--max-num-seqs", "positive integer"),
                                 ({"ctx_batch_size": 2}, "--ctx-batch-size", "setting of the nxdi stack"),
                                 ({"stack": "nxdi", "ctx_batch_size": 9}, "--ctx-batch-size", "above max_num_seqs 4")):
        with pytest.raises(InputError) as info:
            server_settings(table, flags)
        assert info.value.file == flag and message in info.value.message, info.value.render()


def test_a_missing_required_setting_names_both_places(tmp_path):
    path = write(tmp_path, DEVICE + '[server]\nstack = "nxdi"\nmax_num_seqs = 4\n')
    _, table = load_profile_file(path)
    with pytest.raises(InputError) as info:
        server_settings(table, {})
    assert (info.value.file, info.value.line, info.value.field) == (str(path), 5, "server.max_num_batched_tokens")
    assert "--max-num-batched-tokens" in info.value.message
    with pytest.raises(InputError, match="--stack"):
        server_settings(None, {"max_num_seqs": 4})


@pytest.mark.slow  # 2-7 s each on 2 cores: the default run's 90 s budget; cheaper siblings cover it by default
def test_calibrate_writes_the_server_table_or_its_skeleton(tmp_path):
    csv = write_csv(tmp_path / "m.csv")
    plain, served = tmp_path / "plain.toml", tmp_path / "served.toml"
    assert run_cli(str(csv), "--out", str(plain)).returncode == 0
    text = plain.read_text()
    assert "# [server]" in text and "# max_num_batched_tokens" in text and "server" not in tomllib.loads(text)
    assert load_profile_file(plain)[1] is None
    done = run_cli(str(csv), "--out", str(served), "--stack", "gaudi", "--max-num-seqs", "64",
                   "--max-num-batched-tokens", "8192")
    assert done.returncode == 0, done.stderr
    _, table = load_profile_file(served)
    assert server_settings(table, {}) == ServerSettings(stack="gaudi", max_num_seqs=64, max_num_batched_tokens=8192)
    bad = run_cli(str(csv), "--out", str(tmp_path / "bad.toml"), "--stack", "nxdi", "--block-size", "64",
                  "--max-num-seqs", "4", "--max-num-batched-tokens", "512")
    assert bad.returncode == 2 and bad.stderr.startswith("error: --block-size:") and not (tmp_path / "bad.toml").exists()
