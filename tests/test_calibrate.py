"""Calibration: coefficients come back from noisy synthetic measurements; the CLI writes all or nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from model import calibrate
from model.base.errors import InputError
from model.calibration import fit_plots
from model.calibration.fit import DEFAULT_COMPILE_MS, features, fit_profile
from model.calibration.measurements import measurements_csv, parse_measurements, read_measurements
from model.calibration.synthetic import Grid, synthetic_measurements
from model.cli_common import run_main
from model.load.profile import load_profile

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO / "data" / "profiles" / "opt13b-a100-tp1.toml"  # the bundled copy of shared/profiles/
TRUTH = load_profile(SHARED)
SHARE_CHECKED = 0.05   # a coefficient carrying at least this share of the modelled time ...
RECOVERY = 0.05        # ... must come back within this relative error
SMALL_GRID = Grid(prefill_batches=(1, 2, 4, 8), prefill_lengths=(128, 512, 1024, 2048),
                  decode_batches=(1, 4, 16, 48, 96, 128, 256), decode_contexts=(128, 512, 2048))


def shares(phase: str, n: np.ndarray, s: np.ndarray, coefficients) -> np.ndarray:
    """Each coefficient's share of the modelled time summed over the given rows (true coefficients)."""
    parts = features(phase, n, s) * np.asarray(coefficients)
    return parts.sum(axis=0) / parts.sum()


def test_noisy_measurements_recover_every_coefficient_that_matters():
    """3 % multiplicative noise: every coefficient with >= 5 % of its regime's time comes back within 5 %."""
    m = synthetic_measurements(TRUTH, np.random.default_rng(2024), noise=0.03)
    cal = fit_profile(m)
    got = cal.profile
    assert got.decode_large_from is not None and abs(got.decode_large_from - TRUTH.decode_large_from) <= 8
    regimes = {"prefill": m.of("prefill"),
               "decode": m.of("decode").subset(m.of("decode").batch_size < TRUTH.decode_large_from),
               "decode_large": m.of("decode").subset(m.of("decode").batch_size >= TRUTH.decode_large_from)}
    checked = 0
    for key, rows in regimes.items():
        phase = "prefill" if key == "prefill" else "decode"
        share = shares(phase, rows.batch_size, rows.seq_len, getattr(TRUTH, key))
        err = np.abs(np.asarray(getattr(got, key)) / np.asarray(getattr(TRUTH, key)) - 1)
        for j in np.flatnonzero(share >= SHARE_CHECKED):
            assert err[j] <= RECOVERY, f"{key}[{j}]: share {share[j]:.3f}, off by {err[j]:.3%}"
            checked += 1
    assert checked >= 7  # on this grid only p0 (prefill) and d2 (small decode) carry under 5 %
    for fit in cal.fits:
        assert fit.r2 > 0.98 and fit.mean_rel_error < 0.03


def test_exact_measurements_give_the_exact_profile():
    cal = fit_profile(synthetic_measurements(TRUTH, np.random.default_rng(0), noise=0.0, repeats=1),
                      kv_capacity_tokens=66144, name="x")
    for key in ("prefill", "decode", "decode_large"):
        np.testing.assert_allclose(getattr(cal.profile, key), getattr(TRUTH, key), rtol=1e-9)
    assert cal.profile.compile_ms == DEFAULT_COMPILE_MS and cal.profile.kv_capacity_tokens == 66144


@pytest.mark.parametrize("true_from, want", [(40, 40), (95, 96), (None, None)])
def test_auto_split_finds_the_switch_or_none(true_from, want):
    """The split lands on the first measured batch size at or above the true one; no switch, no split."""
    truth = replace(TRUTH, decode_large_from=true_from, decode_large=TRUTH.decode_large if true_from else None)
    cal = fit_profile(synthetic_measurements(truth, np.random.default_rng(5), repeats=4))
    assert cal.profile.decode_large_from == want
    assert cal.split_mode == "auto" and len(cal.split_candidates) > 10


def test_forced_and_disabled_split():
    m = synthetic_measurements(TRUTH, np.random.default_rng(1), repeats=1, grid=SMALL_GRID)
    assert fit_profile(m, "none").profile.decode_large is None
    forced = fit_profile(m, 48).profile
    assert forced.decode_large_from == 48 and forced.decode_large is not None
    with pytest.raises(InputError, match=r"decode_large \(batch_size >= 1000\): 0 usable rows"):
        fit_profile(m, 1000)


def test_zero_weight_rows_are_ignored():
    m = synthetic_measurements(TRUTH, np.random.default_rng(3), repeats=1, grid=SMALL_GRID)
    text = measurements_csv(m)
    wild = text.replace("phase,batch_size,seq_len,ms\n", "phase,batch_size,seq_len,ms,weight\n")
    wild = wild.replace("\n", ",\n").replace("ms,weight,\n", "ms,weight\n") + "prefill,1,128,99999.0,0\n"
    a = fit_profile(parse_measurements(text, "a.csv"), "none").profile
    b = fit_profile(parse_measurements(wild, "b.csv"), "none").profile
    np.testing.assert_allclose(a.prefill, b.prefill, rtol=1e-12)


HEADER = "phase,batch_size,seq_len,ms\n"
GOOD_ROWS = "prefill,1,128,30.5\ndecode,8,512,22.0\n"
BAD_CSV = [
    ("non-numeric", HEADER + GOOD_ROWS + "decode,eight,512,22\n", 4, "batch_size", "positive integer"),
    ("float-batch", HEADER + "prefill,2.0,128,30\n", 2, "batch_size", "got '2.0'"),
    ("zero-batch", HEADER + GOOD_ROWS + "prefill,0,128,30\n", 4, "batch_size", "got '0'"),
    ("negative-len", HEADER + "prefill,1,-128,30\n", 2, "seq_len", "got '-128'"),
    ("negative-ms", HEADER + "decode,1,128,-3\n", 2, "ms", "got '-3'"),
    ("zero-ms", HEADER + "decode,1,128,0\n", 2, "ms", "must be positive"),
    ("nan-ms", HEADER + GOOD_ROWS + "\n" + "decode,1,128,nan\n", 5, "ms", "got 'nan'"),
    ("inf-ms", HEADER + "decode,1,128,inf\n", 2, "ms", "got 'inf'"),
    ("text-ms", HEADER + "decode,1,128,fast\n", 2, "ms", "must be a number"),
    ("unknown-phase", HEADER + "Decode,1,128,3\n", 2, "phase", "unknown phase 'Decode'"),
    ("bad-weight", "phase,batch_size,seq_len,ms,weight\ndecode,1,128,3,-1\n", 2, "weight", "got '-1'"),
    ("missing-column", "phase,batch_size,ms\nprefill,1,3\n", 1, "seq_len", "missing column"),
    ("unknown-column", "phase,batch_size,seq_len,ms,wieght\n", 1, "wieght", "unknown column"),
    ("short-row", HEADER + "prefill,1,128\n", 2, None, "expected 4 fields"),
    ("empty", "", None, None, "empty file"),
    ("header-only", HEADER, 1, None, "no measurements"),
    # numbers as the one reader reads them: ASCII digits, finite, in range (int()/float() took 1_0 as 10)
    ("underscore-digits", HEADER + "prefill,1_0,128,30\n", 2, "batch_size", "positive integer, got '1_0'"),
    ("arabic-indic-digits", HEADER + "prefill,1,\u0661\u0662\u0668,30\n", 2, "seq_len", "positive integer, got"),
    ("full-width-ms", HEADER + "prefill,1,128,\uff13\uff10\n", 2, "ms", "must be a number"),
    ("unterminated-quote", HEADER + GOOD_ROWS + 'decode,4,512,"22\ndecode,8,512,23\n', 4, None,
     "a quote opened on this line is never closed"),
    ("huge-ms", HEADER + "prefill,1,128,1e308\n", 2, "ms", "must be at most 1e+09, got '1e308'"),
    ("huge-weight", "phase,batch_size,seq_len,ms,weight\nprefill,1,128,30,1e308\n", 2, "weight",
     "must be at most 1e+09, got '1e308'"),
    ("subnormal-ms", HEADER + "prefill,1,128,1e-320\n", 2, "ms", "must be at least 1e-06 (a nanosecond)"),
    ("overflowing-ms", HEADER + "prefill,1,128,1e400\n", 2, "ms", "got '1e400'"),
]


@pytest.mark.parametrize("text, line, field, message", [c[1:] for c in BAD_CSV], ids=[c[0] for c in BAD_CSV])
def test_bad_measurement_rows(tmp_path: Path, text, line, field, message):
    path = tmp_path / "m.csv"
    path.write_text(text)
    with pytest.raises(InputError) as info:
        read_measurements(path)
    err = info.value
    assert (err.file, err.line, err.field) == (str(path), line, field), err.render()
    assert message in err.message, err.render()


def test_a_byte_that_is_not_utf8_is_named_by_line_and_column(tmp_path: Path):
    path = tmp_path / "m.csv"
    path.write_bytes(HEADER.encode() + b"prefill,1,128,30\ndecode,1,128,3\xff\n")
    with pytest.raises(InputError) as info:
        read_measurements(path)
    assert info.value.render() == f"{path}:3: not UTF-8 text (byte 0xff at column 15)"


def test_too_few_or_degenerate_rows_name_the_file():
    few = parse_measurements(HEADER + "prefill,1,128,30\nprefill,1,256,40\n" +
                             "".join(f"decode,{n},{c},20\n" for n in (1, 2) for c in (128, 256)), "few.csv")
    with pytest.raises(InputError, match="prefill: 2 usable rows, at least 3") as info:
        fit_profile(few)
    assert info.value.file == "few.csv"
    one_size = parse_measurements(HEADER + "".join(f"prefill,1,{s},{s / 10}\n" for s in (128, 256, 512)) +
                                  "".join(f"decode,1,{c},{20 + c / 100}\n" for c in (128, 256, 512, 1024)), "one.csv")
    with pytest.raises(InputError, match="decode: the rows cannot separate .*two batch sizes") as info:
        fit_profile(one_size)
    assert info.value.file == "one.csv"
    with pytest.raises(InputError, match="no decode rows"):
        fit_profile(parse_measurements(HEADER + "prefill,1,128,3\n", "p.csv"))


def run_cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "model.calibrate", *args], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=120, check=False)


def write_csv(path: Path, repeats: int = 2) -> Path:
    path.write_text(measurements_csv(synthetic_measurements(TRUTH, np.random.default_rng(11), repeats=repeats)))
    return path


def test_cli_writes_a_loadable_profile_and_report(tmp_path: Path):
    csv = write_csv(tmp_path / "m.csv")
    out, report = tmp_path / "prof" / "fitted.toml", tmp_path / "report"
    done = run_cli(str(csv), "--out", str(out), "--report", str(report), "--kv-capacity-tokens", "66144",
                   "--name", 'opt "13b"\t\u00e9')
    assert done.returncode == 0, done.stderr
    prof = load_profile(out)
    assert prof.name == 'opt "13b"\t\u00e9' and prof.kv_capacity_tokens == 66144
    assert prof.compile_ms == DEFAULT_COMPILE_MS and "ASSUMED" in done.stdout and "ASSUMED" in out.read_text()
    assert prof.decode_large_from == 96
    for line in ("prefill", "decode", "decode_large"):
        assert any(row.startswith(line + " ") for row in done.stdout.splitlines())
    assert sorted(p.name for p in report.iterdir()) == ["decode.png", "prefill.png"]
    assert all((report / f).read_bytes().startswith(b"\x89PNG\r\n\x1a\n") for f in ("decode.png", "prefill.png"))
    assert sorted(p.name for p in out.parent.iterdir()) == ["fitted.toml"]  # no temporary files left


def test_cli_bad_row_exits_2_and_writes_nothing(tmp_path: Path):
    csv = write_csv(tmp_path / "m.csv", repeats=1)
    lines = csv.read_text().splitlines()
    lines[6] = "decode,4,512,n/a"
    csv.write_text("\n".join(lines) + "\n")
    out = tmp_path / "good.toml"
    out.write_bytes(SHARED.read_bytes())
    before = sorted(p.name for p in tmp_path.iterdir())
    done = run_cli(str(csv), "--out", str(out), "--report", str(tmp_path / "report"))
    assert done.returncode == 2
    assert done.stderr == f"error: {csv}:7: field 'ms': must be a number, got 'n/a'\n"
    assert out.read_bytes() == SHARED.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_cli_argument_errors_and_unwritable_targets(tmp_path: Path, monkeypatch, capsys):
    """In-process (fast): bad flags and a directory as --out exit 2; nothing is left behind."""
    csv = write_csv(tmp_path / "m.csv", repeats=1)
    good = tmp_path / "good.toml"
    good.write_bytes(SHARED.read_bytes())
    cases = [
        (["--decode-split", "sometimes"], "--decode-split: must be auto, none or a positive integer"),
        (["--compile-ms", "nan"], "--compile-ms: must be a finite non-negative number"),
        (["--kv-capacity-tokens", "0"], "--kv-capacity-tokens: must be a positive integer"),
        # the flag's own range (a profile holds at most 2**53), not a complaint about the written --out file
        (["--kv-capacity-tokens", str(2**60)], f"error: --kv-capacity-tokens: must be at most {2**53} (2**53), got"),
        (["--kv-capacity-tokens", "2^60"], "error: --kv-capacity-tokens: expected an integer, got '2^60'"),
        (["--compile-ms", "1_0"], "error: --compile-ms: expected a number, got '1_0'"),
        (["--compile-ms", "1e13"], "error: --compile-ms: must be at most 1e+12, got 1e+13"),  # not the --out file's
        (["--decode-split", "\u0661"], "--decode-split: must be auto, none or a positive integer"),
    ]
    for extra, message in cases:
        monkeypatch.setattr(sys, "argv", ["calibrate", str(csv), "--out", str(good), *extra])
        with pytest.raises(SystemExit) as info:
            run_main(calibrate.main)
        assert info.value.code == 2 and message in capsys.readouterr().err
    folder = tmp_path / "folder.toml"
    folder.mkdir()
    monkeypatch.setattr(sys, "argv", ["calibrate", str(csv), "--out", str(folder)])
    with pytest.raises(SystemExit) as info:
        run_main(calibrate.main)
    assert info.value.code == 2
    assert capsys.readouterr().err == f"error: --out: {folder} is a folder; give the path of the profile TOML to write\n"
    assert list(folder.iterdir()) == [] and good.read_bytes() == SHARED.read_bytes()


def test_failed_rename_rolls_back_every_file(tmp_path: Path, monkeypatch):
    """If the second rename fails, the profile already replaced is put back and new folders vanish."""
    csv = write_csv(tmp_path / "m.csv", repeats=1)
    good = tmp_path / "good.toml"
    good.write_bytes(SHARED.read_bytes())
    real_replace = os.replace

    def failing(src, dst):
        if Path(dst).name == "prefill.png":
            raise OSError(28, "No space left on device")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", failing)
    monkeypatch.setattr(fit_plots, "report_pngs", lambda cal: {"prefill.png": b"p", "decode.png": b"d"})
    with pytest.raises(InputError, match="cannot write: No space left on device"):
        calibrate.main([str(csv), "--out", str(good), "--report", str(tmp_path / "new" / "report")])
    assert good.read_bytes() == SHARED.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["good.toml", "m.csv"]


@pytest.mark.slow
def test_a_plan_chosen_with_the_fitted_profile_costs_within_one_percent_of_the_true_profiles_plan():
    """Both plans judged by the true profile: calibration error must not move the planner's choice much."""
    from model import pipeline
    from model.cost.model import DeviceCost
    from model.domain.schema import Bucket, Limits, Problem
    from model.load.synth import CHAT, bucket_arrays

    truth = TRUTH
    fitted = fit_profile(synthetic_measurements(truth, np.random.default_rng(7), noise=0.03), "auto",
                         truth.compile_ms, truth.kv_capacity_tokens).profile
    ids, prompt, gen = bucket_arrays(np.random.default_rng(3), CHAT, 400)
    bucket = Bucket("chat", "<chat>", ids.astype(object), prompt, gen, np.arange(1, 401))

    def judged_by_truth(prof) -> float:
        chosen = pipeline.plan(Problem((bucket,), (Limits(),), 8, DeviceCost(prof)), time_limit=8)
        true_problem = Problem((bucket,), (Limits(),), 8, DeviceCost(truth))
        return pipeline.evaluate(true_problem, pipeline.expand(true_problem, chosen)).total_cost

    with_truth, with_fit = judged_by_truth(truth), judged_by_truth(fitted)
    assert with_fit <= 1.01 * with_truth, (with_fit, with_truth)
