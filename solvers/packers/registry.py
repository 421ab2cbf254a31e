"""Name -> packer function, in the order tables list them (weakest rule first, the strongest last)."""

from __future__ import annotations

from collections.abc import Callable

from model.schema import Batching, Problem
from solvers.packers import baseline, cells, dpfill, exp, greedy, pow2, solo

PACKERS: dict[str, Callable[[Problem], tuple[Batching, ...]]] = {
    "baseline": baseline.pack,
    "solo": solo.pack,
    "cells": cells.pack,
    "pow2": pow2.pack,
    "exp": exp.pack,
    "greedy": greedy.pack,
    "dpfill": dpfill.pack,
}
