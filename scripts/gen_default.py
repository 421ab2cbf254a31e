"""Generate the embedded default scenario: data/default/{scenario.toml, requests_*.jsonl}.

    python scripts/gen_default.py            # rewrites data/default/ (deterministic)
    python scripts/gen_default.py --check    # also fails unless the greedy packer meets the limits

Two buckets of 800 requests in the spirit of ``shared/workloads/twin-*`` (see
``model/load/synth.py`` for the distributions), K = 8 shapes across both, and per-bucket
limits derived from the one-request-per-batch ("solo") plan the way the twins'
limits relate to theirs:

| limit | chat | short | why |
|---|---|---|---|
| max_sequential_ms | 0.80 x solo | 0.65 x solo | the binding one: batching must save 20% / 35% of serial time |
| max_pad_ratio | 1.12 x solo | 1.13 x solo | solo's pad is the floor (see below), so this is a tight padding budget |
| max_cost | 0.975 x solo | 0.965 x solo | fewer batches and compiled shapes must pay for the extra decode padding |
| max_p95_latency_ms | 1.04 x solo | 1.09 x solo | merging may lengthen the slowest requests only a little |

Why the pad limit sits ABOVE solo and not below it: in reference mode a member's
prompt pad is ``align(prompt_len) - prompt_len`` whatever batch it rides in, and
generation pad is zero only when it rides alone, so the solo plan has the smallest
pad_ratio of any plan -- a pad limit below it would be infeasible.  Numbers are
rounded to three significant figures (pad ratios to four decimals), as in the twins.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from model.cost.common import align
from model.cost.metrics import Metrics, plan_metrics
from model.load.synth import CHAT, SHORT, Traffic, bucket_arrays, requests_jsonl

SEED = 20240807  # any fixed seed: the committed files are what this seed draws
N_REQUESTS = 800
MAX_SHAPES = 8
OUT = Path(__file__).resolve().parent.parent / "data" / "default"


@dataclass(frozen=True)
class Factors:
    """Each limit as a multiple of the solo plan's metric."""

    cost: float
    pad_ratio: float
    p95_latency_ms: float
    sequential_ms: float


@dataclass(frozen=True)
class BucketSpec:
    """One bucket of the default scenario: its name, traffic kind and limit factors."""

    name: str
    traffic: Traffic
    factors: Factors


BUCKETS = (
    BucketSpec("chat", CHAT, Factors(cost=0.975, pad_ratio=1.12, p95_latency_ms=1.04, sequential_ms=0.80)),
    BucketSpec("short", SHORT, Factors(cost=0.965, pad_ratio=1.13, p95_latency_ms=1.09, sequential_ms=0.65)),
)


def solo_metrics(prompt_len: np.ndarray, gen_len: np.ndarray) -> Metrics:
    """Reference metrics of one request per batch, each at its own aligned prompt (no shape cap)."""
    return plan_metrics(prompt_len, gen_len, np.arange(len(prompt_len)).astype(str), align(prompt_len))


def sig3(x: float) -> float:
    """x to three significant figures (limits are budgets, not measurements)."""
    return float(f"{x:.3g}")


def limits_from(solo: Metrics, f: Factors) -> dict[str, float]:
    """The four scenario limits of a bucket, scaled from its solo plan."""
    return {
        "max_cost": sig3(solo.cost * f.cost),
        "max_pad_ratio": round(solo.pad_ratio * f.pad_ratio, 4),
        "max_p95_latency_ms": sig3(solo.p95_latency_ms * f.p95_latency_ms),
        "max_sequential_ms": sig3(solo.sequential_ms * f.sequential_ms),
    }


def toml_number(x: float) -> str:
    """A limit as TOML: integers plainly, large numbers in exponent form like the twins."""
    if x >= 1e7:
        return f"{x:.3g}".replace("e+0", "e+")
    return str(int(x)) if float(x).is_integer() else repr(x)


def scenario_toml(buckets: list[tuple[str, str, dict[str, float]]]) -> str:
    """The scenario file: a header comment, the shape cap, one [[bucket]] table each."""
    out = [
        "# Embedded default scenario, written by scripts/gen_default.py (seed "
        f"{SEED}); do not edit by hand.",
        "# Two buckets planned together; every limit is \"<=\" on reference-mode metrics.",
        f"# At most {MAX_SHAPES} distinct shapes across both buckets.",
        f"max_shapes = {MAX_SHAPES}",
    ]
    for name, requests, limits in buckets:
        out += ["", "[[bucket]]", f'name = "{name}"', f'requests = "{requests}"']
        out += [f"{key} = {toml_number(value)}" for key, value in limits.items()]
    return "\n".join(out) + "\n"


def generate(out: Path, seed: int = SEED) -> list[tuple[str, str, dict[str, float]]]:
    """Draw both buckets, write their JSONL files and the scenario; return what was written."""
    rng = np.random.default_rng(seed)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for spec in BUCKETS:
        ids, prompt, gen = bucket_arrays(rng, spec.traffic, N_REQUESTS)
        requests = f"requests_{spec.name}.jsonl"
        (out / requests).write_text(requests_jsonl(ids, prompt, gen))
        written.append((spec.name, requests, limits_from(solo_metrics(prompt, gen), spec.factors)))
    (out / "scenario.toml").write_text(scenario_toml(written))
    return written


def greedy_meets_limits(scenario: Path) -> bool:
    """Whether the greedy packer's plan meets every limit (the twins' feasibility witness)."""
    from model import pipeline
    from model.evaluation.validate import evaluate_plans
    from model.load.scenario import load_scenario

    problem = load_scenario(scenario).problem()
    results, global_problems = evaluate_plans(problem, pipeline.expand(problem, pipeline.plan(problem, "greedy")))
    for r in results:
        for c in r.checks:
            print(f"  greedy {r.name:<6} {c.metric:<15} {c.value:14.6g} <= {c.limit:<12.6g} {'ok' if c.ok else 'NO'}")
    return all(r.ok for r in results) and not global_problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=OUT, help=f"folder to write (default {OUT})")
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--check", action="store_true", help="fail unless the greedy packer meets every limit")
    args = parser.parse_args(argv)
    for name, requests, limits in generate(args.out, args.seed):
        print(f"{name}: {args.out / requests}; " + ", ".join(f"{k} {v:g}" for k, v in limits.items()))
    if args.check and not greedy_meets_limits(args.out / "scenario.toml"):
        print("greedy packer does not meet the limits", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
