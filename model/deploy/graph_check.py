"""``model.export --check``: the graphs a config makes its stack compile, and how they differ from the plans'.

From the config file alone (and the server settings it states or ``--server-settings``
gives), by the stack's documented rules, the check lists every graph the stack will
compile and the graphs the config lists that a setting drops.  With the plans it
compares: a graph the plans run that the stack does not compile is missing (the stack
would pad the step into a larger graph or compile one at run time), a graph the stack
compiles that no plan runs is extra (warm-up time and memory for nothing), and a
dropped graph is a setting that contradicts the list.  Library code: it prints nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from model.serving.graphs import FREE_BATCH_NOTE, Compiled, Graph, count_text, graph_key
from model.serving.settings import shown_pairs

DECODE_KINDS = frozenset({"decode", "token-gen"})  # the graphs only the generation lengths determine
MAX_SHOWN = 20  # graphs named in one line of differences; the rest are counted


@dataclass(frozen=True)
class GraphCheck:
    """A config's compiled graphs beside the plans' (``planned`` None: no plans to compare with)."""

    source: str
    fmt: str
    compiled: Compiled
    planned: tuple[Graph, ...] | None = None
    decode_known: bool = True  # the plans' decode graphs are known (requests were given)
    compile_ms: float | None = None

    @property
    def graphs(self) -> tuple[Graph, ...]:
        assert self.compiled.graphs is not None  # the command refuses a config it cannot count
        return self.compiled.graphs

    def compared(self, graphs: tuple[Graph, ...]) -> set[Graph]:
        """The graphs that take part in the comparison: without requests, not the decode ones."""
        return {g for g in graphs if self.decode_known or g.kind not in DECODE_KINDS}

    @property
    def missing(self) -> list[Graph]:
        return sorted(self.compared(self.planned or ()) - self.compared(self.graphs), key=graph_key)

    @property
    def extra(self) -> list[Graph]:
        return sorted(self.compared(self.graphs) - self.compared(self.planned or ()), key=graph_key) \
            if self.planned is not None \
            else []

    @property
    def ok(self) -> bool:
        """Nothing missing, nothing extra, nothing dropped (with plans); without plans, nothing dropped."""
        return not (self.missing or self.extra or self.compiled.dropped)


def named(graphs: list[Graph]) -> str:
    """Graphs in one line, the first MAX_SHOWN named and the rest counted."""
    more = f" and {len(graphs) - MAX_SHOWN} more" if len(graphs) > MAX_SHOWN else ""
    return ", ".join(map(str, graphs[:MAX_SHOWN])) + more


def check_lines(check: GraphCheck) -> list[str]:
    """What the check prints: the count and warm-up, the settings, every graph, then the differences."""
    c = check.compiled
    lines = [f"{check.source} ({check.fmt}): the stack compiles {count_text(check.graphs, check.compile_ms)}"]
    if check.compile_ms is None:
        lines.append(f"note: {FREE_BATCH_NOTE}")
    if c.settings:
        lines.append(f"settings: {shown_pairs(c.settings)}")
    lines += [f"  {g}" for g in check.graphs]
    if c.dropped:
        lines.append(f"dropped by a setting ({len(c.dropped)}; listed in the config, never compiled):")
        lines += [f"  {d.graph}: {d.reason}" for d in c.dropped]
    if check.planned is None:
        return lines
    lines.append(f"the plans run {count_text(check.planned, check.compile_ms)}")
    if not check.decode_known:
        lines.append("note: decode graphs not compared: the plans' decode graphs need --scenario or --requests")
    if check.missing:
        lines.append(f"missing ({len(check.missing)}; the plans run them, the stack does not compile them): "
                     f"{named(check.missing)}")
    if check.extra:
        lines.append(f"extra ({len(check.extra)}; the stack compiles them, no plan runs them): {named(check.extra)}")
    if check.ok:
        lines.append(f"OK: the stack compiles exactly the {len(check.compared(check.graphs))} graphs the plans run")
    else:
        lines.append("DIFFERENT: the stack does not compile exactly the graphs the plans run")
    return lines
