"""The serving audit as report blocks, JSON and files: the headline first, the sides side by side, the capacity
table, then (``--report``) each side's pictures; ``--out`` the numbers as JSON and today's graphs in the replay's
json schema (to replay them again, or to plan from them).  The command line writes every file together."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from model.deploy.serving_audit import ServingAudit, ServingSide
from model.evaluation.replay_metrics import ReplaySummary
from model.report.capacity import (
    capacity_json,
    capacity_paragraphs,
    capacity_table,
    number_text,
    quantile_name,
    share_text,
)
from model.report.document import Block, Heading, Image, Paragraph, Table, to_html, to_markdown
from model.report.serving import settings_text, summary_json
from model.serving.replay_graphs import graph_set_json

REPORT_PAGES = ("report.md", "report.html")
SIDE_NAMES = ("today", "planned")  # file prefixes of the sides' pictures
PICTURES = ("timeline.png", "latency.png")  # model.report.serving_plots.REPORT_FILES
OUT_FILES = ("audit.json", "today-graphs.json")
SHOWN_COMPILES = 4  # run-time compile graphs named in a table cell


def report_names(sides: int) -> tuple[str, ...]:
    """Every file --report writes, for this many sides (named before anything runs, to check the folder)."""
    return (*REPORT_PAGES, *(f"{name}-{pic}" for name in SIDE_NAMES[:sides] for pic in PICTURES))


def _s(ms: float) -> str:
    return f"{ms / 1000:,.0f} s"


def compile_graphs(s: ReplaySummary) -> str:
    """The graphs compiled at run time, without repeats (a graph compiled on several replicas counts once here)."""
    seen = list(dict.fromkeys(f"{c.kind} {c.graph}" for _, c in s.runtime_compiles))
    more = f" ... {len(seen) - SHOWN_COMPILES} more" if len(seen) > SHOWN_COMPILES else ""
    return (", ".join(seen[:SHOWN_COMPILES]) + more) if seen else "none"


def graph_count(d: ServingSide) -> str:
    """"181: 61 prompt, 60 decode, 60 prefix-cache" (nxdi: context and token-generation buckets)."""
    g = d.graphs
    if g.stack == "gaudi":
        parts = [f"{len(g.prompt)} prompt", f"{len(g.decode)} decode"] + ([f"{g.unused} prefix-cache"] if g.unused
                                                                          else [])
    else:
        parts = [f"{len(g.context)} context", f"{len(g.token_generation)} token-gen"] + (
            [f"{g.unused} other batches"] if g.unused else [])
    return f"{d.summary.graphs}: {', '.join(parts)}"


ROWS: tuple[tuple[str, Callable[[ServingSide], str]], ...] = (
    ("graphs before serving", graph_count),
    ("warm-up a replica", lambda d: _s(d.summary.warmup_ms / max(d.summary.replicas, 1))),
    ("run-time compiles (all replicas)",
     lambda d: f"{len(d.summary.runtime_compiles)} ({_s(d.summary.runtime_compile_ms)})"),
    ("graphs compiled at run time", lambda d: compile_graphs(d.summary)),
    ("busy device-hours", lambda d: number_text(d.summary.busy_device_hours)),
    ("busy share", lambda d: share_text(d.summary.utilisation)),
    ("TTFT p50 / p95 / p99 ms", lambda d: " / ".join(number_text(v) for v in (d.summary.ttft.p50, d.summary.ttft.p95,
                                                                       d.summary.ttft.p99))),
    ("TPOT p50 / p95 / p99 ms", lambda d: " / ".join(number_text(v) for v in (d.summary.tpot.p50, d.summary.tpot.p95,
                                                                       d.summary.tpot.p99))),
    ("E2E p95 ms", lambda d: number_text(d.summary.e2e.p95)),
    ("pad ratio prompt / decode", lambda d: f"{number_text(d.summary.prompt_pad_ratio, 4)} / "
                                            f"{number_text(d.summary.decode_pad_ratio, 4)}"),
)


def side_table(audit: ServingAudit) -> Table:
    """One row a metric, one column a side."""
    rows = [(name, *(cell(d) for d in audit.sides)) for name, cell in ROWS]
    if audit.slo is not None:
        rows.append(("goodput (SLOs met)", *(share_text(d.summary.slo.goodput) for d in audit.sides)))
        rows.append((f"SLO at {quantile_name(audit.slo.quantile)}", *(met_text(d.summary) for d in audit.sides)))
    return Table(("", *(f"{d.label} ({d.source})" for d in audit.sides)), tuple(rows))


def met_text(s: ReplaySummary) -> str:
    r = s.slo
    parts = [f"{name} {'met' if met else 'MISSED'}" for name, met in (("TTFT", r.ttft_met), ("TPOT", r.tpot_met))
             if met is not None]
    return ", ".join(parts)


def headline(audit: ServingAudit) -> str:
    """One sentence: what today's config costs, and what the planned graphs would change."""
    today = audit.sides[0].summary
    at = f"at {audit.replicas} replica{'s' if audit.replicas > 1 else ''}, rate {audit.rate_scale:g}x"
    if len(audit.sides) == 1:
        return (f"today's config compiles {today.graphs} graphs (warm-up {_s(cost_a_replica(today))} a replica) and "
                f"{len(today.runtime_compiles)} more at run time on this trace; {at} it is busy "
                f"{today.busy_device_hours:.4g} device-hours, TTFT p95 {number_text(today.ttft.p95)} ms, TPOT p95 "
                f"{number_text(today.tpot.p95)} ms.")
    planned = audit.sides[1].summary
    saving, share = audit.busy_saving
    verb = "cut" if saving >= 0 else "raise"
    return (f"the planned graphs would {verb} busy time by {abs(saving) / 3.6e6:.4g} device-hours "
            f"({abs(share):.1%} of today's {today.busy_device_hours:.4g}) with {planned.graphs} graphs (warm-up "
            f"{_s(cost_a_replica(planned))} a replica) against today's {today.graphs} ({_s(cost_a_replica(today))}); "
            f"run-time compiles {len(today.runtime_compiles)} -> {len(planned.runtime_compiles)}, TTFT p95 "
            f"{number_text(today.ttft.p95)} -> {number_text(planned.ttft.p95)} ms, TPOT p95 "
            f"{number_text(today.tpot.p95)} -> {number_text(planned.tpot.p95)} ms, {at}.")


def cost_a_replica(s: ReplaySummary) -> float:
    return s.warmup_ms / max(s.replicas, 1)


def audit_blocks(audit: ServingAudit, source: str) -> list[Block]:
    """The audit's text: headline, what ran, the sides, the capacity table."""
    where = (f"{audit.requests} requests from {source}; {settings_text(audit.settings, audit.sides[0].graphs)}; "
             f"{audit.replicas} replica(s) dealt round-robin, rate {audit.rate_scale:g}x")
    if audit.auto:
        where += " (the largest count the capacity search chose at this rate, so both sides are judged alike)"
    blocks: list[Block] = [Heading(f"Serving audit: {source}", 1), Paragraph(headline(audit), lead="Headline: "),
                           Paragraph(where + "."), side_table(audit)]
    if audit.auto:
        sides = [(d.label, d.capacity) for d in audit.sides]
        blocks += [Heading("Capacity"), capacity_table(sides, audit.slo), *capacity_paragraphs(sides, audit.slo)]
    return blocks


def audit_json(audit: ServingAudit) -> str:
    """Every number at full precision: each side's replay summary (model.replay's --json) and capacity rows."""
    doc = {"requests": audit.requests, "replicas": audit.replicas, "rate_scale": audit.rate_scale,
           "busy_saving_ms": None, "busy_saving_share": None, "sides": []}
    if audit.busy_saving is not None:
        doc["busy_saving_ms"], doc["busy_saving_share"] = audit.busy_saving
    for d in audit.sides:
        side = {"label": d.label, "source": d.source,
                "replay": json.loads(summary_json(d.summary, audit.settings, d.graphs))}
        if d.capacity is not None:
            side["capacity"] = capacity_json(d.capacity, audit.slo)
        doc["sides"].append(side)
    return json.dumps(doc, indent=2, allow_nan=False) + "\n"


def output_files(audit: ServingAudit, source: str, report: Path | None, out: Path | None) -> dict[Path, list[bytes]]:
    """Every file the flags ask for, as bytes (the caller writes them together)."""
    files: dict[Path, list[bytes]] = {}
    if out is not None:
        files[out / OUT_FILES[0]] = [audit_json(audit).encode()]
        files[out / OUT_FILES[1]] = [graph_set_json(audit.sides[0].graphs).encode()]
    if report is not None:
        from model.report.serving_plots import report_files

        blocks = audit_blocks(audit, source)
        for name, d in zip(SIDE_NAMES, audit.sides, strict=False):
            for pic, data in report_files(d.result, d.summary).items():
                path = report / f"{name}-{pic}"
                blocks.append(Image(path, f"{d.label}: {pic.removesuffix('.png')} (first replica's steps; every "
                                          "request's latencies)", data))
                files[path] = [data]
        files[report / REPORT_PAGES[0]] = [to_markdown(blocks, report).encode()]
        files[report / REPORT_PAGES[1]] = [to_html(blocks, f"Serving audit: {source}").encode()]
    return files
