"""Benchmark the Dask engine against the in-memory one on synthetic chat traffic.

    python scripts/bench_dask.py [--n 100000] [--parts 8] [--workers 2] [--time-limit 20] [--solver mip] [--dir D]

Draws N chat requests (``model.load.synth.CHAT``), writes them as P Parquet partitions and as one
Parquet file, then runs ``model.solve`` and ``model.evaluate`` with both engines, each command line
in its own process.  The Dask runs join a LocalCluster of W worker processes started here (restarted
before each command, so each peak is that command's).  Printed per engine and step: wall time, the
command's own peak RSS, each worker's peak RSS, and the cost per request; then whether the two plans
have the same records.  Not meant above 10^6 requests on a 2-core machine.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from model.load.synth import CHAT, bucket_arrays  # noqa: E402


def run(argv: list[str]) -> tuple[float, float, str]:
    """A command line in its own process: wall seconds, its own peak RSS (MiB) and its stdout (exit 0 checked)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, *argv], stdout=out, stderr=err, text=True, cwd=REPO)
        _, status, usage = os.wait4(proc.pid, 0)  # the child's own rusage (Linux: ru_maxrss in KiB)
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - t0
        out.seek(0)
        err.seek(0)
        text = out.read()
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} exited {proc.returncode}:\n{text[-1000:]}{err.read()[-2000:]}")
    return wall, usage.ru_maxrss / 1024, text


def worker_peaks(client) -> list[float]:
    """Each worker process's peak RSS (MiB) since it started."""
    peaks = client.run(lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    return [round(v, 1) for _, v in sorted(peaks.items())]


def cost_of(stdout: str) -> float:
    m = re.search(r"^total: cost ([0-9.e+-]+)", stdout, re.M)
    return float(m.group(1)) if m else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--parts", type=int, default=8)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--time-limit", type=float, default=20.0)
    ap.add_argument("--solver", default="mip")
    ap.add_argument("--limit-shapes", type=int, default=8)
    ap.add_argument("--dir", type=Path, default=None, help="working folder (default: a temporary one)")
    args = ap.parse_args()
    if args.n > 1_000_000:
        raise SystemExit("at most 10^6 requests here (2 shared cores)")
    from distributed import Client, LocalCluster

    work = args.dir or Path(tempfile.mkdtemp(prefix="bench_dask."))
    reqs, whole = work / "reqs", work / "whole" / "reqs.parquet"
    reqs.mkdir(parents=True, exist_ok=True)
    whole.parent.mkdir(parents=True, exist_ok=True)
    ids, prompt, gen = bucket_arrays(np.random.default_rng(0), CHAT, args.n)
    frame = pd.DataFrame({"request_id": ids.astype(str), "prompt_len": prompt, "gen_len": gen})
    for p, idx in enumerate(np.array_split(np.arange(args.n), args.parts)):
        frame.iloc[idx].to_parquet(reqs / f"part-{p:05d}.parquet", index=False)
    frame.to_parquet(whole, index=False)
    common = ["--limit-shapes", str(args.limit_shapes)]
    solve = ["-m", "model.solve", "--quiet", "--solver", args.solver, "--time-limit", str(args.time_limit), *common]
    print(f"{args.n} chat requests, {args.parts} partitions, {args.workers} dask workers, solver {args.solver}, "
          f"time limit {args.time_limit:g} s, K = {args.limit_shapes}; folder {work}")
    rows = []
    wall, rss, out = run([*solve, str(whole), "--out", str(work / "mem")])
    rows.append(("memory", "solve", wall, rss, [], cost_of(out) / args.n))
    wall, rss, out = run(["-m", "model.evaluate", str(whole), str(work / "mem" / "plan_reqs.jsonl"), *common])
    rows.append(("memory", "evaluate", wall, rss, [], float("nan")))
    logging.getLogger("distributed").setLevel(logging.CRITICAL)
    with LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True, dashboard_address=None,
                      silence_logs=logging.CRITICAL) as cluster, Client(cluster) as client:
        wall, rss, out = run([*solve, "--engine", "dask", "--scheduler", cluster.scheduler_address, str(reqs),
                              "--out", str(work / "dsk")])
        rows.append(("dask", "solve", wall, rss, worker_peaks(client), cost_of(out) / args.n))
        client.restart()
        wall, rss, out = run(["-m", "model.evaluate", "--engine", "dask", "--scheduler", cluster.scheduler_address,
                            str(reqs), str(work / "dsk" / "plan_reqs"), *common])
        rows.append(("dask", "evaluate", wall, rss, worker_peaks(client), float("nan")))
    print(f"{'engine':8} {'step':9} {'wall s':>8} {'command peak MiB':>17}  {'worker peaks MiB':18} "
          f"{'cost/request':>13}")
    for engine, step, wall, rss, workers, per in rows:
        print(f"{engine:8} {step:9} {wall:8.1f} {rss:17.0f}  {str(workers):18} {per:13.6g}")
    mem = pd.read_json(work / "mem" / "plan_reqs.jsonl", lines=True, dtype={"request_id": str, "batch_id": str})
    mem["seq_align"] = mem["shape"].map(lambda s: s["seq_align"])
    dsk = pd.concat([pq.read_table(f).to_pandas() for f in sorted((work / "dsk" / "plan_reqs").glob("*.parquet"))])
    key = ["request_id", "batch_id", "seq_align"]
    a = mem[key].astype({"request_id": str}).sort_values("request_id", ignore_index=True)
    b = dsk[key].astype({"request_id": str}).sort_values("request_id", ignore_index=True)
    print(f"plans identical (request_id, batch_id, seq_align): {'yes' if a.equals(b) else 'NO'}")


if __name__ == "__main__":
    main()
