"""A fixed set of allowed shapes (``Problem.allowed_shapes``): parsing, the fit check, rounding up.

A serving stack that is already deployed compiles a known list of sequence lengths;
planning "under today's shapes" means every batch must declare one of them.  The MIP
(``model.planning.stages``), every packer (``model.packers.shapecap``) and the
evaluator (``model.evaluation.validate``) all read the set through ``usable`` here, so
"which shapes may a plan declare" has one answer.  The shape cap K still applies on
top: a plan uses at most K of the allowed shapes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from model.base.errors import InfeasibleError, InputError
from model.base.numbers import integer_text
from model.cost.common import GRANULARITY, align
from model.domain.schema import Problem

MAX_SHAPE = 1 << 20  # the longest request length accepted (model.load.requests.MAX_LEN): a larger shape is a typo


def checked(values: Iterable[int], source: str = "--shapes") -> tuple[int, ...]:
    """Sorted distinct shapes, each a positive multiple of 64 (an InputError naming the first that is not)."""
    out = set()
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < GRANULARITY or v % GRANULARITY \
                or v > MAX_SHAPE:
            raise InputError(source, None, None,
                             f"a shape must be a positive multiple of {GRANULARITY} (at most {MAX_SHAPE}), got {v!r}")
        out.add(int(v))
    if not out:
        raise InputError(source, None, None, "no shapes given")
    return tuple(sorted(out))


def parse_shapes(text: str, source: str = "--shapes") -> tuple[int, ...]:
    """``--shapes 128,256,512``: comma-separated positive multiples of 64; an empty element is an error."""
    tokens = text.split(",")
    values = []
    for token in tokens:
        token = token.strip()
        if not token:
            raise InputError(source, None, None, f"expected shapes like 128,256,512, got an empty element in {text!r}")
        value = integer_text(token)
        if value is None:
            raise InputError(source, None, None, f"expected shapes like 128,256,512 (integers), got {token!r}")
        values.append(value)
    return checked(values, source)


def usable(problem: Problem) -> np.ndarray | None:
    """The allowed shapes a plan of this problem may declare (those within ``max_seq_len``), or None (free)."""
    if problem.allowed_shapes is None:
        return None
    shapes = np.asarray(sorted(problem.allowed_shapes), dtype=np.int64)
    if problem.max_seq_len is not None:
        shapes = shapes[shapes <= problem.max_seq_len]
    return shapes


def round_up_to(values, allowed: np.ndarray) -> np.ndarray:
    """Each value replaced by the smallest allowed shape >= it (every value must be <= the largest)."""
    values = np.asarray(values, dtype=np.int64)
    return allowed[np.searchsorted(allowed, values, side="left")]


def check_fits(problem: Problem) -> None:
    """Every aligned prompt must fit the largest usable allowed shape; else an InputError naming the
    first request (file:line) that does not, with how many do not and the longest prompt."""
    allowed = usable(problem)
    if allowed is None:
        return
    top = int(allowed[-1]) if len(allowed) else 0
    dropped = (f" (shapes above max_seq_len {problem.max_seq_len} left out)"
               if len(allowed) < len(problem.allowed_shapes) else "")
    for b in problem.buckets:
        over = align(b.prompt_len) > top
        if over.any():
            k = int(over.argmax())
            raise InputError(b.source, int(b.lines[k]), "prompt_len",
                             f"{int(b.prompt_len[k])} (aligned {int(align(b.prompt_len[k]))}) does not fit the "
                             f"largest allowed shape {top}{dropped}: {int(over.sum())} request(s) of this file do "
                             f"not, the longest prompt is {int(b.prompt_len.max())}")


def outside(shapes: Iterable[int], problem: Problem) -> list[int]:
    """The shapes among ``shapes`` that the problem's allowed set does not contain (empty when free)."""
    if problem.allowed_shapes is None:
        return []
    allowed = set(problem.allowed_shapes)
    return sorted({int(s) for s in shapes} - allowed)


def check_kv_fits(problem: Problem) -> None:
    """Under a KV capacity every request must fit a batch of its own at the smallest shape it may declare
    (its aligned prompt, or the smallest usable allowed shape covering it): ``shape + gen_len <= capacity``,
    or with compiled batch sizes its smallest graph's ``B1 * (shape + gen_len)``.  Else no plan holds it,
    whatever the planner -- InfeasibleError (a proof), naming the first such request, its line, and how many
    do not fit."""
    capacity = problem.cost.kv_capacity
    if capacity is None:
        return
    for b in problem.buckets:
        if not len(b):
            continue
        shape = round_up_to(align(b.prompt_len), usable(problem)) if problem.allowed_shapes is not None \
            else align(b.prompt_len)
        over = ~problem.cost.batch_fits(1, shape, b.gen_len)
        if over.any():
            k = int(over.argmax())
            rows = int(problem.cost.graph_batch(1))
            held = f"{rows} x ({int(shape[k])} + gen_len {int(b.gen_len[k])})" if rows > 1 else \
                f"{int(shape[k])} + gen_len {int(b.gen_len[k])}"
            raise InfeasibleError(
                f"bucket {b.name}: request {b.request_ids[k]!r} ({b.source}:{int(b.lines[k])}) does not fit one "
                f"batch at its smallest shape {int(shape[k])}: {held} KV tokens > the KV capacity {capacity} "
                f"({int(over.sum())} request(s) of this bucket do not fit); no plan can hold it")


@dataclass(frozen=True)
class ShapeCover:
    """The fewest distinct shapes any plan must declare (``count``), with its certificate: ``count`` requests
    (flat indices over the buckets in order) whose shape ranges ``ranges`` (smallest, largest shape it may run
    at) are pairwise disjoint, so no shape serves two of them."""

    count: int
    requests: tuple[int, ...]
    ranges: tuple[tuple[int, int], ...]


def distinct(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(values, return_inverse=True)`` for nonnegative lengths, by a count table where they are at
    most MAX_SHAPE (every loaded length is): O(n), where the sort took 2 s on 10^7 requests."""
    if not len(values) or int(values.min()) < 0 or int(values.max()) > MAX_SHAPE:
        return np.unique(values, return_inverse=True)
    present = np.bincount(values) > 0
    rank = np.cumsum(present) - 1
    return np.flatnonzero(present), rank[values]


def shapes_needed(problem: Problem) -> ShapeCover:
    """The fewest shapes every plan needs under a KV capacity (1 without one; 0 with no request).

    A request may run at any declared shape from its smallest (``check_kv_fits``) up to the largest at which
    it still fits one batch alone (``batch_fits`` is monotone in the shape), so each request is an interval
    of shapes and the shapes declared must stab every interval; the greedy by right end finds the fewest
    (the classic interval-stabbing argument), and the requests that open a new shape have pairwise disjoint
    intervals (each starts above the last one's end).  Shapes above the longest aligned prompt stab nothing
    more.  A request's range depends on its prompt and gen alone, so both ends are found per distinct value,
    and the greedy runs over the right ends, each group's largest left end deciding (no sort of the requests:
    10^7 of them took 27 s that way)."""
    lens = [align(b.prompt_len) for b in problem.buckets if len(b)]
    if problem.cost.kv_capacity is None or not lens:
        return ShapeCover(1 if lens else 0, (), ())
    allowed = usable(problem)
    prompts, of_prompt = distinct(np.concatenate(lens))
    grid = allowed if allowed is not None else np.arange(GRANULARITY, int(prompts.max()) + 1, GRANULARITY)
    left = np.searchsorted(grid, prompts, side="left")[of_prompt]
    gens, of_gen = distinct(np.concatenate([b.gen_len for b in problem.buckets if len(b)]))
    lo, hi = np.zeros(len(gens), dtype=np.int64), np.full(len(gens), len(grid) - 1)  # the answer is in [lo, hi]
    while (lo < hi).any():  # the largest grid index each gen fits at (0 where none: check_kv_fits' case)
        mid = (lo + hi + 1) // 2
        fit = problem.cost.batch_fits(1, grid[mid], gens)
        lo, hi = np.where(fit, mid, lo), np.where(fit, hi, mid - 1)
    right = np.maximum(lo[of_gen], left)  # a request fits its own smallest shape (check_kv_fits)
    widest = np.full(len(grid), -1)
    np.maximum.at(widest, right, left)  # per right end, the largest left end among its requests
    last, opened = -1, []
    for r in np.flatnonzero(widest >= 0).tolist():
        if widest[r] > last:  # not stabbed by the last shape: a new one at this right end
            last = r
            opened.append(r)
    ends = np.asarray(opened, dtype=np.int64)
    is_end = np.zeros(len(grid), dtype=bool)
    is_end[ends] = True
    hits = np.flatnonzero(is_end[right] & (left == widest[right]))  # requests that opened a shape, file order
    firsts = hits[np.unique(right[hits], return_index=True)[1]]  # one per opened right end, by right end
    return ShapeCover(len(opened), tuple(int(k) for k in firsts),
                      tuple((int(grid[left[k]]), int(grid[right[k]])) for k in firsts))


SHOWN = 4  # requests of the certificate named in the message


def check_shape_cover(problem: Problem) -> None:
    """Under a KV capacity a short prompt with a long gen may fit its own shape only, so the shapes a plan may
    declare (at most K, and at most the graph cap: each shape runs a graph) may not reach every request:
    InfeasibleError (a proof, ``shapes_needed``) naming requests no shape can serve two of."""
    if problem.cost.kv_capacity is None:
        return
    cap_graphs = problem.graph_cap
    cap = problem.max_shapes if cap_graphs is None else min(problem.max_shapes, cap_graphs)
    cover = shapes_needed(problem)
    if cover.count <= max(cap, 1):  # no shape at all is the caps' own check (``pipeline.check_graph_cap``)
        return
    rows = [(bk, k) for bk in problem.buckets for k in range(len(bk))]

    def named(j: int, span: tuple[int, int]) -> str:
        bk, k = rows[j]
        return (f"{bk.request_ids[k]!r} ({bk.source}:{int(bk.lines[k])}, prompt {int(bk.prompt_len[k])}, gen "
                f"{int(bk.gen_len[k])}: shapes {span[0]}..{span[1]})")

    shown = ", ".join(named(j, span) for j, span in zip(cover.requests[:SHOWN], cover.ranges[:SHOWN], strict=True))
    more = f" and {cover.count - SHOWN} more" if cover.count > SHOWN else ""
    which = f"the cap K = {problem.max_shapes}" if cap == problem.max_shapes else f"the graph cap {cap}"
    raise InfeasibleError(
        f"under the KV capacity {problem.cost.kv_capacity} tokens every plan declares at least {cover.count} "
        f"shapes, more than {which}: no shape serves two of the requests {shown}{more} (a request runs at a "
        "shape from its own up to the largest it fits alone)")
