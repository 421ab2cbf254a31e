"""The capacity answer as a table (rate, replicas, TTFT and TPOT at the SLO quantile, busy share), one column
group per graph set, with what the search replayed; and the same as JSON at full precision."""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

from model.evaluation.capacity import Probe, Search
from model.evaluation.replay_metrics import Slo
from model.report.document import Paragraph, Table


def number_text(value: float | None, digits: int = 6) -> str:
    """A measured number in ``digits`` significant digits, "-" where there is none."""
    return "-" if value is None else f"{value:.{digits}g}"


def share_text(value: float | None) -> str:
    """A share as a percentage with one decimal, "-" where there is none."""
    return "-" if value is None else f"{100 * value:.1f}%"


def quantile_name(q: Fraction) -> str:
    """0.95 -> "p95", 0.999 -> "p99.9"."""
    return f"p{float(q * 100):g}"


def slo_text(slo: Slo) -> str:
    """"TTFT p95 <= 2000 ms, TPOT p95 <= 200 ms"."""
    q = quantile_name(slo.quantile)
    return ", ".join(f"{name} {q} <= {v:g} ms" for name, v in (("TTFT", slo.ttft_ms), ("TPOT", slo.tpot_ms))
                     if v is not None)


def replicas_cell(search: Search) -> str:
    """The count chosen, "none found" (none up to one request a replica) or "> cap" (none up to the cap)."""
    if search.replicas is not None:
        return str(search.replicas)
    return "none found" if search.no_more_to_try else f"> {search.cap}"


def capacity_table(sides: Sequence[tuple[str, Sequence[Search]]], slo: Slo) -> Table:
    """Rows by rate scale; per graph set its replicas and, at that count (or the cap), the quantiles and busy share."""
    q = quantile_name(slo.quantile)
    header = ["rate"]
    for label, _ in sides:
        prefix = f"{label}: " if len(sides) > 1 else ""
        header += [f"{prefix}replicas", f"TTFT {q} ms", f"TPOT {q} ms", "busy share"]
    rows = []
    for i, search in enumerate(sides[0][1]):
        row = [f"{search.rate_scale:g}x"]
        for _, searches in sides:
            s = searches[i]
            p: Probe | None = s.chosen
            row += [replicas_cell(s), number_text(p.ttft_ms if p else None), number_text(p.tpot_ms if p else None),
                    share_text(p.busy_share if p else None)]
        rows.append(tuple(row))
    return Table(tuple(header), tuple(rows))


def search_note(label: str, search: Search) -> str:
    """What one search replayed and what its answer is worth."""
    tried = ", ".join(f"{p.replicas}{'' if p.ok else ' no'}" for p in search.probes)
    if search.no_more_to_try:
        verdict = (f"no count replayed meets the SLOs, up to every request on a replica of its own "
                   f"({search.alone_from} replicas, the row's numbers), from which more replicas change nothing: "
                   "raising --max-replicas cannot help; relax the SLOs or change the graphs")
    elif search.replicas is None:
        verdict = (f"no count up to the cap {search.cap} meets the SLOs (the row shows {search.probes[-1].replicas}); "
                   "raise --max-replicas or relax the SLOs")
    elif search.proved:
        verdict = f"{search.replicas} is the fewest (every smaller count replayed and failed)"
    else:
        verdict = (f"{search.replicas} is the fewest found ({search.replicas - 1} fails; smaller counts not all "
                   "replayed, and meeting the SLOs need not be monotone in the count)")
    return f"{label} at {search.rate_scale:g}x: replayed {tried}; {verdict}."


def capacity_paragraphs(sides: Sequence[tuple[str, Sequence[Search]]], slo: Slo) -> list[Paragraph]:
    """How the table was found, then one line per search."""
    how = Paragraph(f"the fewest replicas whose replay meets {slo_text(slo)}, found by replaying 1, 2, 4, ... "
                    "replicas until one count meets them, then bisecting down to a count whose count - 1 fails "
                    "(each replayed on the whole trace, dealt round-robin); busy share is busy device time over "
                    "replicas x (first arrival to last finish). Counts replayed ('no': missed the SLOs):",
                    lead="Capacity: ")
    return [how, *(Paragraph(search_note(label, s)) for label, searches in sides for s in searches)]


def probe_json(p: Probe) -> dict:
    return {"replicas": p.replicas, "meets_slo": p.ok, "ttft_ms_at_quantile": p.ttft_ms,
            "tpot_ms_at_quantile": p.tpot_ms, "busy_share": p.busy_share, "goodput": p.goodput, "busy_ms": p.busy_ms,
            "runtime_compiles": p.runtime_compiles}


def capacity_json(searches: Sequence[Search], slo: Slo) -> dict:
    """One graph set's capacity rows: the count chosen (null: none up to the cap), whether proved, every probe."""
    return {"slo": {"ttft_ms": slo.ttft_ms, "tpot_ms": slo.tpot_ms, "quantile": float(slo.quantile)},
            "rows": [{"rate_scale": s.rate_scale, "replicas": s.replicas, "cap": s.cap, "proved_fewest": s.proved,
                      "more_replicas_change_nothing": s.no_more_to_try,
                      "at": probe_json(s.chosen) if s.chosen else None,
                      "probes": [probe_json(p) for p in s.probes]} for s in searches]}
