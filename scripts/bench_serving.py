"""Benchmark: the planned serving graph set against vllm-gaudi's default ``exp`` buckets (issue 20's targets).

    python scripts/bench_serving.py [--traces code conv] [--limit-graphs 24] [--most-replicas 8]

On the Azure code and conversation traces (``data/traces``, arrival times from
``TIMESTAMP``), the shared OPT-13B / A100 profile (``data/profiles/opt13b-a100-tp1.toml``)
and ``[server] stack = "gaudi", max_num_seqs = 128, max_num_batched_tokens = 16384,
block_size = 128``:

- the default: the ``exp`` strategy as vllm-gaudi generates it for these settings
  (``model.serving.gaudi_read``: max_model_len 16384, the KV pool's 516 blocks,
  VLLM_PROMPT_BS_BUCKET_MAX = max_num_seqs; 181 graphs, 60 of them prefix-cache graphs
  that warm up and never run here), replayed with the stack's prefill cap;
- two replica counts: 1 (one device; both sets queue, the busy time is what the targets
  compare) and the capacity count: the fewest replicas at which the default meets TTFT
  p95 <= 2 s and TPOT p95 <= 200 ms, or, when it never does up to ``--most-replicas``, the
  fewest (1, 2, 4, ... then halving back) at which a planned set does;
- the plan at each count: ``model.serveplan.plan`` at ``--limit-graphs`` with SLOs = the
  default's own TTFT and TPOT p95 at that count (the target "no worse than the default" as
  a hard limit), and at the capacity count also the 2 s / 200 ms objectives.

Prints run-time compiles, warm-up graphs, busy device-hours and TTFT/TPOT p95 of both,
and checks the targets: no run-time compile in the plan, busy at most the default's on
conv and at least 60 % below it on code, TTFT and TPOT p95 no worse than the default's.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from model.base.runtime import Deadline  # noqa: E402
from model.cost.serving import ServingCost  # noqa: E402
from model.domain.server import ServerSettings  # noqa: E402
from model.evaluation.replay_metrics import Slo, summarize  # noqa: E402
from model.evaluation.replay_run import replay, trace_of  # noqa: E402
from model.load.profile import load_profile_file  # noqa: E402
from model.load.requests import Columns, load_requests  # noqa: E402
from model.serveplan.plan import PlanSpec, plan  # noqa: E402
from model.serving.replay_graphs import read_graph_set  # noqa: E402
from model.serving.settings import parse_flag  # noqa: E402

PROFILE = REPO / "data" / "profiles" / "opt13b-a100-tp1.toml"
TRACES = {name: REPO / "data" / "traces" / f"AzureLLMInferenceTrace_{name}.csv" for name in ("code", "conv")}
SETTINGS = ServerSettings(stack="gaudi", max_num_seqs=128, max_num_batched_tokens=16384, block_size=128)
SLO = Slo(ttft_ms=2000.0, tpot_ms=200.0)
CUT = {"code": 0.60, "conv": 0.0}  # busy time at least this share below the default's


def default_exp(kv_capacity_tokens: int):
    """vllm-gaudi's default exp graphs for SETTINGS, counted by the stack's rules."""
    blocks = kv_capacity_tokens // SETTINGS.block_size
    with tempfile.TemporaryDirectory() as folder:
        env = Path(folder) / "exp.env"
        env.write_text("VLLM_BUCKETING_STRATEGY=exp\n")
        extra = parse_flag(f"max_model_len={SETTINGS.max_num_batched_tokens},num_gpu_blocks_override={blocks},"
                           f"prompt_bs_bucket_max={SETTINGS.max_num_seqs}")
        return read_graph_set(env, "gaudi-env", SETTINGS, "bench", extra).graphs


def default_capacity(trace, default, cost, most: int):
    """The fewest replicas at which the default meets both SLOs (None if it never does up to ``most``)."""
    for r in range(1, most + 1):
        s = summarize(replay(trace, SETTINGS, default, cost, r), cost, SLO)
        if s.slo.ttft_met and s.slo.tpot_met:
            return r
    return None


def planned_capacity(trace, cost, limit_graphs: int, most: int, time_limit: float):
    """The fewest replicas (doubling, then bisection) at which a planned set meets both SLOs (quick plans: no
    slowdown levels), or None."""
    quick = dict(slowdowns=(None,))

    def meets(r: int) -> bool:
        got = plan(trace, PlanSpec(SETTINGS, limit_graphs, SLO, r, **quick), cost, Deadline.after(time_limit))
        print(f"    capacity search: {r} replicas: {'met' if got.best else 'missed'}", flush=True)
        return got.best is not None

    lo, hi = 0, 1
    while hi <= most and not meets(hi):
        lo, hi = hi, hi * 2
    if hi > most:
        return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if meets(mid) else (mid, hi)
    return hi


def row(name: str, what: str, replicas: int, s) -> str:
    """One line of the table."""
    return (f"| {name} | {what} | {replicas} | {s.graphs} | {len(s.runtime_compiles)} | {s.busy_device_hours:.4f} | "
            f"{s.ttft.p95:.0f} | {s.tpot.p95:.1f} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--traces", nargs="+", choices=tuple(TRACES), default=list(TRACES))
    parser.add_argument("--limit-graphs", type=int, default=24)
    parser.add_argument("--most-replicas", type=int, default=8)
    parser.add_argument("--time-limit", type=float, default=900.0, help="seconds for one plan")
    args = parser.parse_args()
    profile, _ = load_profile_file(PROFILE)
    cost = ServingCost(profile)
    default = default_exp(profile.kv_capacity_tokens)
    lines = ["| trace | graph set | replicas | warm-up graphs | run-time compiles | busy device-hours | TTFT p95 ms "
             "| TPOT p95 ms |", "|---|---|---|---|---|---|---|---|"]
    ok = True
    for name in args.traces:
        trace = trace_of([load_requests(TRACES[name], name, Columns.parse("azure"))])
        capacity = default_capacity(trace, default, cost, args.most_replicas)
        if capacity is None:
            capacity = planned_capacity(trace, cost, args.limit_graphs, args.most_replicas, args.time_limit)
        print(f"{name}: capacity count {capacity}", flush=True)
        for replicas in sorted({1, capacity or args.most_replicas}):
            base = summarize(replay(trace, SETTINGS, default, cost, replicas), cost, SLO)
            slo = Slo(base.ttft.p95, base.tpot.p95)
            if replicas == capacity:
                slo = Slo(min(base.ttft.p95, SLO.ttft_ms), min(base.tpot.p95, SLO.tpot_ms))
            t0 = time.perf_counter()
            result = plan(trace, PlanSpec(SETTINGS, args.limit_graphs, slo, replicas), cost,
                          Deadline.after(args.time_limit))
            print(f"{name}, {replicas} replicas: planned in {time.perf_counter() - t0:.1f} s: " + "; ".join(
                f"cap {a.cap} slowdown {a.slowdown}: {'accepted' if a.accepted else a.reason}"
                + (f" ({a.summary.busy_device_hours:.4f} h)" if a.summary else "") for a in result.attempts),
                flush=True)
            lines.append(row(name, f"default exp ({default.count})", replicas, base))
            if result.best is None:
                lines.append(f"| {name} | planned | {replicas} | no set met the default's p95s |")
                ok = False
                continue
            best = result.best.summary
            lines.append(row(name, f"planned (cap {result.best.cap}, slowdown {result.best.slowdown})", replicas,
                             best))
            cut = 1 - best.busy_ms / base.busy_ms
            checks = {"no run-time compile": not best.runtime_compiles,
                      f"busy {cut:.1%} below the default (target >= {CUT[name]:.0%})": cut >= CUT[name],
                      "TTFT p95 no worse": best.ttft.p95 <= base.ttft.p95,
                      "TPOT p95 no worse": best.tpot.p95 <= base.tpot.p95}
            for text, good in checks.items():
                print(f"  {name}, {replicas} replicas: {text}: {'met' if good else 'MISSED'}")
                ok &= good
            print(f"  planned set {result.best.graphs.prompt} {result.best.graphs.decode}", flush=True)
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
