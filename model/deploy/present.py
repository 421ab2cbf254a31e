"""The deployment checks as report blocks (``model.report.document``): one content, three renderings.

The command lines print ``to_text`` of these blocks; ``--report`` writes the same blocks
as report.md and report.html (with the heatmap of both shape sets), every file put
down together by ``model.load.outputs.write_together``: all of them, or none.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from model.base.numbers import counted
from model.cost.device import device_hours
from model.deploy.auditing import NEUTRAL_FORMATS, AuditResult, Side
from model.deploy.holdout import Holdout
from model.histogram.cells import build_histogram
from model.load.outputs import write_together
from model.report.document import Block, Heading, Image, Paragraph, Table, to_html, to_markdown
from model.report.json_doc import DataTable, cost_unit
from model.report.plots import heatmap_figure, png_bytes
from model.report.tables import device_units, fmt


def pct(value: float | None) -> str:
    """A relative difference as a signed percentage ("-" when unknown)."""
    return "-" if value is None else f"{value:+.2%}"


def shapes_text(shapes: Sequence[int]) -> str:
    return " ".join(map(str, shapes)) if shapes else "-"


def run_shapes(run) -> tuple[int, ...]:
    if run is None:
        return ()
    return tuple(sorted({int(s) for r in run.evaluation.results if r.metrics for s in r.metrics.shapes}))


# ---------------------------------------------------------------- hold-out


def holdout_blocks(h: Holdout, heading: bool = True) -> list[Block]:
    """The out-of-sample check: the split, a table (in sample, out of sample, against the held-out optimum)
    and the one sentence to read."""
    def cost(run) -> str:  # a run that breaks a rule or a limit is starred
        return fmt(Holdout.cost(run)) + ("" if run is None or run.evaluation.ok else " *")

    blocks: list[Block] = [Heading(f"Out of sample (K = {h.k})")] if heading else []
    blocks.append(Paragraph(h.split.describe() + "; absolute limits scaled to each part's share of requests."))
    rows = [(f"{h.solver}: shapes chosen on the first part", shapes_text(h.shapes), fmt(h.in_sample),
             cost(h.fixed), pct(h.loss)),
            (f"{h.solver}: held-out part's own shapes", shapes_text(run_shapes(h.own)), "-", cost(h.own),
             "+0.00%" if h.own is not None else "-"),
            ("pow2 rule", shapes_text(run_shapes(h.pow2)), fmt(h.pow2_in_sample), cost(h.pow2),
             pct(h.pow2_excess))]
    unit = cost_unit(h.split.test.cost)
    blocks.append(Table(("plan", "shapes", f"cost, first part (in sample; {unit})", f"cost, held-out part ({unit})",
                         "vs held-out optimum"), tuple(rows)))
    blocks.append(Paragraph(holdout_sentence(h), lead="Out of sample: "))
    if any(r is not None and not r.evaluation.ok for r in (h.fixed, h.own, h.pow2)):
        blocks.append(Paragraph("* the plan breaks a rule or a limit of the held-out part.", lead="note: "))
    blocks += [Paragraph(m, lead="note: ") for m in h.messages]
    return blocks


def holdout_sentence(h: Holdout) -> str:
    if h.loss is None:
        return "no comparison could be made (see the notes)."
    bound = h.own_bound
    capped = (f" (at most {h.loss_vs_bound:+.2%} against its certified lower bound {fmt(bound)})"
              if bound is not None and h.loss_vs_bound is not None else "")
    rule = (f"; the pow2 rule on the same part costs {h.pow2_excess:+.2%}" if h.pow2_excess is not None else "")
    return (f"the shapes chosen on the first part cost {h.loss:+.2%} against the held-out part's own optimum"
            f"{capped}{rule}.")


def sweep_holdout_blocks(checks: Sequence[Holdout]) -> list[Block]:
    """The out-of-sample check for every K of a sweep, one row each."""
    if not checks:
        return []
    unit = cost_unit(checks[0].split.test.cost)
    rows = tuple((str(h.k), shapes_text(h.shapes), fmt(h.in_sample), fmt(Holdout.cost(h.fixed)),
                  fmt(Holdout.cost(h.own)), pct(h.loss), pct(h.loss_vs_bound), fmt(Holdout.cost(h.pow2)),
                  pct(h.pow2_excess)) for h in checks)
    blocks: list[Block] = [
        Heading("Out of sample, per shape cap"),
        Paragraph(checks[0].split.describe() + "; the sweep above ran on the first part. Each K's MIP shapes are "
                  "then used on the held-out part, beside that part's own optimum and the pow2 rule."),
        Table(("K", "shapes chosen", f"in sample ({unit})", f"held-out, chosen shapes ({unit})",
               f"held-out optimum ({unit})", "loss", "loss vs bound", f"pow2 held-out ({unit})", "pow2 vs optimum"),
              rows)]
    blocks += [Paragraph(f"K = {h.k}: {m}", lead="note: ") for h in checks for m in h.messages]
    return blocks


# ---------------------------------------------------------------- audit


def warmup_cell(graphs: int | None, compile_ms: float | None) -> str:
    """Warm-up time of a side's graphs: graphs x compile_ms in device mode ("-" where either is unknown)."""
    return "-" if graphs is None or compile_ms is None else f"{graphs * compile_ms / 1000:.4g} s"


def side_cells(side: Side, device: bool, compile_ms: float | None = None) -> tuple[str, ...]:
    cells = [side.label, fmt(side.cost)]
    if device:
        cells.append(f"{float(device_hours(side.cost)):.4g}" if side.cost is not None else "-")
    cells += [fmt(side.pad_ratio, "pad_ratio"), fmt(side.p95_latency_ms), fmt(side.sequential_ms),
              str(side.n_shapes), "-" if side.graphs is None else str(side.graphs),
              warmup_cell(side.graphs, compile_ms), shapes_text(side.shapes), "yes" if side.ok else "NO"]
    return tuple(cells)


def graphs_paragraph(result: AuditResult) -> Paragraph:
    """What the graph counts are, and (outside device mode) that the batch is free."""
    what = ("the ones each side's plans run, one per distinct (batch size, shape) and decode context"
            if result.fmt in NEUTRAL_FORMATS else
            f"what the stack compiles, today's by its rules from the {result.fmt} config, the optimised side's from "
            f"its {result.fmt} export (exactly its plans' graphs)")
    free = ("; warm-up = graphs x the profile's compile_ms" if result.device else
            "; the cost mode leaves the batch free, so every distinct (batch size, shape) a plan runs counts as a "
            "graph, and warm-up needs a device profile's compile_ms")
    return Paragraph(f"{what}{free}.", lead="Graphs: ")


def audit_blocks(result: AuditResult, source: str, config_source: str) -> list[Block]:
    """Today's shapes beside the optimised ones, the saving first."""
    today, opt = result.sides
    head = ["shapes", f"cost ({cost_unit(result.problem.cost)})"]
    if result.device:
        head.append("device-hours")
    head += ["pad ratio", "P95 ms (worst bucket)", "sequential ms", "compiled shapes", "graphs", "warm-up",
             "shape list", "meets limits"]
    share = f" ({result.saving_share:.2%})" if result.saving_share is not None else ""
    saving_row = ["saving (today - optimised)", fmt(result.saving) + share]
    if result.device:
        saving_row.append(f"{float(device_hours(result.saving)):.4g}" if result.saving is not None else "-")
    saving_row += ["", "", "", "", "", "", "", ""]
    n = sum(len(b) for b in result.problem.buckets)
    where = ("the held-out part" if result.holdout is not None else "the same traffic")
    blocks: list[Block] = [
        Heading(f"Shape audit: {source}", 1),
        Paragraph(saving_sentence(result), lead="Saving: "),
        Paragraph(f"{counted(n, 'request')} in {counted(len(result.problem.buckets), 'bucket')}, "
                  f"cost model {result.problem.cost.name}, "
                  f"planner {result.solver}, at most K = {result.k} shapes on both sides; today's shapes from "
                  f"{config_source} ({len(result.config)}: {shapes_text(result.config)}), both judged on {where}."),
        Table(tuple(head), (side_cells(today, result.device, result.compile_ms),
                            side_cells(opt, result.device, result.compile_ms), tuple(saving_row))),
        graphs_paragraph(result)]
    if result.holdout is not None:
        blocks += holdout_blocks(result.holdout)
    return blocks


def saving_sentence(result: AuditResult) -> str:
    today, opt = result.sides
    if result.saving is None:
        return "no comparison (a side has no evaluated plan)."
    unit = f" device-ms ({device_units(abs(result.saving), result.problem.cost)})" if result.device else " cost units"
    verb = "save" if result.saving >= 0 else "cost"
    return (f"{opt.label} would {verb} {fmt(abs(result.saving))}{unit}, {abs(result.saving_share or 0):.2%} of "
            f"today's cost {fmt(today.cost)}, with {counted(opt.n_shapes, 'compiled shape')}{graphs_note(opt)} against "
            "today's "
            f"{today.n_shapes}{graphs_note(today)}.")


def graphs_note(side: Side) -> str:
    """" (12 graphs)" beside a side's shape count, or nothing when its graphs are not counted."""
    return "" if side.graphs is None else f" ({counted(side.graphs, 'graph')})"


AUDIT_REPORT_FILES = ("report.md", "report.html", "heatmap.png")


def write_audit_report(folder: Path, result: AuditResult, source: str, config_source: str) -> tuple[Path, Path]:
    """report.md, report.html and heatmap.png (both shape sets over the traffic), written together."""
    write_together(audit_report_files(folder, result, source, config_source))
    return folder / "report.md", folder / "report.html"


def audit_tables(result: AuditResult) -> dict[str, DataTable]:
    """Both sides of the audit as data, with units (--json)."""
    unit = cost_unit(result.problem.cost)
    rows = []
    for side in result.sides:
        rows.append((side.label, side.cost, None if side.cost is None or not result.device else
                     float(device_hours(side.cost)), side.pad_ratio, side.p95_latency_ms, side.sequential_ms,
                     side.n_shapes, side.graphs, None if side.graphs is None or result.compile_ms is None else
                     side.graphs * result.compile_ms / 1000.0, list(side.shapes), side.ok))
    return {"sides": DataTable(("side", "cost", "device_hours", "pad_ratio", "p95_latency_ms", "sequential_ms",
                                "compiled_shapes", "graphs", "warmup_s", "shapes", "meets_limits"),
                               ("", unit, "device-hours", "pad tokens / real tokens", "ms", "ms", "shapes",
                                "graphs", "s", "tokens", ""), tuple(rows))}


def audit_report_files(folder: Path, result: AuditResult, source: str, config_source: str
                       ) -> dict[Path, list[bytes]]:
    """report.md, report.html and heatmap.png (both shape sets over the traffic) as bytes, to write together."""
    today, opt = result.sides
    hists = [build_histogram(b) for b in result.problem.buckets]
    used = today.shapes if today.cost is not None else None  # the legend counts what today's plan uses too
    fig = heatmap_figure(result.problem, hists, None, ((today.label, result.config, used), (opt.label, opt.shapes)))
    png = folder / "heatmap.png"
    image = Image(png, f"Requests over (aligned prompt, gen_len), log counts; lines: today's shapes (from "
                       f"{config_source}) and the {opt.label}.", png_bytes(fig))
    blocks = [*audit_blocks(result, source, config_source), Heading("Traffic and both shape sets"), image]
    md, page = folder / "report.md", folder / "report.html"
    return {md: [to_markdown(blocks, folder).encode("utf-8")],
            page: [to_html(blocks, f"Shape audit: {source}").encode("utf-8")],
            png: [image.data]}
