"""Report documents: plain blocks (headings, paragraphs, tables, images) and their three renderings.

Every report (the sweep's, the audit's, the hold-out's, the windows' devices) is built
once as a list of blocks and rendered three ways -- Markdown beside its PNGs, HTML with
the PNGs embedded as base64, and plain text for the terminal -- so the three never say
different things.  What a report says lives with its command's layer
(``model.sweeping.sweep_report`` for the sweep); this module only holds the form.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from model.domain.schema import Problem
from model.histogram.cells import Histogram

QUANTILES = (("min", 0.0), ("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("max", 1.0))


@dataclass(frozen=True)
class Heading:
    text: str
    level: int = 2


@dataclass(frozen=True)
class Paragraph:
    """Plain text; ``lead`` is shown in bold before it (the one thing to read first)."""

    text: str
    lead: str = ""


@dataclass(frozen=True)
class Table:
    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]


@dataclass(frozen=True)
class Image:
    """A PNG written beside the report (Markdown links it, HTML embeds it).

    ``data`` holds the PNG's bytes when it is not on disk yet (a writer that puts every
    file down together), so the HTML can embed it all the same.
    """

    path: Path
    caption: str
    data: bytes | None = None


Block = Heading | Paragraph | Table | Image


@dataclass(frozen=True)
class BucketSummary:
    """What the input looks like: request count, histogram size and length percentiles."""

    name: str
    requests: int
    cells: int
    prompt: tuple[int, ...]
    gen: tuple[int, ...]


def input_summary(problem: Problem, hists: Sequence[Histogram]) -> tuple[BucketSummary, ...]:
    """Per bucket: counts and prompt / gen percentiles (observed values, nearest rank)."""
    qs = [q for _, q in QUANTILES]
    return tuple(BucketSummary(b.name, len(b), len(h),
                               tuple(int(v) for v in np.quantile(b.prompt_len, qs, method="inverted_cdf")),
                               tuple(int(v) for v in np.quantile(b.gen_len, qs, method="inverted_cdf")))
                 for b, h in zip(problem.buckets, hists, strict=True))


def summary_table(summaries: Sequence[BucketSummary]) -> Table:
    """The input summary as a table."""
    names = [n for n, _ in QUANTILES]
    header = ("bucket", "requests", "cells (S, G)", *(f"prompt {n}" for n in names), *(f"gen {n}" for n in names))
    return Table(header, tuple((s.name, f"{s.requests:,}", f"{s.cells:,}", *(f"{v:,}" for v in s.prompt),
                                *(f"{v:,}" for v in s.gen)) for s in summaries))


def md_cell(text: str) -> str:
    """A table cell safe for Markdown pipes."""
    return text.replace("|", "\\|").replace("\n", " ")


def to_markdown(blocks: Sequence[Block], folder: Path) -> str:
    """Markdown; images are linked by file name, so the report reads beside its PNGs."""
    out = []
    for b in blocks:
        if isinstance(b, Heading):
            out.append("#" * b.level + " " + b.text)
        elif isinstance(b, Paragraph):
            out.append((f"**{b.lead.strip()}** " if b.lead else "") + b.text)
        elif isinstance(b, Table):
            out.append("\n".join(["| " + " | ".join(map(md_cell, b.header)) + " |",
                                  "|" + "---|" * len(b.header),
                                  *("| " + " | ".join(map(md_cell, r)) + " |" for r in b.rows)]))
        else:
            out.append(f"![{b.caption}]({b.path.relative_to(folder).as_posix()})\n\n*{b.caption}*")
    return "\n\n".join(out) + "\n"


HTML_STYLE = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto;line-height:1.4}"
              "table{border-collapse:collapse;font-size:13px;margin:1em 0}"
              "td,th{border:1px solid #ccc;padding:3px 7px;text-align:right}th{background:#f2f2f2}"
              "td:first-child,th:first-child{text-align:left}img{max-width:100%}"
              "figcaption{font-style:italic;font-size:13px}")


def to_html(blocks: Sequence[Block], title: str) -> str:
    """One self-contained HTML file: CSS inline, every PNG embedded as base64."""
    e = html.escape
    out = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{e(title)}</title>"
           f"<style>{HTML_STYLE}</style></head><body>"]
    for b in blocks:
        if isinstance(b, Heading):
            out.append(f"<h{b.level}>{e(b.text)}</h{b.level}>")
        elif isinstance(b, Paragraph):
            out.append("<p>" + (f"<strong>{e(b.lead.strip())}</strong> " if b.lead else "") + e(b.text) + "</p>")
        elif isinstance(b, Table):
            head = "".join(f"<th>{e(h)}</th>" for h in b.header)
            body = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in r) + "</tr>" for r in b.rows)
            out.append(f"<table><tr>{head}</tr>{body}</table>")
        else:
            data = base64.b64encode(b.data if b.data is not None else b.path.read_bytes()).decode("ascii")
            out.append(f"<figure><img alt='{e(b.caption)}' src='data:image/png;base64,{data}'>"
                       f"<figcaption>{e(b.caption)}</figcaption></figure>")
    return "\n".join(out) + "\n</body></html>\n"


def to_text(blocks: Sequence[Block]) -> str:
    """Plain text for the terminal (images are listed by path)."""
    out = []
    for b in blocks:
        if isinstance(b, Heading):
            out.append(b.text)
        elif isinstance(b, Paragraph):
            out.append(b.lead + b.text)
        elif isinstance(b, Table):
            widths = [max(len(x) for x in col) for col in zip(b.header, *b.rows, strict=True)]
            out.append("\n".join("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True))
                                 for r in (b.header, *b.rows)))
        else:
            out.append(f"[picture {b.path}]")
    return "\n\n".join(out)
