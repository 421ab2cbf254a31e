"""The graphs the MIP may open: a grid made from the recorded demands, inside what the stack accepts.

Lengths come from the demands' quantiles weighted by steps x step time (the lengths where
the time is) and a geometric ladder over their range (so a rare slow tail has graphs near it),
rounded up to a small granularity so that two replays whose demands differ by a few
tokens give the same grid and the loop can settle; the largest demand is always in.
Batches are powers of two up to the largest the family can need, plus that one.  Only
graphs the stack keeps are candidates (``shared/serving-configs.md``): a gaudi prompt
graph with batch x length over ``max_num_batched_tokens`` is dropped at start-up, a
decode graph with more rows than blocks is dropped and one over batch x blocks-per-
sequence is capped, so a plan with one would not be the server that runs.  The MIP is
then optimal over THESE candidates, which the report says.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from model.cost.serving import ServingCost
from model.domain.server import Graph, GraphSet, ServerSettings
from model.serveplan.cover import Family
from model.serveplan.demands import Demands

PROMPT_STEP = 32  # tokens: a prompt length's grid (the stack's own run-time rounding base)
DECODE_STEP = 2  # KV blocks (gaudi) of a decode graph's grid
NXDI_DECODE_STEP = 32  # tokens of an nxdi token-generation bucket's grid
LENGTHS = 24  # time-weighted quantile points per family
RATIO = 1.25  # and a geometric ladder of lengths, each this much above the one before


@dataclass(frozen=True)
class Grid:
    """How fine the candidate grid is (points per family and their rounding)."""

    lengths: int = LENGTHS
    prompt_step: int = PROMPT_STEP
    decode_step: int = DECODE_STEP
    nxdi_decode_step: int = NXDI_DECODE_STEP


def _round_up(x: np.ndarray, step: int) -> np.ndarray:
    return -(-x // step) * step


def length_grid(cells: np.ndarray, points: int, step: int, top: int | None = None,
                weight_ms: np.ndarray | None = None, ratio: float = RATIO) -> list[int]:
    """Lengths where the time is: quantiles of the demands' lengths weighted by steps x step time (``weight_ms``,
    per demand; steps alone without it), and a geometric ladder (``ratio``) from the shortest to the longest
    demand so a rare, long and slow tail (2 % of prompts past 4k on conv, each 3x slower on a 14k graph) has
    graphs near it; all rounded up to ``step``, at most ``top``."""
    if not len(cells):
        return []
    order = np.argsort(cells[:, 1], kind="stable")
    w = cells[:, 2].astype(float) * (1.0 if weight_ms is None else weight_ms)
    x, w = cells[order, 1], w[order] + 1e-9  # 0-step demands still count a little
    cum = np.cumsum(w) / w.sum()
    levels = (np.arange(1, points + 1)) / points
    picked = x[np.minimum(np.searchsorted(cum, levels - 1e-12), len(x) - 1)]
    ladder, v = [], float(max(1, x.min()))
    while v < x.max():
        ladder.append(v)
        v *= ratio
    values = _round_up(np.ceil(np.concatenate([picked, ladder, [x.max()]])).astype(np.int64), step)
    if top is not None:
        values = np.minimum(values, top)
    return sorted({int(v) for v in values})


def batch_grid(most: int) -> list[int]:
    """Powers of two below ``most``, and ``most``."""
    out, b = [], 1
    while b < most:
        out.append(b)
        b *= 2
    return out + [most]


def _tight(cells: np.ndarray, grid: set[Graph], step: int, most) -> set[Graph]:
    """Candidates for the demands no grid graph covers though a graph the stack keeps could: (n, x rounded up to
    ``step`` but at most ``most(n, x)``), the demand's own batch, so that only demands no kept graph can cover
    (a prompt batch whose n*s passes the token budget) are left uncovered."""
    if not len(cells):
        return set()
    cand = np.asarray(sorted(grid), dtype=np.int64).reshape(-1, 2)
    covered = ((cand[None, :, 0] >= cells[:, None, 0]) & (cand[None, :, 1] >= cells[:, None, 1])).any(axis=1)
    out = set()
    for n, x, _ in cells[~covered].tolist():
        top = most(n, x)
        if x <= top:
            out.add((n, min(-(-x // step) * step, top)))
    return out


def gaudi_families(demands: Demands, settings: ServerSettings, cost: ServingCost, cap: int, longest: int,
                   grid: Grid = Grid(), slowdown: float | None = None) -> tuple[Family, Family]:
    """gaudi's prompt candidates (B <= cap, B*S within the token budget) and decode candidates (B <= NB <= B *
    blocks of the longest request), each with its step time."""
    budget, bs = settings.max_num_batched_tokens, settings.block_size
    exact_p = np.array([cost.prompt_ms(n, x) for n, x, _ in demands.prompt.tolist()])
    exact_d = np.array([cost.decode_ms(n, x * bs) for n, x, _ in demands.decode.tolist()])
    lengths = length_grid(demands.prompt, grid.lengths, grid.prompt_step, budget, exact_p)
    prompt = {(b, s) for b in batch_grid(cap) for s in lengths if b * s <= budget}
    prompt = sorted(prompt | _tight(demands.prompt, prompt, grid.prompt_step, lambda n, x: budget // n))
    top_n = int(demands.decode[:, 0].max()) if len(demands.decode) else 1
    per_seq = -(-longest // bs)
    blocks = length_grid(demands.decode, grid.lengths, grid.decode_step, None, exact_d)
    decode_b = sorted({*batch_grid(settings.max_num_seqs), top_n})
    decode = {(b, nb) for b in decode_b for nb in blocks if b <= nb <= b * per_seq}
    decode = sorted(decode | _tight(demands.decode, decode, grid.decode_step, lambda n, x: n * per_seq))
    return (Family("prompt", tuple(prompt), np.array([cost.prompt_ms(*g) for g in prompt]), demands.prompt,
                   exact_p, slowdown),
            Family("decode", tuple(decode), np.array([cost.decode_ms(b, nb * bs) for b, nb in decode]),
                   demands.decode, exact_d, slowdown))


def nxdi_families(demands: Demands, settings: ServerSettings, cost: ServingCost,
                  grid: Grid = Grid(), slowdown: float | None = None) -> tuple[Family, Family]:
    """nxdi's context buckets (at ctx_batch_size) and token-generation buckets (at max_num_seqs), as pairs whose
    batch is 1 so the shared lookup (first covering pair) is nxdi's smallest covering bucket."""
    m, c = settings.max_num_seqs, settings.ctx_batch_size
    exact_p = np.array([cost.prompt_ms(c, x) for _, x, _ in demands.prompt.tolist()])
    exact_d = np.array([cost.decode_ms(m, m * x) for _, x, _ in demands.decode.tolist()])
    context = length_grid(demands.prompt, grid.lengths, grid.prompt_step, None, exact_p)
    tkg = length_grid(demands.decode, grid.lengths, grid.nxdi_decode_step, None, exact_d)
    return (Family("prompt", tuple((1, s) for s in context), np.array([cost.prompt_ms(c, s) for s in context]),
                   demands.prompt, exact_p, slowdown),
            Family("decode", tuple((1, s) for s in tkg), np.array([cost.decode_ms(m, m * s) for s in tkg]),
                   demands.decode, exact_d, slowdown))


def graph_set(stack: str, prompt: tuple[Graph, ...], decode: tuple[Graph, ...]) -> GraphSet:
    """The chosen candidates as the replay's graph set."""
    if stack == "gaudi":
        return GraphSet("gaudi", prompt=tuple(sorted(prompt)), decode=tuple(sorted(decode)), source="planned")
    return GraphSet("nxdi", context=tuple(sorted(s for _, s in prompt)),
                    token_generation=tuple(sorted(s for _, s in decode)), source="planned")


def dense_set(stack: str, settings: ServerSettings, cap: int, longest_prompt: int, longest: int,
              pool_blocks: int) -> GraphSet:
    """A set that pads almost nothing, for the first replay: its steps are close to what the traffic asks for."""
    if stack == "gaudi":
        budget, bs = settings.max_num_batched_tokens, settings.block_size
        top_s = min(budget, -(-longest_prompt // 128) * 128)
        prompt = tuple(sorted((b, s) for b in batch_grid(cap) for s in range(128, top_s + 128, 128)
                              if b * s <= budget))
        per_seq = -(-longest // bs)
        top_nb = max(4, min(pool_blocks, per_seq * settings.max_num_seqs))
        decode = tuple(sorted((b, nb) for b in batch_grid(settings.max_num_seqs)
                              for nb in range(4, top_nb + 4, 4) if b <= nb <= b * per_seq))
        return GraphSet("gaudi", prompt=prompt, decode=decode, source="dense")
    context = tuple(range(128, -(-longest_prompt // 128) * 128 + 1, 128))
    tkg = tuple(range(128, -(-longest // 128) * 128 + 1, 128))
    return GraphSet("nxdi", context=context, token_generation=tkg, source="dense")
