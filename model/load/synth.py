"""Synthetic request buckets shaped like the shared twin workloads, from a seed.

Used by ``scripts/gen_default.py`` (the embedded default scenario) and
``scripts/bench_load.py`` (a million-request file), so both draw from one
description of "long chat" and "short form" traffic instead of two copies.

The shapes follow the seed scenario of ``shared/cost_model.md``:
- chat: prompts 30..2040 tokens, a mixture of short turns and long pasted
  contexts (the twins' median is ~130 but the 90th percentile ~1,300), and
  long-tailed generations 17..1023;
- short: prompts 36..677 (one lognormal around 150), and a generation cap that
  most clients hit: ~45% of generations are exactly 16 tokens, the rest a long tail.
Everything is vectorised numpy, so a million rows take well under a second.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from model.load.plans import concat_strings, int_strings, joined_text, json_strings


@dataclass(frozen=True)
class Lognormal:
    """One mixture component: a share of the rows, with lognormal(median, sigma) lengths."""

    share: float
    median: float
    sigma: float


@dataclass(frozen=True)
class Mixture:
    """Lengths as a mixture of lognormals, rounded and clipped to [low, high].

    ``fixed`` pins a share of the rows to one exact value (the "max_tokens = 16"
    clients of the short-form bucket).
    """

    parts: tuple[Lognormal, ...]
    low: int
    high: int
    fixed: tuple[float, int] | None = None


@dataclass(frozen=True)
class Traffic:
    """A kind of bucket: how its prompts and generations are distributed, and its id prefix."""

    prefix: str
    prompt: Mixture
    gen: Mixture


CHAT = Traffic(
    prefix="c",
    prompt=Mixture((Lognormal(0.70, 85.0, 0.55), Lognormal(0.30, 900.0, 0.35)), low=30, high=2040),
    gen=Mixture((Lognormal(0.82, 58.0, 0.70), Lognormal(0.18, 330.0, 0.70)), low=17, high=1023),
)
SHORT = Traffic(
    prefix="s",
    prompt=Mixture((Lognormal(1.0, 150.0, 0.60),), low=36, high=677),
    gen=Mixture((Lognormal(0.97, 32.0, 1.10), Lognormal(0.03, 500.0, 0.50)), low=17, high=1023, fixed=(0.45, 16)),
)


def draw(rng: np.random.Generator, mix: Mixture, n: int) -> np.ndarray:
    """n lengths from a mixture, as int64.

    The component of each row is drawn first, then every row's lognormal value, so
    the stream of random numbers does not depend on the component shares.
    """
    shares = np.array([p.share for p in mix.parts], dtype=np.float64)
    part = rng.choice(len(mix.parts), size=n, p=shares / shares.sum())
    median = np.array([p.median for p in mix.parts])[part]
    sigma = np.array([p.sigma for p in mix.parts])[part]
    values = np.clip(np.rint(median * np.exp(sigma * rng.standard_normal(n))), mix.low, mix.high).astype(np.int64)
    if mix.fixed is not None:
        share, value = mix.fixed
        values[rng.random(n) < share] = value
    return values


def bucket_arrays(rng: np.random.Generator, traffic: Traffic, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ids, prompt_len, gen_len) of n requests; ids are ``<prefix>-<row>`` zero-padded to sort in file order."""
    width = max(6, len(str(n - 1)))
    ids = np.char.add(f"{traffic.prefix}-", np.char.zfill(np.arange(n).astype(str), width)).astype(object)
    return ids, draw(rng, traffic.prompt, n), draw(rng, traffic.gen, n)


def requests_jsonl(ids: np.ndarray, prompt_len: np.ndarray, gen_len: np.ndarray) -> str:
    """Request records as JSONL text, in the spelling of the shared workloads, built column-wise."""
    if len(ids) == 0:
        return ""
    return joined_text(concat_strings('{"request_id": ', json_strings(ids), ', "prompt_len": ', int_strings(prompt_len),
                                      ', "gen_len": ', int_strings(gen_len), "}\n"))
