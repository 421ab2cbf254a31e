"""Long-context benchmark (issue 10's target): prompts log-uniform 1k-128k tokens, gens log-uniform 1-2048.

    python scripts/bench_long.py [--sizes 10000,100000] [--time-limit 30] [--modes reference,strict,device]

For each size and cost model it plans one synthetic bucket (K = 8) with the MIP planner and
prints the whole planner's wall time, the plan's cost, the certified bound and the gap, beside
the pow2 packer's cost.  The targets: each run <= 30 s on 2 cores and gap <= 1%.

Device mode uses the shared OPT-13B/A100 profile with ``kv_capacity_tokens`` raised to 262,144
(an assumption, stated in the output: the one-GPU profile holds 66,144 tokens of KV cache, so a
128k-token prompt fits no batch on it; a multi-GPU tensor-parallel system holds several times
that).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from model import pipeline
from model.cost.model import cost_model, needs_profile
from model.domain.schema import Bucket, Limits, Problem
from model.load.profile import load_profile

PROFILE = Path(__file__).resolve().parents[1] / "data" / "profiles" / "opt13b-a100-tp1.toml"
LONG_KV = 262_144


def long_bucket(n: int, seed: int) -> Bucket:
    """n requests, prompts log-uniform in [1024, 131072], gens log-uniform in [1, 2048] (integers)."""
    rng = np.random.default_rng(seed)
    prompt = np.exp(rng.uniform(np.log(1024), np.log(131072), n)).astype(np.int64)
    gen = np.maximum(1, np.exp(rng.uniform(0, np.log(2048), n))).astype(np.int64)
    ids = np.array([f"L{i}" for i in range(n)], dtype=object)
    return Bucket("long", "<synthetic long-context>", ids, prompt, gen, np.arange(1, n + 1))


def problem_for(bucket: Bucket, mode: str) -> Problem:
    """One bucket, K = 8, no limits, in the given cost model."""
    prof = replace(load_profile(PROFILE), kv_capacity_tokens=LONG_KV) if needs_profile(mode) else None
    return Problem((bucket,), (Limits(),), 8, cost_model(mode, prof))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--time-limit", type=float, default=30.0)
    parser.add_argument("--modes", default="reference,strict,device")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    print(f"long context: prompts log-uniform 1k-128k, gens 1-2048, K = 8, --time-limit {args.time_limit:g}; "
          f"device mode: {PROFILE.name} with kv_capacity_tokens = {LONG_KV:,} (assumed)")
    print(f"  {'n':>8}  {'mode':<9} {'wall s':>7}  {'cost':>11}  {'bound':>11}  {'gap':>7}  {'pow2 / mip':>10}  status")
    for n in (int(x) for x in args.sizes.split(",")):
        bucket = long_bucket(n, args.seed)
        for mode in args.modes.split(","):
            prob = problem_for(bucket, mode)
            t0 = time.perf_counter()
            run = pipeline.run(prob, "mip", time_limit=args.time_limit)
            wall = time.perf_counter() - t0
            rep = run.planned.report
            cost = run.evaluation.total_cost
            pow2 = pipeline.run(prob, "pow2").evaluation.total_cost
            bound = f"{rep.bound:.4e}" if rep.bound is not None else "-"
            gap = f"{rep.gap:.2%}" if rep.gap is not None else "-"
            print(f"  {n:>8,}  {mode:<9} {wall:>7.1f}  {cost:>11.4e}  {bound:>11}  {gap:>7}  {pow2 / cost:>10.3f}  "
                  f"{rep.status.value}{'' if run.evaluation.ok else ' (INVALID)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
