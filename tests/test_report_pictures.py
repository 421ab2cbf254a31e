"""The report pictures read back: the devices picture and shape list, the replay's SLO marks, the calibration's
decode split (each drawn from a small in-memory result, no planning)."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import numpy as np
from replay_helpers import GAUDI, GAUDI_SERVER, PROFILE, example_trace

from model.calibration.fit import fit_profile
from model.calibration.fit_plots import phase_figure
from model.calibration.synthetic import Grid, synthetic_measurements
from model.cost.serving import ServingCost
from model.deploy.window_devices import LINE_GID, devices_figure, devices_report
from model.evaluation.replay_metrics import Slo, summarize
from model.evaluation.replay_run import replay
from model.load.profile import load_profile
from model.report.devices import DeviceUse
from model.report.serving_plots import latency_figure


def use(planner: str, ms: list[float], shapes: tuple[int, ...]) -> DeviceUse:
    return DeviceUse(planner, 60.0, 0.0, ("b",), np.arange(len(ms)), np.array([ms]), len(ms), shapes)


def test_the_devices_report_lists_every_planner_s_shapes_and_draws_the_chosen_one_on_top(tmp_path):
    uses = [use("mip", [60_000.0, 120_000.0, 30_000.0], (256, 1024)),
            use("pow2", [60_000.0, 180_000.0, 30_000.0], (128, 256, 512, 1024))]
    files = devices_report(tmp_path, uses, "Devices")
    page = files[tmp_path / "report.html"].decode()
    assert "Chosen shapes" in page and "128 256 512 1024" in page and "256 1024" in page
    fig = devices_figure(uses)
    ax = fig.axes[0]
    lines = {line.get_gid(): line for line in ax.get_lines() if line.get_gid()}
    assert lines[LINE_GID + "mip"].get_zorder() > lines[LINE_GID + "pow2"].get_zorder()
    assert lines[LINE_GID + "mip"].get_linestyle() != lines[LINE_GID + "pow2"].get_linestyle()
    fig.savefig(tmp_path / "d.png")
    legend = ax.get_legend()
    assert [t.get_text().split(" ")[0] for t in legend.get_texts()] == ["mip", "pow2"]  # in the planners' order
    renderer = fig.canvas.get_renderer()
    assert legend.get_window_extent(renderer).y1 <= ax.get_window_extent(renderer).y0  # under the data


def test_the_latency_picture_marks_each_slo_and_the_share_within_it():
    trace = example_trace()
    cost = ServingCost(PROFILE)
    result = replay(trace, GAUDI_SERVER, GAUDI, cost, record=True)
    summary = summarize(result, cost, Slo(ttft_ms=100.0, tpot_ms=50.0, quantile=Fraction(95, 100)))
    fig = latency_figure(result, summary)
    for ax, name in zip(fig.axes, ("TTFT", "TPOT"), strict=True):
        marks = [line for line in ax.get_lines() if line.get_gid() == f"slo-{name}"]
        assert len(marks) == 1 and marks[0].get_label().startswith(f"SLO {100 if name == 'TTFT' else 50:g} ms")
        assert "ms, log scale" in ax.get_xlabel()


def test_the_decode_picture_marks_the_split():
    m = synthetic_measurements(PROFILE_FOR_SPLIT, np.random.default_rng(3), repeats=2, grid=SMALL)
    cal = fit_profile(m, split=96)
    fig = phase_figure([f for f in cal.fits if f.phase.startswith("decode")], "decode", 96)
    right = fig.axes[1]
    assert any(list(line.get_xdata()) == [96, 96] for line in right.get_lines())
    assert "batch size" in right.get_xlabel()


SMALL = Grid(prefill_batches=(1, 2, 4), prefill_lengths=(128, 512, 1024), decode_batches=(1, 8, 32, 64, 96, 128,
             192, 256), decode_contexts=(128, 512, 1024))
PROFILE_FOR_SPLIT = load_profile(Path(__file__).resolve().parents[1] / "data" / "profiles" / "opt13b-a100-tp1.toml")
