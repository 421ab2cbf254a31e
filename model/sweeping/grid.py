"""The sweep's grid: shape caps and factors on one limit, parsed, ordered and applied to a loaded problem."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from model.base.errors import InputError
from model.base.numbers import decimal_text, integer_text
from model.domain.schema import LIMIT_KEYS, Limits, Problem
from model.load.scenario import MAX_SHAPES


@dataclass(frozen=True, order=True)
class SweepPoint:
    """One grid point: a shape cap and a scale factor on one limit (1.0 and no limit when not sweeping).

    Ordered by (factor, k) so iterating points in order visits every tighter
    neighbour of a point before the point itself.
    """

    factor: float
    k: int
    limit: str = ""

    def label(self) -> str:
        """Short human label used in notes and tables."""
        return f"K={self.k}" + (f", {self.limit} x{self.factor:g}" if self.limit else "")


def parse_ks(spec: str, most: int = MAX_SHAPES) -> tuple[int, ...]:
    """``--k``: "1-16", "2,4,8" or a mix ("1-4,8"), as sorted distinct integers from 1 to ``most``.

    An empty spec (``--k=``) is an error, not the default; a K above ``most`` is refused before
    any range is built, so ``1-10**18`` costs nothing.
    """
    ks: set[int] = set()
    for part in (p.strip() for p in spec.split(",")):
        lo, dash, hi = part.partition("-")
        a, b = integer_text(lo), integer_text(hi if dash else lo)
        if a is None or b is None:
            raise InputError("--k", None, None, f"expected K values like 1-16 or 2,4,8, got {spec!r}")
        if a < 1 or b < a:
            raise InputError("--k", None, None, f"expected positive K values in increasing ranges, got {part!r}")
        if b > most:
            raise InputError("--k", None, None, f"K must be at most {most}, got {b}")
        ks.update(range(a, b + 1))
    return tuple(sorted(ks))


def useful_ks(ks: Sequence[int], distinct: int) -> tuple[tuple[int, ...], str | None]:
    """The Ks worth solving: no plan uses more shapes than there are distinct aligned prompt lengths,
    so every K above that count gives the same plans as the count itself.  Returns the capped Ks
    and a one-line note saying what was dropped (None when nothing was)."""
    kept = tuple(k for k in ks if k <= distinct)
    if len(kept) == len(ks):
        return tuple(ks), None
    if distinct not in kept:
        kept = (*kept, distinct)
    dropped = [k for k in ks if k > distinct]
    if dropped == list(range(dropped[0], dropped[-1] + 1)):
        shown = f"K = {dropped[0]}" + (f"..{dropped[-1]}" if len(dropped) > 1 else "")
    else:
        shown = "K = " + ", ".join(map(str, dropped[:6])) + (", ..." if len(dropped) > 6 else "")
    return kept, (f"note: K capped at {distinct}: the input has {distinct} distinct aligned prompt lengths, "
                  f"so no plan can use more shapes ({shown} not swept)")


def parse_factors(spec: str) -> tuple[float, ...]:
    """``--factors``: comma-separated positive scale factors, sorted (tightest first)."""
    values = {decimal_text(p.strip()) for p in spec.split(",") if p.strip()}
    if None in values:
        raise InputError("--factors", None, None, f"expected numbers like 0.8,0.9,1.0, got {spec!r}")
    if not values or any(not (v > 0 and math.isfinite(v)) for v in values):
        raise InputError("--factors", None, None, f"expected positive numbers, got {spec!r}")
    return tuple(sorted(values))


def sweep_points(ks: Sequence[int], limit: str = "", factors: Sequence[float] = (1.0,)) -> tuple[SweepPoint, ...]:
    """The grid in solving order: factor ascending, then K ascending (tighter points first)."""
    return tuple(sorted(SweepPoint(float(f), int(k), limit) for f in (factors if limit else (1.0,)) for k in ks))


def check_sweep_limit(problem: Problem, limit: str) -> None:
    """A swept limit must be a known limit set on at least one bucket (scaling "unset" means nothing)."""
    if limit not in LIMIT_KEYS:
        raise InputError("--sweep-limit", None, None, f"expected one of {', '.join(LIMIT_KEYS)}, got {limit!r}")
    if all(getattr(lim, limit) is None for lim in problem.limits):
        raise InputError("--sweep-limit", None, None,
                         f"no bucket sets {limit}; give it in the scenario or as --{limit.replace('_', '-')}")


def scaled_limits(limits: Limits, limit: str, factor: float) -> Limits:
    """A bucket's limits with one of them multiplied by factor (left unset when unset)."""
    value = getattr(limits, limit) if limit else None
    return limits if value is None else replace(limits, **{limit: value * factor})


def point_problem(base: Problem, point: SweepPoint) -> Problem:
    """The loaded problem at a grid point: same buckets, another shape cap, one limit scaled."""
    problem = base.with_shapes(point.k)
    if not point.limit:
        return problem
    return replace(problem, limits=tuple(scaled_limits(lim, point.limit, point.factor) for lim in problem.limits))


def tighter_neighbours(point: SweepPoint, ks: Sequence[int], factors: Sequence[float]) -> list[SweepPoint]:
    """The points just below this one on each axis: their plans are valid here."""
    out = []
    i = ks.index(point.k)
    if i > 0:
        out.append(replace(point, k=ks[i - 1]))
    if point.limit:
        j = factors.index(point.factor)
        if j > 0:
            out.append(replace(point, factor=factors[j - 1]))
    return out


def base_factor(points: Iterable[SweepPoint]) -> float:
    """The factor a recommendation is made at: 1.0 (the limits as given) or the one closest to it."""
    return min({p.factor for p in points}, key=lambda f: (abs(math.log(f)), f))


@dataclass(frozen=True)
class SweepSettings:
    """What a sweep was asked to do, recorded so a report can say how its numbers were made."""

    source: str
    mode: str
    ks: tuple[int, ...]
    sweep_limit: str
    factors: tuple[float, ...]
    solvers: tuple[str, ...]
    backend: str
    time_limit: float
    tolerance: float = 0.005
    bind_threshold: float = 0.01
