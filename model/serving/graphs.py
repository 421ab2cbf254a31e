"""Compiled graphs: what a serving stack warms up, in the stack's own notation, and what a config compiles.

On a compile-based stack the unit of warm-up time and memory is the graph, one per
compiled tuple (batch, length[, context]), not the shape: a Gaudi bucket file of 8
lengths crossed with 6 batch sizes is 48 prompt graphs.  Every format states its
graphs here as ``Graph(kind, dims)`` with the stack's own dims (Gaudi's
``(batch, query_len, ctx_blocks)``, NxDI's ``(ctx_batch_size, bucket)``, a TPU token
padding), so a config read back and a plan's graphs compare as plain sets.

``Compiled`` is what reading a config by the stack's rules gives: the graphs it
compiles, the graphs the config lists that the stack drops (a setting filters them),
the prompt lengths (for ``--shapes-from``), the server
settings used and the warnings (deprecated names, names the stack never reads,
filters that could not be applied for want of a setting).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from model.base.numbers import counted
from model.cost.common import GRANULARITY
from model.serving.spec import Given


@dataclass(frozen=True)
class Graph:
    """One compiled graph: its kind ("prompt", "decode", "context", ...) and the stack's dimensions."""

    kind: str
    dims: tuple[int, ...]

    def __str__(self) -> str:
        return f"{self.kind} ({', '.join(map(str, self.dims))})"


@dataclass(frozen=True)
class Dropped:
    """A graph the config lists that the stack does not run, and the setting or rule that says so."""

    graph: Graph
    reason: str


@dataclass(frozen=True)
class Compiled:
    """A config read by its stack's rules.

    ``graphs`` is None when the graphs cannot be counted without a server setting the
    config does not give (``notes`` names it); the lengths may still be known.
    """

    lengths: tuple[Given, ...]  # the prompt lengths the stack compiles, as the file states them
    graphs: tuple[Graph, ...] | None  # sorted, unique: what the stack warms up
    dropped: tuple[Dropped, ...] = ()  # listed, but removed by the stack's filters (never compiled)
    settings: tuple[tuple[str, int], ...] = ()  # the server settings the count used, by name
    notes: tuple[str, ...] = ()  # warnings to show beside the result


KIND_ORDER = ("prompt", "decode", "context", "token-gen", "tokens", "seqs", "shape")  # a step's order


def graph_key(g: Graph) -> tuple[int, str, tuple[int, ...]]:
    """Prompt-side kinds first, then by dimensions (the order every listing shows)."""
    return (KIND_ORDER.index(g.kind) if g.kind in KIND_ORDER else len(KIND_ORDER), g.kind, g.dims)


def graph_set(graphs: Iterable[Graph]) -> tuple[Graph, ...]:
    """Graphs sorted and without repeats (the stacks dedupe their bucket lists the same way)."""
    return tuple(sorted(set(graphs), key=graph_key))


def kinds_text(graphs: Iterable[Graph]) -> str:
    """"7 prompt, 5 decode": how many graphs of each kind, prompt-side kinds first."""
    counts: dict[str, int] = {}
    for g in sorted(graphs, key=graph_key):
        counts[g.kind] = counts.get(g.kind, 0) + 1
    return ", ".join(f"{n} {kind}" for kind, n in counts.items())


def warmup_text(count: int, compile_ms: float | None) -> str:
    """The warm-up estimate: graphs x compile_ms with a device profile, else the count alone (and why)."""
    if compile_ms is None:
        return (f"warm-up: {counted(count, 'graph')} to compile (give --device-profile for the time: "
                "graphs x compile_ms)")
    total = count * compile_ms
    if not math.isfinite(total):
        return f"warm-up: {counted(count, 'graph')} x {compile_ms:g} ms"
    return f"warm-up ~ {total / 1000:.4g} s ({counted(count, 'graph')} x {compile_ms:g} ms compile_ms)"


FREE_BATCH_NOTE = ("without a device profile the plans' cost mode (reference or strict) leaves the batch free, so "
                   "every distinct (batch size, shape) a plan runs counts as its own graph")


def count_text(graphs: tuple[Graph, ...], compile_ms: float | None) -> str:
    """"12 graphs (7 prompt, 5 decode); warm-up ~ ...": the line an export's header and result show."""
    kinds = kinds_text(graphs)
    return (counted(len(graphs), "graph") + (f" ({kinds})" if kinds else "")
            + f"; {warmup_text(len(graphs), compile_ms)}")


@dataclass(frozen=True)
class ShapeImport:
    """The shapes a configuration compiles, rounded up to multiples of 64."""

    shapes: tuple[int, ...]  # sorted, unique, positive multiples of 64
    rounded: tuple[tuple[int, int], ...]  # (given, rounded up) for every given length that moved
    source: str
    compiled: Compiled | None = None  # the graphs the config compiles, its dropped graphs, settings and notes

    def warning(self) -> str | None:
        """The line to show when lengths were rounded up, naming each of them (None if none were)."""
        if not self.rounded:
            return None
        pairs = ", ".join(f"{a} -> {b}" for a, b in self.rounded)
        return f"{self.source}: lengths that are not multiples of {GRANULARITY} rounded up: {pairs}"

    def warnings(self) -> list[str]:
        """Every line to show beside the import: the config's notes, then the rounding."""
        out = list(self.compiled.notes) if self.compiled else []
        if self.warning():
            out.append(self.warning())
        return out

    @property
    def graphs(self) -> tuple[Graph, ...] | None:
        """The graphs the config makes the stack compile (None: not countable without a setting)."""
        return self.compiled.graphs if self.compiled else None
