"""Measure ``python -m model.evaluate --engine dask`` on request partitions and a plan dataset already on disk.

    python scripts/bench_dask_judge.py REQS_DIR PLAN_DATASET [--workers 2] [--memory-limit 0] [-- EVALUATE FLAGS]

Starts a LocalCluster of W worker processes (one thread each), runs the evaluator against it in its
own process, and prints its wall time, the command's own peak RSS, each worker's peak RSS (since the
worker started: the cluster is fresh) and the evaluator's last lines.  ``--memory-limit`` is Dask's
per-worker limit (0: none, so the peaks are what the work needs, not what spilling made of it).
"""

from __future__ import annotations

import argparse
import logging
import resource
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_dask import run  # noqa: E402


def worker_rss(client) -> dict[str, float]:
    """Each worker process's current RSS (MiB)."""
    def rss() -> float:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * resource.getpagesize() / 2**20
    return client.run(rss)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("reqs", type=Path)
    ap.add_argument("plan", type=Path)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--memory-limit", default="0", help="Dask's memory limit per worker (0: none)")
    ap.add_argument("flags", nargs="*", help="more model.evaluate flags (after --)")
    args = ap.parse_args()
    from distributed import Client, LocalCluster

    logging.getLogger("distributed").setLevel(logging.CRITICAL)
    with LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True, dashboard_address=None,
                      memory_limit=args.memory_limit, silence_logs=logging.CRITICAL) as cluster, \
            Client(cluster) as client:
        start = client.run(lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
        samples: list[dict[str, float]] = []
        stop = threading.Event()

        def sample() -> None:  # current RSS every second: when the peak came, and how it grew
            while not stop.wait(1.0):
                try:
                    samples.append(worker_rss(client))
                except Exception:  # noqa: BLE001 - the cluster is closing
                    return

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        t0 = time.perf_counter()
        try:
            wall, rss, out = run(["-m", "model.evaluate", "--engine", "dask", "--scheduler", cluster.scheduler_address,
                                  str(args.reqs), str(args.plan), *args.flags])
        finally:
            stop.set()
            sampler.join()
        peaks = client.run(lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    print("\n".join(out.strip().splitlines()[-12:]))
    print(f"model.evaluate --engine dask {args.reqs} {args.plan}: wall {wall:.1f} s "
          f"(with the cluster {time.perf_counter() - t0:.1f} s); command peak RSS {rss:.0f} MiB")
    for w in sorted(peaks):
        seen = max((s.get(w, 0.0) for s in samples), default=0.0)
        print(f"  worker {w}: peak RSS {peaks[w]:.0f} MiB (at start {start.get(w, 0.0):.0f} MiB, "
              f"largest sampled each second {seen:.0f} MiB)")


if __name__ == "__main__":
    main()
