"""The solver contract's model: a mixed-integer linear program as arrays, with named column and row blocks.

The planner's formulation (``model.formulation.arrays``) builds one of these once; every
backend only translates it.  It knows nothing of buckets, shapes or costs: a block is a
named range of columns or rows, so a caller can read solutions and duals by meaning.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, eq=False)
class Block:
    """A named range of columns or rows, so solutions and duals can be read by meaning."""

    name: str
    start: int
    stop: int
    bucket: int = -1
    scale: float = 1.0  # rows: the block was multiplied by this (duals of the original rows = dual * scale)

    def slice(self) -> slice:
        return slice(self.start, self.stop)



@dataclass(frozen=True, eq=False)
class MipArrays:
    """A mixed-integer linear program: min c.x, row_lo <= A x <= row_hi, lb <= x <= ub.

    A is in coordinate form (rows, cols, vals); backends convert as they need.
    """

    c: np.ndarray
    lb: np.ndarray
    ub: np.ndarray
    integer: np.ndarray  # bool per column
    rows: np.ndarray
    cols: np.ndarray
    vals: np.ndarray
    row_lo: np.ndarray
    row_hi: np.ndarray
    col_blocks: tuple[Block, ...]
    row_blocks: tuple[Block, ...]
    offset: float = 0.0
    scale: float = 1.0  # objective was divided by this (numerics); multiply back

    @property
    def n_cols(self) -> int:
        return len(self.c)

    @property
    def n_rows(self) -> int:
        return len(self.row_lo)

    def block(self, kind: str, name: str, bucket: int = -1) -> Block | None:
        blocks = self.col_blocks if kind == "col" else self.row_blocks
        for b in blocks:
            if b.name == name and b.bucket == bucket:
                return b
        return None
