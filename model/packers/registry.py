"""Name -> packer function, in the order tables list them (weakest rule first, the strongest last)."""

from __future__ import annotations

from collections.abc import Callable

from model.domain.schema import Batching, Problem
from model.packers import baseline, dpfill, exp, greedy, pow2, solo
from model.packers import per_cell as cells

PACKERS: dict[str, Callable[[Problem], tuple[Batching, ...]]] = {
    "baseline": baseline.pack,
    "solo": solo.pack,
    "cells": cells.pack,
    "pow2": pow2.pack,
    "exp": exp.pack,
    "greedy": greedy.pack,
    "dpfill": dpfill.pack,
}
