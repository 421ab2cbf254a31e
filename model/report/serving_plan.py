"""What ``model.solve --cost-model serving`` prints and writes: the chosen set, its settings, the replay, the MIP.

The numbers that describe the server are the final replay's (``model.report.serving``
prints them as ``model.replay`` does).  The MIP's bound is printed as what it is: a
bound over the recorded demands of one round and the candidate grid, never a bound on
the replay.
"""

from __future__ import annotations

from model.report.serving import settings_text, summary_doc, summary_lines
from model.serveplan.plan import Attempt, ServingPlan, recorded_gap_text


def attempt_line(a: Attempt) -> str:
    """One cap's outcome in a line: rounds, stability, busy time of the final replay or why it was refused."""
    what = f"prefill cap {a.cap}" if a.settings is None or a.settings.stack == "gaudi" else "ctx batch " + str(a.cap)
    if a.slowdown is not None:
        what += f", steps at most {a.slowdown:g} x their own size's time"
    rounds = ", ".join(f"{r.busy_ms / 3.6e6:.4f} h" + (f" ({r.compiles} run-time compiles)" if r.compiles else "")
                       for r in a.rounds)
    state = "stable" if a.stable else "not stable"
    tail = (f"final replay busy {a.summary.busy_device_hours:.4f} device-hours" if a.summary is not None else "")
    verdict = "accepted" if a.accepted else f"refused: {a.reason}"
    return f"{what}: rounds busy {rounds}; {state}; {tail + '; ' if tail else ''}{verdict}"


def plan_lines(plan: ServingPlan) -> list[str]:
    """The search, then the chosen set with its settings and its replay."""
    lines = ["serving plan search (replay -> step demands -> MIP -> replay, until the set is stable):"]
    lines += ["  " + attempt_line(a) for a in plan.attempts]
    if plan.timed_out:
        lines.append("  (stopped by --time-limit)")
    best = plan.best
    if best is None:
        return lines
    g = best.graphs
    lines.append(f"chosen: {settings_text(best.settings, g)}")
    if g.stack == "gaudi":
        lines.append(f"prompt graphs ({len(g.prompt)}): {' '.join(f'({b},{s})' for b, s in g.prompt)}")
        lines.append(f"decode graphs ({len(g.decode)}): {' '.join(f'({b},{x})' for b, x in g.decode)}")
    else:
        lines.append(f"context buckets ({len(g.context)}): {' '.join(map(str, g.context))}")
        lines.append(f"token-generation buckets ({len(g.token_generation)}): "
                     f"{' '.join(map(str, g.token_generation))}")
    lines.append("the replay of the chosen set (what the server does; this is the reported result):")
    lines += ["  " + line for line in summary_lines(best.summary, g)]
    lines.append(recorded_gap_text(best.mip) + ("" if best.mip is None or best.mip.objective is None else
                 f"; recorded demands' busy time {best.mip.objective:.1f} ms, bound {best.mip.bound:.1f} ms"
                 if best.mip.bound is not None else ""))
    return lines


def plan_doc(plan: ServingPlan) -> dict:
    """The chosen set, its settings and its replay (the replay's JSON object), and the search: the serving
    plan's own keys of the command's --json document (docs/json.md)."""
    best = plan.best
    doc: dict = {"attempts": [{"cap": a.cap, "slowdown": a.slowdown, "stable": a.stable, "accepted": a.accepted,
                               "reason": a.reason,
                               "rounds": [{"busy_ms": r.busy_ms, "runtime_compiles": r.compiles,
                                           "demands": r.cells} for r in a.rounds]} for a in plan.attempts],
                 "timed_out": plan.timed_out}
    if best is not None:
        doc["replay"] = summary_doc(best.summary, best.settings, best.graphs)
        m = best.mip
        doc["mip"] = None if m is None else {
            "status": m.status.value, "objective_ms": m.objective, "bound_ms": m.bound, "gap": m.gap,
            "time_s": m.time_s, "backend": m.backend, "version": m.version, "columns": m.columns, "rows": m.rows,
            "certifies": "the recorded step demands of the round that chose the set, over the candidate grid; "
                         "not the replay"}
    return doc
