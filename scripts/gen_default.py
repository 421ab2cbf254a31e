"""Generate the embedded default scenario: data/default/{scenario.toml, reference.toml, device.toml, requests_*.jsonl}.

    python scripts/gen_default.py            # rewrites data/default/ (deterministic)
    python scripts/gen_default.py --check    # also fails unless a packer meets every limit of both scenarios

Two buckets of 800 requests in the spirit of ``data/workloads/twin-*`` (see
``model/load/synth.py`` for the distributions), K = 8 shapes across both.

``scenario.toml`` (what ``python -m model.solve`` plans with no input) prices plans
in device mode with ``device.toml``, a copy of the shared OPT-13B / A100 profile: a
decode step is shared by the whole batch, the KV cache bounds a batch, and each
compiled shape costs 20 s, so the number of shapes K is a real trade-off.  Its one
limit per bucket is the P95 latency: 1.2 x the solo plan's (every request alone at
its capped shape, which meets it, so the scenario is feasible), which keeps batches
from growing until they are slow.

``reference.toml`` is the seed's contract: the same requests with per-bucket limits
on reference-mode metrics, derived from the solo plan the way the twins' limits
relate to theirs:

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
ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "data" / "default"
PROFILE = ROOT / "data" / "profiles" / "opt13b-a100-tp1.toml"
DEVICE_P95_FACTOR = 1.2  # device scenario: P95 limit as a multiple of the solo plan's P95


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


def scenario_toml(buckets: list[tuple[str, str, dict[str, float]]], header: list[str]) -> str:
    """A scenario file: a header comment and settings, one [[bucket]] table each."""
    out = [f"# Embedded default scenario, written by scripts/gen_default.py (seed {SEED}); do not edit by hand.",
           *header]
    for name, requests, limits in buckets:
        out += ["", "[[bucket]]", f'name = "{name}"', f'requests = "{requests}"']
        out += [f"{key} = {toml_number(value)}" for key, value in limits.items()]
    return "\n".join(out) + "\n"


REFERENCE_HEADER = [
    "# Two buckets planned together; every limit is \"<=\" on reference-mode metrics.",
    f"# At most {MAX_SHAPES} distinct shapes across both buckets.",
    f"max_shapes = {MAX_SHAPES}",
]
DEVICE_HEADER = [
    "# Two buckets planned together in device mode (device.toml: OPT-13B on one A100, 20 s per compiled shape).",
    f"# At most {MAX_SHAPES} distinct shapes across both buckets; each bucket's P95 latency limit is "
    f"{DEVICE_P95_FACTOR} x its solo plan's.",
    f"max_shapes = {MAX_SHAPES}",
    'mode = "device"',
    'device = "device.toml"',
]


def device_limits(prompt: np.ndarray, gen: np.ndarray, profile, shapes: np.ndarray) -> dict[str, float]:
    """The device scenario's limit: P95 latency, DEVICE_P95_FACTOR x the solo plan's (at the capped shapes)."""
    solo = plan_metrics(prompt, gen, np.arange(len(prompt)).astype(str), shapes, profile, "device")
    return {"max_p95_latency_ms": sig3(solo.p95_latency_ms * DEVICE_P95_FACTOR)}


def generate(out: Path, seed: int = SEED) -> list[tuple[str, str, dict[str, float]]]:
    """Draw both buckets, write their JSONL files, both scenarios and the profile; return the reference limits."""
    from model.load.profile import load_profile
    from model.packers.shapecap import representatives, round_up

    rng = np.random.default_rng(seed)
    out.mkdir(parents=True, exist_ok=True)
    drawn = []
    for spec in BUCKETS:
        ids, prompt, gen = bucket_arrays(rng, spec.traffic, N_REQUESTS)
        requests = f"requests_{spec.name}.jsonl"
        (out / requests).write_text(requests_jsonl(ids, prompt, gen))
        drawn.append((spec, requests, prompt, gen))
    written = [(s.name, r, limits_from(solo_metrics(p, g), s.factors)) for s, r, p, g in drawn]
    (out / "reference.toml").write_text(scenario_toml(written, REFERENCE_HEADER))
    (out / "device.toml").write_text(PROFILE.read_text())
    profile = load_profile(out / "device.toml")
    reps = representatives(np.concatenate([align(p) for _, _, p, _ in drawn]), MAX_SHAPES)
    device = [(s.name, r, device_limits(p, g, profile, round_up(align(p), reps))) for s, r, p, g in drawn]
    (out / "scenario.toml").write_text(scenario_toml(device, DEVICE_HEADER))
    return written


def packer_meets_limits(scenario: Path, packer: str = "greedy") -> bool:
    """Whether a packer's plan meets every limit of a scenario (its feasibility witness: greedy for the
    reference scenario, as for the twins; solo for the device scenario)."""
    from model import pipeline
    from model.evaluation.validate import evaluate_plans
    from model.load.scenario import load_scenario

    problem = load_scenario(scenario).problem()
    results, global_problems = evaluate_plans(problem, pipeline.expand(problem, pipeline.plan(problem, packer)))
    for r in results:
        for c in r.checks:
            print(f"  {packer} {r.name:<6} {c.metric:<15} {c.value:14.6g} <= {c.limit:<12.6g} {'ok' if c.ok else 'NO'}")
    return all(r.ok for r in results) and not global_problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=OUT, help=f"folder to write (default {OUT})")
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--check", action="store_true", help="fail unless the greedy packer meets every limit")
    args = parser.parse_args(argv)
    for name, requests, limits in generate(args.out, args.seed):
        print(f"{name}: {args.out / requests}; " + ", ".join(f"{k} {v:g}" for k, v in limits.items()))
    if args.check and not (packer_meets_limits(args.out / "reference.toml", "greedy")
                           and packer_meets_limits(args.out / "scenario.toml", "solo")):
        print("a scenario's witness packer does not meet its limits", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
