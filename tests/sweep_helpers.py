"""Tiny inputs shared by the sweep, plot and report tests: scenarios on disk and hand-built sweep rows."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from model.domain.schema import Bucket, Limits, Problem
from model.sweeping.runner import SweepRow

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def tiny_bucket(name: str, n: int, seed: int) -> Bucket:
    """n requests with prompts 20..700 and generations 8..300, drawn from a fixed seed."""
    rng = np.random.default_rng(seed)
    return Bucket(name, f"<{name}>", np.array([f"{name}-{i}" for i in range(n)], dtype=object),
                  rng.integers(20, 700, n), rng.integers(8, 300, n), np.arange(1, n + 1))


def tiny_problem(k: int = 3, limits: Limits = Limits(), n: int = 30) -> Problem:
    """Two tiny buckets under the same limits."""
    buckets = (tiny_bucket("a", n, 1), tiny_bucket("b", n, 2))
    return Problem(buckets, (limits, limits), k)


def write_scenario(folder: Path, limits: dict[str, float] | None = None, n: int = 30, k: int = 3) -> Path:
    """The tiny problem as request files and a scenario.toml in folder; returns the scenario path."""
    lines = [f"max_shapes = {k}"]
    for b in tiny_problem(n=n).buckets:
        (folder / f"{b.name}.jsonl").write_text("".join(
            f'{{"request_id": "{i}", "prompt_len": {p}, "gen_len": {g}}}\n'
            for i, p, g in zip(b.request_ids, b.prompt_len, b.gen_len, strict=True)))
        lines += ["", "[[bucket]]", f'name = "{b.name}"', f'requests = "{b.name}.jsonl"']
        lines += [f"{key} = {value!r}" for key, value in (limits or {}).items()]
    path = folder / "scenario.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


BASE_ROW = SweepRow(
    k=1, sweep_limit="", factor=1.0, limit_value=None, bucket="a", planner="mip", status="optimal",
    cost=100.0, prefill_cost=10.0, decode_cost=70.0, overhead_cost=15.0, compile_cost=5.0, pad_ratio=0.1,
    p95_latency_ms=1000.0, sequential_ms=5000.0, n_batches=4, shapes="128", max_cost=None, max_pad_ratio=None,
    max_p95_latency_ms=None, max_sequential_ms=None, limits_met=True, broken="", bound=99.0, gap=0.01,
    ratio_to_mip=1.0, total_cost=200.0, total_bound=198.0, total_gap=0.01, total_ratio_to_mip=1.0, solve_s=0.1,
    wall_s=0.1, source="", note="")


def row(**changes) -> SweepRow:
    """A sweep row with a few fields changed (defaults: K=1, bucket a, the MIP, cost 100)."""
    return replace(BASE_ROW, **changes)


def grid_rows(costs: dict[str, list[float]], buckets: tuple[str, ...] = ("a", "b"), broken: tuple[str, ...] = (),
              factors: tuple[float, ...] = (1.0,), limit: str = "") -> list[SweepRow]:
    """Rows for planners x K (1..len(costs)) x factors x buckets; each bucket costs half the planner's total.

    ``costs[planner][k-1]`` is the total at K; the breakdown is 10/70/15/5 percent of it; a
    planner in ``broken`` breaks a limit everywhere; the MIP's bound is 1% under its cost.
    """
    out = []
    for f in factors:
        for k in range(1, len(next(iter(costs.values()))) + 1):
            mip_total = costs["mip"][k - 1] / f if "mip" in costs else None
            for planner, series in costs.items():
                total = series[k - 1] / f
                ok = planner not in broken
                for b in buckets:
                    c = total / len(buckets)
                    out.append(row(k=k, factor=f, sweep_limit=limit, bucket=b, planner=planner,
                                   status="optimal" if planner == "mip" else "heuristic",
                                   cost=c, prefill_cost=0.1 * c, decode_cost=0.7 * c, overhead_cost=0.15 * c,
                                   compile_cost=0.05 * c, sequential_ms=1000.0 * f,
                                   max_sequential_ms=1000.0 * f if limit else None,
                                   limit_value=1000.0 * f if limit else None, limits_met=ok,
                                   broken="" if ok else "sequential_ms",
                                   bound=0.99 * c if planner == "mip" else None, total_cost=total,
                                   total_bound=0.99 * total if planner == "mip" else None,
                                   ratio_to_mip=total / mip_total if mip_total else None,
                                   total_ratio_to_mip=total / mip_total if mip_total else None,
                                   shapes=" ".join(str(64 * (i + 1)) for i in range(k))))
    return out
