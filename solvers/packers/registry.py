"""Name -> packer function, in the order tables list them (weakest rule first, greedy last)."""

from __future__ import annotations

from collections.abc import Callable

from model.schema import Batching, Problem
from solvers.packers import baseline, cells, exp, greedy, pow2, solo

PACKERS: dict[str, Callable[[Problem], tuple[Batching, ...]]] = {
    "baseline": baseline.pack,
    "solo": solo.pack,
    "cells": cells.pack,
    "pow2": pow2.pack,
    "exp": exp.pack,
    "greedy": greedy.pack,
}
