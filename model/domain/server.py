"""Serving mode's records (``shared/serving_model.md``): the server's settings and the compiled graph set.

A replay judges a set of compiled graphs by what one serving stack would do with it, so
both records name their stack: the lookup rules (which graph a step runs on), the KV
pool and the run-time compile differ between vLLM on Gaudi and NxD Inference.  The
loaders (``model.load.server``, ``model.serving.graphs``) report bad values with file,
line and key; the checks here only stop a record built in code from being inconsistent.
"""

from __future__ import annotations

from dataclasses import dataclass

STACKS = ("gaudi", "nxdi")
DEFAULT_BLOCK_SIZE = 128
MAX_COUNT = 2**31 - 1  # sequences, tokens a step: beyond this a setting is a typo, not a server
MAX_BLOCK = 1 << 20  # the longest request length accepted (model.load.requests.MAX_LEN)
# keys that mean something for one stack only: given for the other, they would silently do nothing
STACK_ONLY = {"block_size": "gaudi", "max_prefill_seqs": "gaudi", "ctx_batch_size": "nxdi"}
SERVER_KEYS = ("stack", "max_num_seqs", "max_num_batched_tokens", "block_size", "max_prefill_seqs",
               "ctx_batch_size")
REQUIRED_KEYS = ("stack", "max_num_seqs", "max_num_batched_tokens")

Graph = tuple[int, int]


def _positive(value: object, most: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= most


@dataclass(frozen=True, kw_only=True)
class ServerSettings:
    """The scheduler's settings (the profile's ``[server]`` table, flags over it).

    ``max_prefill_seqs`` None means gaudi's default, the largest batch of the prompt
    graphs (``prefill_cap`` resolves it against a graph set); nxdi admits at most
    ``ctx_batch_size`` prompts a step, the batch every one of its prompt graphs runs at.
    """

    stack: str
    max_num_seqs: int
    max_num_batched_tokens: int
    block_size: int = DEFAULT_BLOCK_SIZE
    max_prefill_seqs: int | None = None
    ctx_batch_size: int = 1

    def __post_init__(self) -> None:
        if self.stack not in STACKS:
            raise ValueError(f"stack must be one of {', '.join(STACKS)}, got {self.stack!r}")
        for key in ("max_num_seqs", "max_num_batched_tokens", "ctx_batch_size"):
            if not _positive(getattr(self, key), MAX_COUNT):
                raise ValueError(f"{key} must be a positive integer, got {getattr(self, key)!r}")
        if not _positive(self.block_size, MAX_BLOCK):
            raise ValueError(f"block_size must be a positive integer up to {MAX_BLOCK}, got {self.block_size!r}")
        if self.max_prefill_seqs is not None and not _positive(self.max_prefill_seqs, MAX_COUNT):
            raise ValueError(f"max_prefill_seqs must be a positive integer, got {self.max_prefill_seqs!r}")
        if self.stack == "nxdi" and self.ctx_batch_size > self.max_num_seqs:
            raise ValueError(f"ctx_batch_size {self.ctx_batch_size} is above max_num_seqs {self.max_num_seqs}")

    def prefill_cap(self, graphs: GraphSet) -> int:
        """At most this many prompts are admitted in one step."""
        if self.stack == "nxdi":
            return self.ctx_batch_size
        if self.max_prefill_seqs is not None:
            return self.max_prefill_seqs
        return max(b for b, _ in graphs.prompt)

    def total_blocks(self, kv_capacity_tokens: int) -> int:
        """gaudi's KV pool: ``floor(kv_capacity_tokens / block_size)`` blocks."""
        return kv_capacity_tokens // self.block_size


@dataclass(frozen=True)
class GraphSet:
    """The graphs compiled before serving.

    gaudi: ``prompt`` graphs (B, S) -- batch and query length, no prefix cache -- and
    ``decode`` graphs (B, NB) -- batch and total KV blocks of the batch -- each sorted,
    the order the stack's lookup walks.  nxdi: ``context`` buckets and
    ``token_generation`` buckets, sorted lengths (the batch comes from the settings).
    """

    stack: str
    prompt: tuple[Graph, ...] = ()
    decode: tuple[Graph, ...] = ()
    context: tuple[int, ...] = ()
    token_generation: tuple[int, ...] = ()
    unused: int = 0  # graphs compiled at warm-up that no step runs (gaudi prompt graphs with context blocks)
    source: str = ""

    def __post_init__(self) -> None:
        if self.stack not in STACKS:
            raise ValueError(f"stack must be one of {', '.join(STACKS)}, got {self.stack!r}")
        pairs, lengths = (self.prompt, self.decode), (self.context, self.token_generation)
        if self.stack == "gaudi":
            if any(lengths):
                raise ValueError("a gaudi graph set has prompt and decode graphs, not buckets")
            for graphs in pairs:
                if list(graphs) != sorted(set(graphs)) or not all(
                        len(g) == 2 and _positive(g[0], MAX_COUNT) and _positive(g[1], MAX_COUNT) for g in graphs):
                    raise ValueError(f"graphs must be sorted unique pairs of positive integers, got {graphs!r}")
        else:
            if any(pairs):
                raise ValueError("an nxdi graph set has context and token-generation buckets, not pairs")
            for buckets in lengths:
                if list(buckets) != sorted(set(buckets)) or not all(_positive(b, MAX_COUNT) for b in buckets):
                    raise ValueError(f"buckets must be sorted unique positive integers, got {buckets!r}")
            if not self.context or not self.token_generation:
                raise ValueError("an nxdi graph set needs context and token-generation buckets")
        if isinstance(self.unused, bool) or not isinstance(self.unused, int) or self.unused < 0:
            raise ValueError(f"unused must be a non-negative integer, got {self.unused!r}")

    @property
    def count(self) -> int:
        """Graphs compiled before serving (what the warm-up pays for)."""
        return len(self.prompt) + len(self.decode) + len(self.context) + len(self.token_generation) + self.unused


def cube_root_ceil(x: int) -> int:
    """The smallest k >= 0 with k**3 >= x, in integers (``x ** (1/3)`` is 3.0000000000000004 at 27)."""
    k = max(0, round(x ** (1.0 / 3.0)))
    while k ** 3 < x:
        k += 1
    while k > 0 and (k - 1) ** 3 >= x:
        k -= 1
    return k


def compile_round(x: int, base: int) -> int:
    """The stack's run-time rounding ``r(x, base)``: x for x <= 1, else x up to a multiple of ceil(x^(1/3))*base.

    A missing graph is compiled a little larger than the step needs, so the next steps
    of a growing batch find it; the step grows with the cube root, as vllm-gaudi's does.
    """
    if x <= 1:
        return x
    step = cube_root_ceil(x) * base
    return -(-x // step) * step


def runtime_prompt_graph(n: int, s: int, settings: ServerSettings) -> Graph:
    """The prompt graph gaudi compiles when none covers n prompts of longest length s."""
    return min(compile_round(n, 2), settings.max_num_seqs), min(compile_round(s, 32), settings.max_num_batched_tokens)


def runtime_decode_graph(n: int, nb: int, settings: ServerSettings) -> Graph:
    """The decode graph gaudi compiles when none covers n sequences holding nb KV blocks."""
    return min(compile_round(n, 2), settings.max_num_seqs), compile_round(nb, 32)
