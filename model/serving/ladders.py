"""vllm-gaudi's bucket ladders: ``lin`` (MIN, doubling up to STEP, then +STEP up to MAX) and ``exp`` spacing.

Pure integer rules shared by the gaudi readers and writers (``model.serving.gaudi``) and
the graph-set reader (``model.serving.graphs``), which crosses them into graphs.
"""

from __future__ import annotations

import math

import numpy as np


def lin_ladder(bmin: int, bstep: int, bmax: int) -> list[int]:
    """vllm-gaudi's ``lin`` rule: start at MIN, double while below STEP, then STEP, 2 STEP, ... up to MAX.

    Values below MIN are dropped, as vllm-gaudi's warmup_range does (bmin >= 1 here).
    Documented example: (2, 32, 64) -> 2, 4, 8, 16, 32, 64.
    """
    ramp = []
    x = bmin
    while x < bstep and x <= bmax:
        ramp.append(x)
        x *= 2
    return [b for b in ramp + list(range(bstep, bmax + 1, bstep)) if b >= bmin]


def lin_count(bmin: int, bstep: int, bmax: int) -> int:
    """How many values lin_ladder would produce, without producing them (to refuse huge ones)."""
    ramp = 0
    x = bmin
    while x < bstep and x <= bmax:
        ramp += 1
        x *= 2
    first = max(bstep, -(-bmin // bstep) * bstep)
    return ramp + (len(range(first, bmax + 1, bstep)) if first <= bmax else 0)


def lin_cover(values: list[int] | tuple[int, ...]) -> tuple[int, int, int]:
    """(MIN, STEP, MAX) of the smallest ``lin`` ladder found that contains every value.

    MIN and MAX are the smallest and largest value; every value on the STEP part is a
    multiple of STEP, so the STEPs worth trying are the divisors of the values.  When an
    exact ladder exists this finds it (its size equals the number of values): a ladder
    made only of doublings is the STEP = MAX case.
    """
    vals = sorted(set(values))
    lo, hi = vals[0], vals[-1]
    best: tuple[int, int] | None = None
    for step in sorted({d for v in vals for d in divisors(v)}):
        if not _lin_covers(vals, lo, step, hi):
            continue
        key = (lin_count(lo, step, hi), -step)
        if best is None or key < best:
            best = key
    assert best is not None  # STEP 1 always covers
    return lo, -best[1], hi


def _lin_covers(vals: list[int], lo: int, step: int, hi: int) -> bool:
    ramp = set()
    x = lo
    while x < step and x <= hi:
        ramp.add(x)
        x *= 2
    return all(v in ramp or (v >= step and v % step == 0) for v in vals)


def divisors(n: int) -> set[int]:
    """Every positive divisor of n (n >= 1; trial division, n is at most 2**20-ish)."""
    out = set()
    for d in range(1, math.isqrt(n) + 1):
        if n % d == 0:
            out.update((d, n // d))
    return out


def exp_ladder(bmin: int, bstep: int, bmax: int, count: int) -> list[int]:
    """vllm-gaudi's ``exp`` spacing: ``count`` points from bmin to bmax on a geometric scale, each
    rounded up to a multiple of bstep, duplicates dropped; the last point is bmax itself (as with
    contiguous PA -- without it vllm-gaudi rounds bmax up to a multiple of bstep).
    """
    if count == 1:
        return [bmax]
    out = set()
    for i in range(count):
        power = bmin * np.float_power(bmax / bmin, (1.0 / float(count - 1)) * i)
        out.add(bmax if i == count - 1 else math.ceil(power / bstep) * bstep)
    return sorted(int(b) for b in out)
