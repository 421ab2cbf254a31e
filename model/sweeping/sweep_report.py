"""The sweep report: report.md and a self-contained report.html built from the sweep's rows.

The first screen is the recommendation and why: which K, what it costs, what it saves
over the rule a stack compiles by default (pow2, at the same K), and which limits hold
each bucket's cost up.  The blocks and
their renderings are ``model.report.document``'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from model.domain.schema import LimitCheck, Limits, Problem
from model.histogram.cells import Histogram
from model.load.outputs import write_together
from model.report.document import (
    Block,
    Heading,
    Image,
    Paragraph,
    Table,
    input_summary,
    summary_table,
    to_html,
    to_markdown,
)
from model.report.plots import heatmap_figure, png_bytes
from model.report.tables import fmt
from model.sweeping.grid import SweepPoint, SweepSettings, base_factor
from model.sweeping.recommend import Recommendation, recommend
from model.sweeping.runner import MIP, SweepResult, SweepRow
from model.sweeping.sweep_plots import plot_breakdown, plot_cost_vs_k, plot_tradeoff
from model.sweeping.table import PlannerTotal, planner_totals


def settings_table(settings: SweepSettings) -> Table:
    """How the numbers were made."""
    ks = settings.ks
    rows = [("input", settings.source), ("cost model", settings.mode),
            ("shape caps K", f"{ks[0]}..{ks[-1]}" if list(ks) == list(range(ks[0], ks[-1] + 1)) else
             ", ".join(map(str, ks))),
            ("swept limit", f"{settings.sweep_limit} x {', '.join(f'{f:g}' for f in settings.factors)}"
             if settings.sweep_limit else "none (limits as given)"),
            ("planners", ", ".join(settings.solvers)),
            ("MIP backend, time limit for the whole sweep", f"{settings.backend}, {settings.time_limit:g} s"),
            ("K tolerance (recommend the smallest K within it)", f"{settings.tolerance:.1%}"),
            ("a limit binds when its margin is below", f"{settings.bind_threshold:.0%} of the limit")]
    return Table(("setting", "value"), tuple(rows))


def with_unit(value: float | None, unit: str) -> str:
    """A cost with its unit, and device-hours beside device-ms ("" unit: the number alone)."""
    if value is None or not unit:
        return fmt(value)
    hours = f" = {value / 3.6e6:,.4g} device-hours" if unit == "device-ms" else ""
    return f"{fmt(value)} {unit}{hours}"


def recommendation_paragraphs(rec: Recommendation, unit: str = "") -> list[Paragraph]:
    """The first screen: what to compile, what it costs, what it saves, how sure the bound makes us."""
    if rec.point is None:
        return [Paragraph("no planner met every limit at any K of the sweep; loosen a limit or widen the K range.",
                          "No recommendation: ")]
    limits = f" at {rec.point.limit} x{rec.point.factor:g}" if rec.point.limit else ""
    text = (f"compile K = {rec.point.k} shapes ({', '.join(map(str, rec.shapes))}) with the {rec.planner} "
            f"plan{limits}. Expected total cost {with_unit(rec.cost, unit)}")
    if rec.bound is not None:
        text += f" (certified lower bound {fmt(rec.bound)}, gap {rec.gap:.2%})"
    text += ". Every limit is met."
    out = [Paragraph(text, "Recommendation: ")]
    out.append(Paragraph(stack_saving_text(rec), "Savings: "))
    if rec.rule is not None:
        saving = (f"the best of every packer, {rec.rule.planner} at its best K = {rec.rule.point.k} (cost "
                  f"{fmt(rec.rule.cost)}), is {rec.savings:.1%} dearer than the recommendation")
        if rec.same_k_rule is not None and rec.same_k_rule is not rec.rule:
            saving += (f"; at K = {rec.point.k} the best packer ({rec.same_k_rule.planner}, cost "
                       f"{fmt(rec.same_k_rule.cost)}) is {rec.same_k_savings:.1%} dearer")
        out.append(Paragraph(saving + " (shapeplan's own packers: no stack runs them; they show what a good "
                             "fixed rule could do).", "Packers: "))
    else:
        out.append(Paragraph("no packer meets every limit at any K of the sweep.", "Packers: "))
    if rec.cost <= rec.cheapest_cost * (1 + 1e-9):
        why_k = (f"K = {rec.point.k} is the cheapest shape cap of the sweep; the larger caps swept (up to K = "
                 f"{rec.largest_k}) do not lower the cost." if rec.point.k < rec.largest_k else
                 f"K = {rec.point.k} is the largest cap swept and the cheapest: more shapes may lower the cost "
                 "further (widen --k).")
    else:
        why_k = (f"K = {rec.point.k} is the smallest shape cap within {rec.tolerance:.1%} of the cheapest "
                 f"(K = {rec.cheapest_k}, cost {fmt(rec.cheapest_cost)}, {1 - rec.cheapest_cost / rec.cost:.3%} "
                 "lower); more shapes buy less than that.")
    out.append(Paragraph(why_k, "Why this K: "))
    return out


def stack_saving_text(rec: Recommendation) -> str:
    """The saving against the rule a stack uses by default (pow2), at the same K and at pow2's best K."""
    t = rec.stack_rule
    if t is None:
        return ("pow2, the power-of-two rule stacks compile by default, was not swept (add pow2 to --solvers) "
                "or has no plan at this K.")
    if t.cost is None:
        return f"pow2, the power-of-two rule stacks compile by default, has no plan at K = {rec.point.k} ({t.status})."
    share = rec.stack_savings
    word = "-" if share is None else f"{share:.1%} cheaper" if share >= 0 else f"{-share:.1%} dearer"
    text = (f"{word} than pow2, the power-of-two rule stacks (Neuron, JetStream) compile by default, at the same "
            f"K = {rec.point.k} (cost {fmt(t.cost)}"
            + ("" if t.limits_met else ", but pow2 breaks a limit there: its plan is not one to run") + ")")
    best = rec.stack_rule_best
    if best is not None and best.point != t.point:
        text += (f"; pow2 at its best K = {best.point.k} meeting every limit costs {fmt(best.cost)} "
                 f"({1 - rec.cost / best.cost:.1%} dearer)" if best.cost else "")
    elif best is None:
        text += "; pow2 meets every limit at no K of the sweep"
    return text + "."


def row_checks(row: SweepRow) -> list[LimitCheck]:
    """A row's metrics beside the limits set at its point."""
    limits = Limits(row.max_cost, row.max_pad_ratio, row.max_p95_latency_ms, row.max_sequential_ms)
    return [LimitCheck(metric, float(getattr(row, metric)), bound) for metric, bound in limits.items()]


def relative_margin(check: LimitCheck) -> float:
    """Margin as a share of the limit (a zero limit met exactly has no room: 0)."""
    return check.margin / check.limit if check.limit > 0 else (0.0 if check.ok else -np.inf)


def binding_paragraph(row: SweepRow, threshold: float) -> Paragraph:
    """One bucket: which limits bind (little room left), which are broken, and how much slack the others have."""
    lead = f"{row.bucket}: "
    if row.cost is None:
        return Paragraph(f"no plan ({row.status}). {row.note}", lead)
    plan = f"{row.n_batches} batches on shape{'s' if len(row.shapes.split()) > 1 else ''} {row.shapes}"
    checks = row_checks(row)
    if not checks:
        return Paragraph(f"{plan}; no limits are set, so the plan minimises cost alone.", lead)
    broken = [c for c in checks if not c.ok]
    binding = [c for c in checks if c.ok and relative_margin(c) < threshold]
    slack = [c for c in checks if c.ok and relative_margin(c) >= threshold]
    parts = [plan]
    if broken:
        parts.append("BREAKS " + ", ".join(f"{c.metric} ({fmt(c.value, c.metric)} > {fmt(c.limit, c.metric)})"
                                           for c in broken))
    if binding:
        parts.append(f"binding (under {threshold:.0%} to spare): "
                     + ", ".join(f"{c.metric} ({fmt(c.value, c.metric)} of {fmt(c.limit, c.metric)}, "
                                 f"{relative_margin(c):.2%} to spare)" for c in binding)
                     + " -- the limits to relax first for a cheaper plan")
    else:
        parts.append(f"no limit binds (every margin is at least {threshold:.0%} of its limit)")
    if slack:
        parts.append("slack: " + ", ".join(f"{c.metric} {relative_margin(c):.1%} below its limit" for c in slack))
    return Paragraph("; ".join(parts) + ".", lead)


def k_table(totals: Sequence[PlannerTotal], factor: float, unit: str = "") -> Table:
    """Per K at one factor: the MIP's cost, bound and gap, then every packer's cost ratio to the MIP.

    A ratio is starred when that plan breaks a limit, and "-" means no plan.
    """
    here = [t for t in totals if t.point.factor == factor]
    planners = list(dict.fromkeys(t.planner for t in here))
    packers = [p for p in planners if p != MIP]
    by = {(t.point.k, t.planner): t for t in here}
    rows = []
    for k in sorted({t.point.k for t in here}):
        mip = by.get((k, MIP))
        cells = [str(k)]
        if MIP in planners:
            met = ("yes" if mip.limits_met else "NO") if mip and mip.cost is not None else mip.status if mip else "-"
            cells += [fmt(mip.cost) if mip else "-", fmt(mip.bound) if mip else "-",
                      f"{mip.gap:.2%}" if mip and mip.gap is not None else "-", met]
            if unit == "device-ms":
                cells.insert(2, f"{mip.cost / 3.6e6:,.4g}" if mip and mip.cost is not None else "-")
        for p in packers:
            t = by.get((k, p))
            if t is None or t.cost is None:
                cells.append(t.status if t else "-")
            elif t.ratio_to_mip is not None:
                cells.append(f"{t.ratio_to_mip:.3f}" + ("" if t.limits_met else "*"))
            else:
                cells.append(fmt(t.cost) + ("" if t.limits_met else "*"))
        rows.append(tuple(cells))
    u = f" ({unit})" if unit else ""
    head = ("K", f"MIP cost{u}", *(("MIP device-hours",) if unit == "device-ms" else ()), f"MIP bound{u}", "gap",
            "limits met") if MIP in planners else ("K",)
    return Table((*head, *packers), tuple(rows))


def bucket_table_at(rows: Sequence[SweepRow], point: SweepPoint, unit: str = "") -> Table:
    """Every planner and bucket at one point: cost, ratio to the MIP, pad, P95, sequential time, limits."""
    out = []
    for r in rows:
        if r.point != point:
            continue
        met = "yes" if r.limits_met else f"NO ({r.broken.replace(';', ', ')})" if r.cost is not None else r.status
        out.append((r.bucket, r.planner, fmt(r.cost), f"{r.ratio_to_mip:.3f}" if r.ratio_to_mip else "-",
                    fmt(r.pad_ratio, "pad_ratio"), fmt(r.p95_latency_ms), fmt(r.sequential_ms),
                    str(r.n_batches) if r.n_batches is not None else "-", r.shapes or "-", met))
    return Table(("bucket", "planner", f"cost ({unit})" if unit else "cost", "ratio to MIP", "pad ratio", "P95 ms",
                  "sequential ms", "batches",
                  "shapes", "limits met"), tuple(out))


def limit_table(rows: Sequence[SweepRow], k: int, planner: str, unit: str = "") -> Table:
    """Along the limit sweep at one K: each bucket's limit value, the plan's sequential time and cost."""
    out = [(f"{r.factor:g}", r.bucket, fmt(r.limit_value), fmt(r.sequential_ms), fmt(r.cost),
            "yes" if r.limits_met else r.status if r.cost is None else "NO")
           for r in rows if r.k == k and r.planner == planner and r.sweep_limit]
    name = next((r.sweep_limit for r in rows if r.sweep_limit), "limit")
    return Table(("factor", "bucket", name, "sequential ms", f"cost ({unit})" if unit else "cost", "limits met"),
                 tuple(out))


def mode_unit(mode: str) -> str:
    """The unit of a cost mode's costs (device mode: device-ms; the analytic modes have none)."""
    return "device-ms" if mode == "device" else "cost units"


def report_point(rec: Recommendation, totals: Sequence[PlannerTotal]) -> SweepPoint:
    """The point the detail tables and pictures show: the recommended one, else the smallest K at the base limits."""
    factor = base_factor(t.point for t in totals)
    return rec.point or min((t.point for t in totals if t.point.factor == factor), key=lambda p: p.k)


REPORT_FILES = ("report.md", "report.html", "cost_vs_k.png", "breakdown.png", "heatmap.png")
TRADEOFF_FILE = "tradeoff.png"  # drawn when a limit is swept


def report_names(sweep_limit: bool) -> tuple[str, ...]:
    """The files a sweep report holds (checked before the sweep runs, written together after it)."""
    return REPORT_FILES + ((TRADEOFF_FILE,) if sweep_limit else ())


def figures(folder: Path, problem: Problem, hists: Sequence[Histogram], result: SweepResult,
            rec: Recommendation) -> list[Image]:
    """Every picture the report shows, at the recommended point (or the base one), as PNG bytes for folder (drawn
    in memory: nothing is on disk until the whole report is)."""
    totals = planner_totals(result.rows)
    point = report_point(rec, totals)
    device = problem.cost.device_time
    recommended = rec.point.k if rec.point is not None else None
    images = [Image(folder / "cost_vs_k.png", "Total cost against the shape cap K (left) and the same as a share "
                    "above the cheapest plan of the sweep (right); shaded: between the MIP's certified lower bound "
                    "and its cost; dashed green: the recommended K; red crosses: plans that break a limit.",
                    png_bytes(plot_cost_vs_k(totals, None, device=device, recommended=recommended)))]
    images.append(Image(folder / "breakdown.png", f"Where the cost goes, per planner, at {point.label()}.",
                        png_bytes(plot_breakdown(totals, point, None, device=device))))
    images.append(Image(folder / "heatmap.png", "Requests over (aligned prompt, gen_len), log counts; dashed: the "
                        f"compiled shapes, crosses: each batch's (S_max, G_max), MIP plan at {point.label()}.",
                        png_bytes(heatmap_figure(problem, hists, result.mip_batchings.get(point)))))
    if any(r.sweep_limit for r in result.rows):
        images.append(Image(folder / TRADEOFF_FILE, f"Sequential time against cost as "
                            f"{point.limit or 'the limit'} is scaled, K = {point.k}.",
                            png_bytes(plot_tradeoff(result.rows, point.k, None, device=device))))
    return images


def report_blocks(problem: Problem, hists: Sequence[Histogram], result: SweepResult, settings: SweepSettings,
                  images: Sequence[Image]) -> list[Block]:
    """The whole report in reading order: recommendation and why first, then the evidence."""
    rec = recommend(result.rows, settings.tolerance)
    totals = planner_totals(result.rows)
    factor = base_factor(t.point for t in totals)
    blocks: list[Block] = [Heading(f"Shape plan sweep: {settings.source}", 1),
                           *recommendation_paragraphs(rec, mode_unit(settings.mode))]
    if rec.point is not None:
        blocks.append(Heading("Which limits bind, per bucket"))
        blocks += [binding_paragraph(r, settings.bind_threshold) for r in result.rows
                   if r.point == rec.point and r.planner == rec.planner]
    blocks += [*images[:1], Heading("Input"), summary_table(input_summary(problem, hists)),
               Heading("Settings"), settings_table(settings),
               Heading(f"Cost by shape cap{f' ({settings.sweep_limit} x{factor:g})' if settings.sweep_limit else ''}"),
               Paragraph("packer columns are cost / MIP cost over all buckets; * = the plan breaks a limit."),
               k_table(totals, factor, mode_unit(settings.mode))]
    point = report_point(rec, totals)
    unit = mode_unit(settings.mode)
    blocks += [Heading(f"Every planner per bucket at {point.label()}"), bucket_table_at(result.rows, point, unit)]
    if settings.sweep_limit:
        blocks += [Heading(f"Limit sweep at K = {point.k} ({rec.planner or MIP})"),
                   limit_table(result.rows, point.k, rec.planner or MIP, unit)]
    blocks += [Heading("Pictures"), *images[1:]]
    return blocks


def report_files(folder: Path, problem: Problem, hists: Sequence[Histogram], result: SweepResult,
                 settings: SweepSettings, extra: Sequence[Block] = ()) -> dict[Path, bytes]:
    """Every file of the report in folder -- report.md, report.html and the PNGs -- as bytes, drawn and rendered
    in memory so the command writes them together with the CSV (``extra`` blocks follow the recommendation,
    e.g. the hold-out check)."""
    images = figures(folder, problem, hists, result, recommend(result.rows, settings.tolerance))
    blocks = report_blocks(problem, hists, result, settings, images)
    if extra:
        at = next((i for i, b in enumerate(blocks) if isinstance(b, Image)), len(blocks))
        blocks = [*blocks[:at], *extra, *blocks[at:]]
    return {folder / "report.md": to_markdown(blocks, folder).encode("utf-8"),
            folder / "report.html": to_html(blocks, f"Shape plan sweep: {settings.source}").encode("utf-8"),
            **{image.path: image.data for image in images}}


def write_report(folder: Path, problem: Problem, hists: Sequence[Histogram], result: SweepResult,
                 settings: SweepSettings, extra: Sequence[Block] = ()) -> tuple[Path, Path]:
    """Write the report (``report_files``) into folder, every file or none; returns report.md and report.html."""
    files = report_files(folder, problem, hists, result, settings, extra)
    write_together({path: [data] for path, data in files.items()})
    return folder / "report.md", folder / "report.html"
