"""Benchmark: load a million-request bucket, then plan, expand and evaluate it.

    python scripts/bench_load.py [--rows 1000000] [--packer cells] [--seed 1]

Writes a synthetic JSONL bucket (chat-like traffic from ``model.load.synth``) into a
temporary folder, then times in one process:
1. ``model.load.load_requests`` beside a plain ``pandas.read_json(lines=True)`` of the
   same file -- the loader validates every field and keeps line numbers, so the
   ratio says what that costs (speed targets are ratios here, never unit tests);
2. one packer (``cells`` by default) + ``model.expand.assemble`` +
   ``model.validate.evaluate_plans`` on the loaded bucket, falling back to a solo
   plan built inline if no packer is registered.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import numpy as np
import pandas as pd

from model.cost.common import align
from model.domain.schema import Batching, Bucket, Limits, Problem
from model.evaluation.validate import evaluate_plans
from model.expand.assemble import assemble
from model.load.requests import load_requests
from model.load.synth import CHAT, bucket_arrays, requests_jsonl

T = TypeVar("T")


def timed(fn: Callable[[], T]) -> tuple[T, float]:
    """fn's result and its wall-clock seconds."""
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def write_bucket(folder: Path, rows: int, seed: int) -> Path:
    """A synthetic JSONL bucket of ``rows`` requests (vectorised end to end)."""
    path = folder / "bench.jsonl"
    path.write_text(requests_jsonl(*bucket_arrays(np.random.default_rng(seed), CHAT, rows)))
    return path


def solo_batching(bucket: Bucket) -> Batching:
    """One request per batch at its own aligned prompt: the fallback when no packer exists."""
    return Batching(np.arange(len(bucket), dtype=np.int64), align(bucket.prompt_len))


def pack(problem: Problem, name: str) -> tuple[Batching, str]:
    """The named packer's batching of the single bucket, or the solo batching if none is registered."""
    from model.packers import PACKERS

    if name in PACKERS:
        return PACKERS[name](problem)[0], name
    if PACKERS:
        raise SystemExit(f"unknown packer {name!r} ({', '.join(PACKERS)})")
    return solo_batching(problem.buckets[0]), "solo (inline fallback: no packer registered)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--packer", default="cells")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        path, t_gen = timed(lambda: write_bucket(Path(tmp), args.rows, args.seed))
        size = path.stat().st_size / 1e6
        print(f"generated {args.rows:,} requests ({size:.1f} MB) in {t_gen:.2f} s")
        bucket, t_load = timed(lambda: load_requests(path))
        frame, t_pandas = timed(lambda: pd.read_json(path, lines=True))
        assert len(frame) == len(bucket) == args.rows
        print(f"load_requests        {t_load:6.2f} s  ({args.rows / t_load / 1e6:.2f} M rows/s)")
        print(f"pandas.read_json     {t_pandas:6.2f} s  (no validation, no line numbers)")
        print(f"ratio load/pandas    {t_load / t_pandas:6.2f}")
    problem = Problem(buckets=(bucket,), limits=(Limits(),), max_shapes=8)
    (batching, used), t_pack = timed(lambda: pack(problem, args.packer))
    plan, t_expand = timed(lambda: assemble(bucket, batching, problem.cost))
    (results, global_problems), t_eval = timed(lambda: evaluate_plans(problem, (plan,)))
    m = results[0].metrics
    print(f"packer {used:<13} {t_pack:6.2f} s  ({m.n_batches:,} batches, shapes {list(m.shapes)})")
    print(f"expand.assemble      {t_expand:6.2f} s")
    print(f"evaluate_plans       {t_eval:6.2f} s  (valid: {results[0].ok and not global_problems}; "
          f"cost {m.cost:.4e}, pad_ratio {m.pad_ratio:.4f})")
    print(f"plan total           {t_pack + t_expand + t_eval:6.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
