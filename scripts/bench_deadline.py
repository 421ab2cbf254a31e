"""Benchmark: does ``--time-limit`` bound the whole planning run?  Overrun per input and backend.

    python scripts/bench_deadline.py [--limit 5] [--long-limit 20] [--backends highs,cpsat,pulp] [--cases ...]

Cases (each in a fresh process, so a solver left behind by one cannot slow the next):

* ``synth-ref`` / ``synth-strict``: two buckets of 200k synthetic requests (``model.load.synth``'s
  chat and short traffic), no limits, reference / strict cost model;
* ``long``: one bucket of 20k long-context requests (prompts up to 126k tokens), reference
  mode, with ``--long-limit`` (the exact-bound pricing alone ran minutes here);
* ``twin-1``: the workload ``data/workloads/twin-1`` (a copy of the shared one) with its limits.

Per case: load time, planning time (``pipeline.run``: plan, expand, judge -- what
``--time-limit`` bounds), overrun = planning - limit (allowed: 10% of the limit), the
status and the gap.  Loading and writing are outside the limit by definition.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "data"
CASES = ("synth-ref", "synth-strict", "long", "twin-1")
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def long_context_traffic():
    """Chat-like traffic with pasted documents: prompts 20..126,000 tokens, generations up to 4,000."""
    from model.load.synth import Lognormal, Mixture, Traffic

    return Traffic(prefix="l", prompt=Mixture((Lognormal(0.6, 3000.0, 1.0), Lognormal(0.4, 30000.0, 0.8)),
                                              low=20, high=126_000),
                   gen=Mixture((Lognormal(0.8, 150.0, 0.9), Lognormal(0.2, 600.0, 0.5)), low=1, high=4000))


def case_problem(case: str):
    """The Problem of a case, built in memory (no files: loading is not what is measured)."""
    from model.cost.model import cost_model
    from model.domain.schema import Bucket, Limits, Problem
    from model.load.scenario import load_scenario
    from model.load.synth import CHAT, SHORT, bucket_arrays

    def bucket(name, traffic, n, seed):
        ids, p, g = bucket_arrays(np.random.default_rng(seed), traffic, n)
        return Bucket(name, name, ids, p, g, np.arange(1, n + 1))

    if case in ("synth-ref", "synth-strict"):
        buckets = (bucket("chat", CHAT, 200_000, 1), bucket("short", SHORT, 200_000, 2))
        return Problem(buckets, (Limits(), Limits()), 8,
                       cost_model("strict" if case == "synth-strict" else "reference"))
    if case == "long":
        return Problem((bucket("long", long_context_traffic(), 20_000, 9),), (Limits(),), 8)
    if case == "twin-1":
        return load_scenario(DATA / "workloads" / "twin-1" / "scenario.toml").problem()
    raise SystemExit(f"unknown case {case!r} ({', '.join(CASES)})")


def measure(case: str, backend: str, limit: float) -> dict:
    """Load, then plan+expand+judge under the limit; the figures as a dict."""
    from model import pipeline

    t0 = time.perf_counter()
    problem = case_problem(case)
    t1 = time.perf_counter()
    run = pipeline.run(problem, "mip", backend, limit)
    t2 = time.perf_counter()
    rep = run.planned.report
    return {"case": case, "backend": backend, "limit": limit, "requests": sum(len(b) for b in problem.buckets),
            "load_s": t1 - t0, "plan_s": t2 - t1, "overrun_s": t2 - t1 - limit, "status": rep.status.value,
            "gap": rep.gap, "ok": run.evaluation.ok}


def run_case(case: str, backend: str, limit: float, timeout: float = 3600) -> dict:
    """One case in a fresh process."""
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--one", case, backend, str(limit)],
                          capture_output=True, text=True, timeout=timeout, cwd=REPO)
    if done.returncode != 0:
        return {"case": case, "backend": backend, "limit": limit, "error": done.stderr.strip().splitlines()[-1:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--limit", type=float, default=5.0, help="time limit of every case but 'long' (default 5)")
    parser.add_argument("--long-limit", type=float, default=20.0, help="time limit of the 'long' case (default 20)")
    parser.add_argument("--backends", default="highs,cpsat,pulp")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--one", nargs=3, metavar=("CASE", "BACKEND", "LIMIT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        from model.base.runtime import leave

        print(json.dumps(measure(args.one[0], args.one[1], float(args.one[2]))), flush=True)
        leave(0, 5.0)  # a solver left behind must not abort the shutdown
    print(f"{'case':<14}{'backend':<8}{'limit s':>8}{'load s':>8}{'plan s':>8}{'overrun s':>10}  status")
    worst = 0.0
    for case in args.cases.split(","):
        if case == "twin-1" and not (DATA / "workloads" / "twin-1").is_dir():
            print(f"{case:<14}(no {DATA / 'workloads' / 'twin-1'})")
            continue
        for backend in args.backends.split(","):
            r = run_case(case, backend, args.long_limit if case == "long" else args.limit)
            if "error" in r:
                print(f"{case:<14}{backend:<8}{r['limit']:>8.1f}  failed: {' '.join(r['error'])}")
                continue
            worst = max(worst, r["overrun_s"] / r["limit"])
            gap = f", gap {r['gap']:.3%}" if r["gap"] is not None else ""
            print(f"{case:<14}{backend:<8}{r['limit']:>8.1f}{r['load_s']:>8.1f}{r['plan_s']:>8.1f}"
                  f"{r['overrun_s']:>+10.2f}  {r['status']}{gap}{'' if r['ok'] else ', plan NOT ok'}")
    print(f"worst overrun: {worst:+.1%} of the limit (allowed: +10%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
