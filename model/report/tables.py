"""Plain-text tables: one per bucket, metrics beside limits and margins."""

from __future__ import annotations

from model.base.numbers import counted
from model.cost.device import device_hours
from model.cost.metrics import Metrics
from model.cost.model import CostModel
from model.domain.schema import BucketResult, Violation, Windowing

METRIC_ROWS = ("cost", "pad_ratio", "p95_latency_ms", "sequential_ms")
METRIC_UNITS = {"pad_ratio": "pad/real", "p95_latency_ms": "ms", "sequential_ms": "ms"}  # cost: the mode's unit


def cost_unit_text(cost: CostModel | None) -> str:
    """The unit a cost is in: device-ms in device mode; the analytic modes' cost has no physical unit."""
    return "device-ms" if cost is not None and cost.device_time else "cost units"


def fmt(value: float | None, name: str = "") -> str:
    """Numbers as a person reads them: ratios with 4 decimals, the rest in 4 significant digits."""
    if value is None:
        return "-"
    if name == "pad_ratio":
        return f"{value:.4f}"
    if value == 0 or 1e-3 <= abs(value) < 1e6:
        return f"{value:,.1f}" if abs(value) >= 100 else f"{value:.4g}"
    return f"{value:.4e}"


def device_units(ms: float, cost: CostModel | None) -> str:
    """Device time as people plan it: device-hours beside the ms, and money where the profile has a price per
    device-hour ("" in the analytic modes, whose cost has no unit)."""
    if cost is None or not cost.device_time:
        return ""
    params = cost.params
    hours = float(device_hours(ms))
    text = f"{hours:,.4g} device-hours"
    if params.cost_per_device_hour is not None:
        text += f", {hours * params.cost_per_device_hour:,.2f} at {params.cost_per_device_hour:g} per device-hour"
    return text


def seconds(ms: float) -> str:
    """A warm-up in seconds as a person reads it."""
    return f"{fmt(ms / 1000.0)} s"


def graph_summary(graphs, cost: CostModel | None) -> str:
    """The graph count and its warm-up (compile time x graphs), the words beside a shape count."""
    n = len(graphs)
    text = f"{n} graph{'s' if n != 1 else ''}"
    return text if cost is None else f"{text} (warm-up {seconds(cost.warmup_ms(n))})"


def graph_line(m: Metrics, cost: CostModel | None) -> str:
    """What the graphs are: with batch buckets the (bucket, shape) pairs the plan runs; where the batch is free,
    that a graph is a distinct (batch size, shape) the plan runs, which a static-batch stack would compile."""
    each = "" if cost is None else f", {seconds(cost.spike_ms)} to compile each"
    if cost is not None and cost.batch_buckets is not None:
        pairs = ", ".join(f"({b}, {s})" for b, s in m.graphs)
        return (f"  graphs (batch bucket, shape): {pairs}; batch buckets "
                f"{', '.join(map(str, cost.batch_buckets))}{each}")
    mode = f"in {cost.name} mode " if cost is not None else ""
    return (f"  graphs: the batch is free {mode}(no batch buckets): one graph per distinct (batch size, shape) "
            f"the plan runs, what a static-batch stack would compile{each}")


def graph_totals(results: list[BucketResult], cost: CostModel | None) -> str:
    """The closing count of what the plans compile across all buckets: distinct graphs and their warm-up."""
    graphs = sorted(set().union(*(set(r.metrics.graphs) for r in results if r.metrics)))
    free = "" if cost is not None and cost.batch_buckets is not None else \
        " (the batch is free: one per distinct batch size and shape)"
    return f"compiled graphs across all buckets: {graph_summary(graphs, cost)}{free}"


def bucket_table(result: BucketResult, extra: dict[str, str] | None = None,
                 cost: CostModel | None = None, windowing: Windowing | None = None) -> str:
    """One bucket's table: each metric, its limit, the margin, and whether it holds, with the shapes and the
    graphs the plan compiles (device mode: the cost in device-hours too; with arrival windows, what the
    latency includes)."""
    lines = [f"bucket {result.name}"]
    m = result.metrics
    if m is not None:
        lines[0] += (f": {counted(m.n_requests, 'request')}, {counted(m.n_batches, 'batch', 'batches')}, "
                     f"{counted(len(m.shapes), 'shape')} "
                     f"[{', '.join(map(str, m.shapes))}], {graph_summary(m.graphs, cost)}")
        checks = {c.metric: c for c in result.checks}
        unit = cost_unit_text(cost)
        lines.append(f"  {'metric':<16}{'unit':<14}{'value':>14}{'limit':>14}{'margin':>14}  ok")
        for name in METRIC_ROWS:
            c = checks.get(name)
            value = m.value(name)
            head = f"  {name:<16}{unit if name == 'cost' else METRIC_UNITS[name]:<14}"
            if c is None:
                lines.append(f"{head}{fmt(value, name):>14}{'-':>14}{'-':>14}  -")
            else:
                sign = "+" if c.margin >= 0 else ""
                lines.append(f"{head}{fmt(value, name):>14}{fmt(c.limit, name):>14}"
                             f"{sign + fmt(c.margin, name):>14}  {'yes' if c.ok else 'NO'}")
        lines.append(f"  breakdown ({unit}): prefill {fmt(m.prefill_cost)}, decode {fmt(m.decode_cost)}, "
                     f"overhead {fmt(m.overhead_cost)}, compile {fmt(m.compile_cost)}")
        lines.append(graph_line(m, cost))
        units = device_units(m.cost, cost)
        if units:
            lines.append(f"  device time: {fmt(m.cost)} ms = {units}")
        if windowing is not None:
            lines.append(f"  latency: p95_latency_ms includes each member's wait from arrival to the end of its "
                         f"{windowing.seconds:g} s window; sequential_ms does not (device time only)")
    for key, value in (extra or {}).items():
        lines.append(f"  {key}: {value}")
    for v in result.violations:
        lines.append(f"  INVALID {v.rule}: {v.message}")
    return "\n".join(lines)


def verdict(results: list[BucketResult], global_problems: list[Violation]) -> str:
    """The closing line: valid and within limits, or what failed."""
    failed = [r.name for r in results if not r.ok]
    lines = [f"INVALID {v.rule}: {v.message}" for v in global_problems]
    if failed or global_problems:
        lines.append(f"FAIL: {', '.join(failed) or 'all buckets'} break a rule or a limit")
    else:
        lines.append("OK: every plan is valid and meets every limit")
    return "\n".join(lines)
