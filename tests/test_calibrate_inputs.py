"""model.calibrate told its inputs by content: the shipped examples of every format, and their bad variants.

Formats: our CSV, a per-step timing log with --columns, NxD Inference benchmark_report.json files (placed by the
neuron_config.json beside them, or flags), DistServe's profile JSON (taken as the profile).  Every bad input is
exit 2 with the file and, where there is one, the line.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from model import calibrate
from model.base.errors import InputError
from model.calibration.measurements import parse_column_map, parse_measurements
from model.load.profile import load_profile

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "data" / "examples" / "calibrate"
TRUTH = load_profile(REPO / "data" / "profiles" / "opt13b-a100-tp1.toml")  # what the examples were made from
STEP_LOG_COLUMNS = "phase=kind,batch_size=num_seqs,seq_len=padded_len,seconds=elapsed_s"
DISTSERVE = EXAMPLES / "distserve-profile.json"


def run(args: list[str], capsys) -> tuple[int, str, str]:
    """calibrate.main in-process, InputError shown as the command line shows it (exit 2)."""
    try:
        status = calibrate.main([str(a) for a in args])
    except InputError as exc:
        status = 2
        print(f"error: {exc}")
    out = capsys.readouterr()
    return status, out.out, out.err


def reports() -> list[Path]:
    return sorted(EXAMPLES.glob("nxdi/*/benchmark_report.json"))


def test_every_shipped_example_writes_a_profile_near_the_one_it_was_made_from(tmp_path: Path, capsys):
    runs = {"csv": [EXAMPLES / "measurements.csv"],
            "log": [EXAMPLES / "step-log.csv", "--columns", STEP_LOG_COLUMNS],
            "nxdi": reports()}
    for name, args in runs.items():
        out = tmp_path / f"{name}.toml"
        status, text, _ = run([*args, "--out", out], capsys)
        assert status == 0, (name, text)
        got = load_profile(out)
        # d1 (the per-context-token term) dominates decode steps: within 5 % of the source profile in every format
        assert abs(got.decode[1] / TRUTH.decode[1] - 1) < 0.05, (name, got.decode)
        assert abs(got.prefill[1] / TRUTH.prefill[1] - 1) < 0.1, (name, got.prefill)
    assert "ASSUMED: the benchmark's prompt fills the context window" in (tmp_path / "nxdi.toml").read_text()


def test_nxdi_reports_make_one_prefill_and_one_decode_row_each(tmp_path: Path, capsys):
    from model.calibration.inputs import Options, read_inputs

    read = read_inputs(reports(), Options())
    m = read.measurements
    assert read.kinds == ("nxdi",) * 6 and m is not None and len(m) == 12
    first = json.loads(reports()[0].read_text())
    config = json.loads((reports()[0].parent / "neuron_config.json").read_text())["neuron_config"]
    prefill = m.of("prefill")
    assert prefill.ms[0] == first["context_encoding_model"]["latency_ms_p50"]
    assert (prefill.batch_size[0], prefill.seq_len[0]) == (config["batch_size"], config["max_context_length"])
    decode = m.of("decode")
    assert decode.ms[0] == first["token_generation_model"]["latency_ms_avg"]
    assert decode.seq_len[0] == (config["max_context_length"] + config["seq_len"] + 1) // 2


def test_an_nxdi_report_alone_needs_its_settings_and_they_must_match_its_throughput(tmp_path: Path, capsys):
    report = tmp_path / "benchmark_report.json"
    shutil.copy(reports()[0], report)  # b1-ctx512-seq1024, without its neuron_config.json
    status, out, _ = run([report, "--out", tmp_path / "p.toml"], capsys)
    assert status == 2 and "neuron_config.json beside it, or give --batch-size and --seq-len" in out
    status, out, _ = run([report, "--out", tmp_path / "p.toml", "--batch-size", "2", "--seq-len", "1024"], capsys)
    assert status == 2 and f"{report}:" in out and "1024 x 2 = 2048: are they this run's?" in out
    status, out, _ = run([report, "--out", tmp_path / "p.toml", "--batch-size", "1", "--seq-len", "1024"], capsys)
    assert status == 2 and "prefill: 1 usable rows" in out  # one run cannot fit three coefficients
    assert not (tmp_path / "p.toml").exists()


def test_bad_nxdi_reports_name_file_line_and_field(tmp_path: Path, capsys):
    folder = tmp_path / "run"
    shutil.copytree(reports()[0].parent, folder)
    report = folder / "benchmark_report.json"
    good = report.read_text()
    cases = {
        good.replace('"latency_ms_p50": ', '"latency_ms_p50": -', 2): "context_encoding_model.latency_ms_p50",
        good.replace('"latency_ms_avg"', '"latency_ms_mean"'): "latency_ms_avg': missing",
        good.replace("}\n}", "},\n\"e2e_model\": {}\n}"): "duplicate key",
        json.dumps({"e2e_model": {"latency_ms_p50": 3.0}}): "holds only e2e_model",
        json.dumps({"something": 1}): "neither an NxD Inference benchmark report",
        good[:40]: "malformed JSON",
        good.replace("16", "NaN", 1) if "16" in good else "{NaN}": "",
    }
    for text, expected in cases.items():
        report.write_text(text)
        status, out, _ = run([report, "--out", tmp_path / "p.toml"], capsys)
        assert status == 2 and out.startswith(f"error: {report}") and expected in out, (expected, out)
    report.write_text(good)
    (folder / "neuron_config.json").write_text(json.dumps({"neuron_config": {"batch_size": 0, "seq_len": 8}}))
    status, out, _ = run([report, "--out", tmp_path / "p.toml"], capsys)
    assert status == 2 and "neuron_config.json:1: field 'batch_size'" in out


def test_distserve_lists_its_choices_and_maps_the_coefficients_exactly(tmp_path: Path, capsys):
    out = tmp_path / "d.toml"
    status, text, _ = run([DISTSERVE, "--out", out], capsys)
    assert status == 2 and "--model (one of facebook/opt-13b, facebook/opt-175b, facebook/opt-66b)" in text
    status, text, _ = run([DISTSERVE, "--model", "facebook/opt-13b", "--out", out], capsys)
    assert status == 2 and "--tp (one of 1, 2, 4)" in text and not out.exists()
    status, text, _ = run([DISTSERVE, "--model", "facebook/opt-13b", "--tp", "2", "--out", out,
                           "--compile-ms", "15000", "--kv-capacity-tokens", "100000"], capsys)
    assert status == 0, text
    entry = json.loads(DISTSERVE.read_text())["facebook/opt-13b"]["2"]
    got = load_profile(out)
    assert got.prefill == tuple(entry["prefill"]) and got.decode == tuple(entry["decoding_smallbs"])
    assert got.decode_large == tuple(entry["decoding_largebs"])
    assert got.decode_large_from == entry["decoding_large_small_bs_threshold"]
    assert (got.compile_ms, got.kv_capacity_tokens) == (15000.0, 100000)
    assert "ASSUMING a pad token costs what a real token does" in out.read_text()
    status, text, _ = run([DISTSERVE, "--model", "facebook/opt-66b", "--out", out], capsys)
    assert status == 0 and "compile_ms = 20000 ms is ASSUMED" in text  # one TP degree: no --tp needed


def test_distserve_refusals(tmp_path: Path, capsys):
    out = tmp_path / "d.toml"
    status, text, _ = run([DISTSERVE, "--model", "facebook/opt-175b", "--out", out], capsys)
    line = next(i for i, t in enumerate(DISTSERVE.read_text().splitlines(), 1) if "-2.246070807331815" in t) - 3
    assert status == 2 and f"{DISTSERVE}:{line}: field 'facebook/opt-175b.2.decoding_smallbs'" in text
    assert "negative" in text
    for extra, expected in ((["--model", "opt"], "'opt' is not in"), (["--tp", "8", "--model", "facebook/opt-13b"],
                            "'8' is not in"), (["--model", "facebook/opt-66b", "--report", tmp_path / "r"],
                            "--report: a DistServe profile"),
                            (["--model", "facebook/opt-66b", EXAMPLES / "measurements.csv"], "give it alone")):
        status, text, _ = run([DISTSERVE, *extra, "--out", out], capsys)
        assert status == 2 and expected in text, (extra, text)
    status, text, _ = run([EXAMPLES / "measurements.csv", "--tp", "1", "--out", out], capsys)
    assert status == 2 and "--tp: chooses in a DistServe profile" in text
    assert not out.exists()


def test_a_timing_log_needs_its_column_map(tmp_path: Path, capsys):
    log = EXAMPLES / "step-log.csv"
    status, text, _ = run([log, "--out", tmp_path / "p.toml"], capsys)
    assert status == 2 and f"{log}:1: field 'step': unknown column" in text and "--columns" in text
    status, text, _ = run([log, "--columns", STEP_LOG_COLUMNS.replace("num_seqs", "seqs"), "--out",
                           tmp_path / "p.toml"], capsys)
    assert status == 2 and "'seqs': no such column for batch_size" in text and "num_seqs" in text
    m = parse_measurements("k,n,s,t,other\nprompt,2,128,0.5,x\ntoken_generation,4,300,0.02,y\n", "log.csv",
                           parse_column_map("phase=k,batch_size=n,seq_len=s,seconds=t"))
    assert list(m.phase) == ["prefill", "decode"] and list(m.ms) == [500.0, 20.0]
    with pytest.raises(InputError, match=r"log.csv:3: field 'phase': unknown phase 'warmup'"):
        parse_measurements("k,n,s,t\nprompt,2,128,0.5\nwarmup,4,300,0.02\n", "log.csv",
                           parse_column_map("phase=k,batch_size=n,seq_len=s,seconds=t"))
    with pytest.raises(InputError, match=r"log.csv:2: field 'seconds': must be a finite non-negative number"):
        parse_measurements("k,n,s,t\nprompt,2,128,nan\n", "log.csv",
                           parse_column_map("phase=k,batch_size=n,seq_len=s,seconds=t"))


@pytest.mark.parametrize("text,expected", [
    ("phase=k", r"needs batch_size, seq_len, ms \(or seconds\)"), ("phase", "FIELD=COLUMN"),
    ("phase=a,phase=b,batch_size=n,seq_len=s,ms=t", "given twice"), ("lag=x", "unknown field 'lag'"),
    ("phase=k,batch_size=n,seq_len=s,ms=t,seconds=u", "not both")])
def test_bad_column_maps(text: str, expected: str):
    with pytest.raises(InputError, match=expected) as info:
        parse_column_map(text)
    assert info.value.file == "--columns"


def test_a_neuron_config_given_as_input_says_where_it_belongs(tmp_path: Path, capsys):
    config = reports()[0].parent / "neuron_config.json"
    status, text, _ = run([config, "--out", tmp_path / "p.toml"], capsys)
    assert status == 2 and f"{config}:1:" in text and "give the benchmark_report.json beside it" in text


def test_out_over_a_neuron_config_beside_a_report_is_refused(tmp_path: Path, capsys):
    folder = tmp_path / "run"
    shutil.copytree(reports()[0].parent, folder)
    before = (folder / "neuron_config.json").read_bytes()
    status, text, _ = run([folder / "benchmark_report.json", "--out", folder / "neuron_config.json"], capsys)
    assert status == 2 and "is an input of this run" in text
    assert (folder / "neuron_config.json").read_bytes() == before


def test_the_examples_are_what_the_generator_writes(tmp_path: Path):
    """data/examples/calibrate is reproducible: scripts/gen_calibrate_examples.py writes the same bytes."""
    import runpy
    import sys

    argv = sys.argv
    sys.argv = ["gen", "--out", str(tmp_path)]
    try:
        runpy.run_path(str(REPO / "scripts" / "gen_calibrate_examples.py"), run_name="__main__")
    finally:
        sys.argv = argv
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert path.read_bytes() == (EXAMPLES / path.relative_to(tmp_path)).read_bytes(), path
    assert np.isclose(len(list(tmp_path.rglob("*.json"))), 12)
