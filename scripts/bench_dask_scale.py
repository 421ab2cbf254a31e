"""The Dask engine at scale: plan from the histogram, write, judge -- against the in-memory engine on a sample.

    python scripts/bench_dask_scale.py REQS_DIR SAMPLE_FILE OUT_DIR [--workers 2] [--time-limit 60] [--k 8]

REQS_DIR holds the request partitions (e.g. 10^8 chat requests as 64 Parquet files), SAMPLE_FILE a
sample of the same mix small enough for memory (e.g. 10^6 requests).  Runs, each command line in its
own process: ``model.solve --engine dask --plan-from histogram`` and ``model.evaluate --engine dask``
against one LocalCluster of W worker processes (one thread each, no memory limit, restarted before
each command so each peak is that command's), then ``model.solve`` in memory on the sample.  Prints
wall time, the command's own peak RSS and each worker's peak RSS per step, the cost per request of
both plans and their ratio (the target: within 0.5 %), and the evaluator's verdict.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_dask import cost_of, run, worker_peaks  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("reqs", type=Path)
    ap.add_argument("sample", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--k", type=int, default=8)
    args = ap.parse_args()
    from distributed import Client, LocalCluster

    common = ["--limit-shapes", str(args.k), "--quiet"]
    rows = []
    logging.getLogger("distributed").setLevel(logging.CRITICAL)
    with LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True, dashboard_address=None,
                      memory_limit=0, silence_logs=logging.CRITICAL) as cluster, Client(cluster) as client:
        wall, rss, out = run(["-m", "model.solve", "--engine", "dask", "--scheduler", cluster.scheduler_address,
                              "--plan-from", "histogram", "--time-limit", str(args.time_limit), str(args.reqs),
                              "--out", str(args.out / "dask"), *common])
        rows.append(("dask solve", wall, rss, worker_peaks(client)))
        solve_out = out
        client.restart()
        name = args.reqs.name
        wall, rss, judged = run(["-m", "model.evaluate", "--engine", "dask", "--scheduler", cluster.scheduler_address,
                                 str(args.reqs), str(args.out / "dask" / f"plan_{name}"), *common[:2]])
        rows.append(("dask evaluate", wall, rss, worker_peaks(client)))
    manifest = json.loads((args.out / "dask" / f"plan_{name}" / "manifest.json").read_text())
    n = manifest["n_requests"]
    wall, rss, mem_out = run(["-m", "model.solve", "--time-limit", str(args.time_limit), str(args.sample),
                              "--out", str(args.out / "sample"), *common])
    rows.append(("memory solve (sample)", wall, rss, []))
    found = re.search(r"^input: .*?(\d+) requests", mem_out, re.M)
    n_sample = int(found.group(1)) if found else None
    print(f"{'step':22} {'wall s':>8} {'command peak MiB':>17}  worker peaks MiB")
    for step, wall, rss, peaks in rows:
        print(f"{step:22} {wall:8.1f} {rss:17.0f}  {peaks}")
    dask_per = manifest["metrics"]["cost"] / n
    mem_per = cost_of(mem_out) / n_sample if n_sample else float("nan")
    print(f"dask: {n} requests, {manifest['n_batches']} batches, shapes {manifest['shapes']}, gap "
          f"{manifest['solver']['gap']:.4%}; cost per request {dask_per:.6g}")
    print(f"memory (sample): {n_sample} requests; cost per request {mem_per:.6g}; ratio dask / sample "
          f"{dask_per / mem_per:.5f}")
    print("evaluate verdict:", next((line for line in judged.splitlines() if line.startswith(("OK", "FAIL"))),
                                    judged.strip().splitlines()[-1]))
    print("solve log tail:", *solve_out.strip().splitlines()[-4:], sep="\n  ")


if __name__ == "__main__":
    main()
