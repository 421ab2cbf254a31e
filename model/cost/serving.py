"""Serving mode's step times (``shared/serving_model.md``): the one place the prompt and decode step formulas live.

Device mode prices a static batch from start to end; serving mode prices one scheduler
step at a time, because requests join and leave between steps.  A step runs at most one
prompt graph and one decode graph, each at its COMPILED dimensions (the padding is what
a graph set costs), so both formulas take the graph, not the requests:

    prompt graph (B, S):               p0 + p1*B*S + p2*B*S^2 + batch_overhead_ms
    decode graph, batch B, C context:  d0 + d1*C + d2*B + batch_overhead_ms

with ``decode_large`` in place of ``decode`` when B >= ``decode_large_from``.  C, the
context tokens the graph holds, is the stack's business (gaudi: total KV blocks times the
block size; nxdi: batch times bucket length) and comes from the caller.  Integer factors
are formed exactly (Python ints) before they meet the float coefficients, as in
``model.cost.device``, so a replay and a test vector agree to float rounding.
"""

from __future__ import annotations

from dataclasses import dataclass

from model.cost.device import DeviceProfile


@dataclass(frozen=True)
class ServingCost:
    """Step times of the compiled graphs on one device profile (ms)."""

    profile: DeviceProfile

    def prompt_ms(self, batch: int, length: int) -> float:
        """A prompt graph (B, S): its time whatever the real prompts inside it (they are padded to it)."""
        p0, p1, p2 = self.profile.prefill
        b, s = int(batch), int(length)
        return p0 + p1 * (b * s) + p2 * (b * s * s) + self.profile.batch_overhead_ms

    def decode_ms(self, batch: int, context_tokens: int) -> float:
        """A decode graph of batch B holding ``context_tokens`` KV positions: one token for each of its rows."""
        prof = self.profile
        large = prof.decode_large_from is not None and batch >= prof.decode_large_from
        d0, d1, d2 = prof.decode_large if large else prof.decode  # type: ignore[misc]
        return d0 + d1 * int(context_tokens) + d2 * int(batch) + prof.batch_overhead_ms

    @property
    def compile_ms(self) -> float:
        """Compiling one graph before serving (the warm-up charges this per graph of the set)."""
        return self.profile.compile_ms

    @property
    def runtime_compile_ms(self) -> float:
        """Compiling a graph the set lacks, while serving: added to the step that needs it."""
        return self.profile.runtime_compile

    def warmup_ms(self, graphs: int) -> float:
        """Warm-up of a set of ``graphs`` compiled graphs: ``compile_ms`` each."""
        return self.profile.compile_ms * graphs
