"""A seeded long-context conversation workload (Mooncake-like) and a TP4-like device profile whose KV cache binds.

No long-context trace ships with the project, so ``scripts/bench.py``'s long-context section
draws one: prompts a mixture of lognormals around 6k and 20k tokens (clipped to 128..128k),
gens lognormal around 250 (1..2048), arrivals a Poisson stream over an hour -- the
proportions of the public Mooncake conversation trace (mean input about 12k tokens, mean
output a few hundred), not its rows.

The profile is an assumption, said in the bench's output: the shared OPT-13B / A100 TP1 fit
with every step-time coefficient divided by ``TP_SPEEDUP`` (four-way tensor parallelism does
not scale perfectly) and a KV cache of ``TP4_KV_TOKENS`` tokens (four 80 GB devices, the
model's weights split four ways, about 0.8 MB of KV per token), so a batch of 8k-token
prompts holds a few dozen members: the KV capacity, not the batch-size cap, sets batch sizes.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from model.cost.device import DeviceProfile
from model.domain.schema import Bucket
from model.load.profile import load_profile
from model.load.synth import Lognormal, Mixture, Traffic, bucket_arrays

PROFILE = Path(__file__).resolve().parents[1] / "data" / "profiles" / "opt13b-a100-tp1.toml"
TP_SPEEDUP = 3.0
TP4_KV_TOKENS = 320_000
HOUR_S = 3600.0

MOONCAKE_LIKE = Traffic(
    prefix="m",
    prompt=Mixture((Lognormal(0.6, 6000.0, 0.8), Lognormal(0.4, 20000.0, 0.6)), low=128, high=128_000),
    gen=Mixture((Lognormal(1.0, 250.0, 0.9),), low=1, high=2048),
)


def long_context_bucket(n: int, seed: int, name: str = "long") -> Bucket:
    """n Mooncake-like requests (see the module docstring), arrivals over an hour, from ``seed``."""
    rng = np.random.default_rng(seed)
    ids, prompt, gen = bucket_arrays(rng, MOONCAKE_LIKE, n)
    arrival = np.sort(rng.uniform(0.0, HOUR_S, n))
    return Bucket(name, f"<synthetic Mooncake-like, seed {seed}>", ids, prompt, gen, np.arange(1, n + 1), arrival)


def tp4_profile(base: Path = PROFILE) -> DeviceProfile:
    """The TP1 profile sped up ``TP_SPEEDUP`` times with a ``TP4_KV_TOKENS`` KV cache (an assumption)."""
    p = load_profile(base)

    def faster(coeffs):
        return None if coeffs is None else tuple(c / TP_SPEEDUP for c in coeffs)

    return replace(p, name=f"{p.name}, TP4-like (step times / {TP_SPEEDUP:g}, KV {TP4_KV_TOKENS:,} tokens; assumed)",
                   prefill=faster(p.prefill), decode=faster(p.decode), decode_large=faster(p.decode_large),
                   kv_capacity_tokens=TP4_KV_TOKENS)
