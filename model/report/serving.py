"""The replay's report: the text a person reads and the JSON a program reads (every number at full precision)."""

from __future__ import annotations

import json
from fractions import Fraction

from model.domain.server import GraphSet, ServerSettings
from model.evaluation.replay_metrics import Quantiles, ReplaySummary

SHOWN_COMPILES = 20  # run-time compiles listed in the text; the JSON lists them all


def _num(value: float | None) -> str:
    """A number with 10 significant digits (enough to check a test vector by eye), '-' for none."""
    return "-" if value is None else f"{value:.10g}"


def _quantiles(q: Quantiles) -> str:
    return f"p50 {_num(q.p50)}   p95 {_num(q.p95)}   p99 {_num(q.p99)}"


def settings_text(settings: ServerSettings, graphs: GraphSet) -> str:
    """The server settings the replay ran under (defaults resolved)."""
    parts = [f"stack {settings.stack}", f"max_num_seqs {settings.max_num_seqs}",
             f"max_num_batched_tokens {settings.max_num_batched_tokens}"]
    if settings.stack == "gaudi":
        parts += [f"block_size {settings.block_size}", f"max_prefill_seqs {settings.prefill_cap(graphs)}"]
    else:
        parts.append(f"ctx_batch_size {settings.ctx_batch_size}")
    return ", ".join(parts)


def graphs_text(graphs: GraphSet) -> str:
    """How many graphs of each kind the set compiles before serving."""
    if graphs.stack == "gaudi":
        kinds = f"prompt {len(graphs.prompt)}, decode {len(graphs.decode)}"
        if graphs.unused:
            kinds += f", {graphs.unused} prompt graphs with context blocks (prefix cache: never run)"
        return kinds
    return f"context {len(graphs.context)}, token generation {len(graphs.token_generation)}"


def summary_lines(s: ReplaySummary, graphs: GraphSet) -> list[str]:
    """The replay's numbers, one line each."""
    busy = f"busy              {_num(s.busy_ms)} device-ms = {s.busy_device_hours:.6g} device-hours"
    if s.cost_per_device_hour is not None:
        busy += f" = {s.busy_device_hours * s.cost_per_device_hour:,.2f} at {s.cost_per_device_hour:g} a device-hour"
    if s.utilisation is not None:
        busy += (f" ({100 * s.utilisation:.1f}% of {s.replicas} replica{'s' if s.replicas > 1 else ''} from the "
                 "first arrival to the last finish)")
    lines = [f"steps             {s.steps} ({s.prompt_steps} with a prompt graph, {s.decode_steps} with a decode "
             "graph)",
             busy,
             f"TTFT ms           {_quantiles(s.ttft)}",
             f"TPOT ms           {_quantiles(s.tpot)}",
             f"E2E ms            {_quantiles(s.e2e)}",
             f"pad ratio         prompt {_num(s.prompt_pad_ratio)}   decode {_num(s.decode_pad_ratio)}",
             f"graphs            {s.graphs} compiled before serving ({graphs_text(graphs)}): warm-up "
             f"{_num(s.warmup_ms / max(s.replicas, 1))} ms a replica, {_num(s.warmup_ms)} device-ms in all"]
    lines.append(f"run-time compiles {len(s.runtime_compiles)}" + (
        f" ({_num(s.runtime_compile_ms)} ms, inside busy):" if s.runtime_compiles else ""))
    for replica, c in s.runtime_compiles[:SHOWN_COMPILES]:
        lines.append(f"  replica {replica} step {c.step} at {_num(c.start_ms)} ms: {c.kind} graph {c.graph}")
    if len(s.runtime_compiles) > SHOWN_COMPILES:
        lines.append(f"  ... {len(s.runtime_compiles) - SHOWN_COMPILES} more (all of them in --json)")
    if s.slo is not None:
        r, q = s.slo, _quantile_text(s.slo.slo.quantile)
        bounds = [f"{name} <= {_num(v)} ms" for name, v in (("TTFT", r.slo.ttft_ms), ("TPOT", r.slo.tpot_ms))
                  if v is not None]
        lines.append(f"SLO               {', '.join(bounds)}: goodput {100 * r.goodput:.2f}% of requests")
        for name, value, met in (("TTFT", r.ttft_at_quantile, r.ttft_met), ("TPOT", r.tpot_at_quantile, r.tpot_met)):
            if met is not None:
                lines.append(f"  {q} {name} {_num(value)} ms: {'met' if met else 'MISSED'}")
    return lines


def _quantile_text(q: Fraction) -> str:
    """0.95 -> "p95", 0.999 -> "p99.9"."""
    return f"p{float(q * 100):g}"


def summary_json(s: ReplaySummary, settings: ServerSettings, graphs: GraphSet) -> str:
    """The summary as JSON: floats as Python writes them (they read back exactly), keys in a fixed order."""
    return json.dumps(summary_doc(s, settings, graphs), indent=2, allow_nan=False) + "\n"


def summary_doc(s: ReplaySummary, settings: ServerSettings, graphs: GraphSet) -> dict:
    """The replay's numbers as a JSON object (the replay's own keys of docs/json.md)."""

    def quant(q: Quantiles) -> dict:
        return {"p50": q.p50, "p95": q.p95, "p99": q.p99}

    doc: dict = {
        "stack": s.stack, "requests": s.requests, "replicas": s.replicas,
        "server": {"max_num_seqs": settings.max_num_seqs, "max_num_batched_tokens": settings.max_num_batched_tokens,
                   **({"block_size": settings.block_size, "max_prefill_seqs": settings.prefill_cap(graphs)}
                      if settings.stack == "gaudi" else {"ctx_batch_size": settings.ctx_batch_size})},
        "steps": s.steps, "prompt_steps": s.prompt_steps, "decode_steps": s.decode_steps,
        "busy_ms": s.busy_ms, "busy_device_hours": s.busy_device_hours, "span_ms": s.span_ms,
        "utilisation": s.utilisation,
        "ttft_ms": quant(s.ttft), "tpot_ms": quant(s.tpot), "e2e_ms": quant(s.e2e),
        "prompt_pad_ratio": s.prompt_pad_ratio, "decode_pad_ratio": s.decode_pad_ratio,
        "graphs": {"count": s.graphs, "warmup_ms_per_replica": s.warmup_ms / max(s.replicas, 1),
                   "warmup_ms": s.warmup_ms, **_graph_lists(graphs)},
        "runtime_compiles": {"count": len(s.runtime_compiles), "ms": s.runtime_compile_ms,
                             "graphs": [{"replica": r, "step": c.step, "start_ms": c.start_ms, "kind": c.kind,
                                         "graph": list(c.graph)} for r, c in s.runtime_compiles]},
    }
    if s.cost_per_device_hour is not None:
        doc["cost"] = s.busy_device_hours * s.cost_per_device_hour
    if s.slo is not None:
        r = s.slo
        doc["slo"] = {"ttft_ms": r.slo.ttft_ms, "tpot_ms": r.slo.tpot_ms, "quantile": float(r.slo.quantile),
                      "goodput": r.goodput, "ttft_at_quantile": r.ttft_at_quantile,
                      "tpot_at_quantile": r.tpot_at_quantile, "ttft_met": r.ttft_met, "tpot_met": r.tpot_met}
    return doc


def latency_table(s: ReplaySummary):
    """TTFT, TPOT and end-to-end latency percentiles as a table with units (--json)."""
    from model.report.json_doc import DataTable

    return DataTable(("metric", "p50", "p95", "p99"), ("", "ms", "ms", "ms"),
                     tuple((name, q.p50, q.p95, q.p99) for name, q in (("ttft", s.ttft), ("tpot", s.tpot),
                                                                         ("e2e", s.e2e))))


def _graph_lists(graphs: GraphSet) -> dict:
    """The graph set in the replay's json schema (``model.serving.graphs``), so it can be fed back."""
    if graphs.stack == "gaudi":
        return {"prompt": [list(g) for g in graphs.prompt], "decode": [list(g) for g in graphs.decode],
                "unused": graphs.unused}
    return {"context": list(graphs.context), "token_generation": list(graphs.token_generation)}
