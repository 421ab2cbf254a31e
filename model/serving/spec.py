"""The records every serving format shares: lengths read from a file, shapes imported, what an export writes.

Readers return ``Given`` lengths (value and where the file states it, so an error or a
warning can name the line); the registry turns them into a ``ShapeImport``
(``model.serving.graphs``).  Writers take
an ``ExportSpec``: the shapes the plans use, the batch sizes at each and, with requests,
each shape's context.  ``check_spec`` is the one gate before any writer runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from model.base.errors import InputError
from model.cost.common import GRANULARITY
from model.load.requests import MAX_LEN

DEFAULT_BLOCK_SIZE = 128


@dataclass(frozen=True)
class Given:
    """One length as a file states it, and where (so errors and warnings can name it)."""

    value: int
    source: str
    line: int | None
    field: str


@dataclass(frozen=True)
class ShapeUse:
    """How the plans use one shape: the batch sizes declared at it and, with requests, its context.

    ``context`` is the shape plus the longest generation among its batches (tokens,
    not rounded): the longest sequence a decode at this shape reaches.  ``contexts``,
    when given, is the same per batch size (parallel to ``batch_sizes``): each
    (batch size, shape) the plans run is a graph of its own, and its decode graph
    needs only the longest context of those batches.
    """

    shape: int
    batch_sizes: tuple[int, ...] = ()
    context: int | None = None
    contexts: tuple[int, ...] = ()

    def runs(self) -> tuple[tuple[int, int | None], ...]:
        """(batch size, context or None) of every graph the plans run at this shape (batch 1 if none given)."""
        sizes = self.batch_sizes or (1,)
        if self.contexts:
            return tuple(zip(sizes, self.contexts, strict=True))
        return tuple((n, self.context) for n in sizes)


@dataclass(frozen=True)
class ExportSpec:
    """Everything a writer needs, derived from plans (and requests, for the contexts)."""

    uses: tuple[ShapeUse, ...]  # one per shape, sorted by shape
    block_size: int = DEFAULT_BLOCK_SIZE
    max_model_len: int | None = None
    compile_ms: float | None = None  # a device profile's compile time per graph (the warm-up estimate)

    @classmethod
    def of_shapes(cls, shapes, block_size: int = DEFAULT_BLOCK_SIZE,
                  max_model_len: int | None = None) -> ExportSpec:
        """A spec from shapes alone (no batch sizes, no contexts): what a shape list determines."""
        return cls(tuple(ShapeUse(int(s)) for s in sorted(set(shapes))), block_size, max_model_len)

    @property
    def shapes(self) -> tuple[int, ...]:
        return tuple(u.shape for u in self.uses)

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        """Every batch size the plans use, sorted; empty when the spec came from shapes alone."""
        return tuple(sorted({n for u in self.uses for n in u.batch_sizes}))

    @property
    def has_contexts(self) -> bool:
        return bool(self.uses) and all(u.context is not None for u in self.uses)


def align(n: int) -> int:
    """n rounded up to the 64-token granularity (pure int arithmetic)."""
    return -(-n // GRANULARITY) * GRANULARITY


def check_spec(spec: ExportSpec) -> None:
    """Reject a spec no format could write correctly; --max-model-len must hold every sequence."""
    shapes = spec.shapes
    if not shapes:
        raise InputError("<plans>", None, None, "no shapes to export")
    if list(shapes) != sorted(set(shapes)) or any(s <= 0 or s % GRANULARITY or s > MAX_LEN for s in shapes):
        raise InputError("<plans>", None, "shapes", f"must be sorted unique positive multiples of {GRANULARITY}, "
                         f"got {list(shapes)}")
    if spec.block_size < 1 or spec.block_size > MAX_LEN:
        raise InputError("--block-size", None, None, f"must be a positive integer up to {MAX_LEN}, "
                         f"got {spec.block_size}")
    for u in spec.uses:
        if any(n < 1 for n in u.batch_sizes) or (u.context is not None and u.context < u.shape) or (
                u.contexts and (len(u.contexts) != len(u.batch_sizes) or u.context is None
                                or any(not u.shape <= c <= u.context for c in u.contexts))):
            raise InputError("<plans>", None, "uses", f"batch sizes must be positive and the context at least "
                             f"the shape, got {u}")
    if spec.max_model_len is not None:
        longest = max(max(shapes), *(u.context or 0 for u in spec.uses))
        if longest > spec.max_model_len:
            what = "shape" if longest == max(shapes) else "context (shape + longest generation)"
            raise InputError("--max-model-len", None, None,
                             f"{spec.max_model_len} is shorter than the plans' longest {what}, {longest}")


def context_bucket(context: int, spec: ExportSpec) -> int:
    """A context as a token bucket: rounded up to 64 and held under --max-model-len (the rounding must
    not push a bucket past the server's limit)."""
    return min(align(context), spec.max_model_len or MAX_LEN)


def contexts(spec: ExportSpec) -> list[int]:
    """Per-shape context buckets: shape + longest generation, rounded up to 64 and held under
    --max-model-len (the rounding must not push a bucket past the server's limit)."""
    cap = spec.max_model_len or MAX_LEN
    return sorted({min(align(u.context), cap) for u in spec.uses if u.context is not None})
