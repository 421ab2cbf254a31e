"""Graphs in device mode (issue 19's targets), a section of ``scripts/bench.py``.

Each Azure trace alone, priced by the shared profile, K = 8, ``--batch-buckets auto
--limit-graphs 16``.  Rows:

- ``mip``: the planner choosing shapes, batch buckets and batching under the graph cap.
- ``dpfill``: the dpfill packer choosing among the same candidate buckets (no cap of its own).
- ``dpfill same``: dpfill under the MIP's buckets and shapes (the MIP must cost no more).
- the stacks' own defaults at the MIP export's server settings (``--max-num-batched-tokens``,
  ``--max-num-seqs``, ``--max-model-len``, block size, Gaudi's ``VLLM_PROMPT_BS_BUCKET_MAX``):
  Gaudi ``exp``, NxD Inference's powers of two, TPU powers of two; their graphs are what each stack's importer
  (``model.serving``) says it compiles, and their device-hours the traffic planned by the
  MIP within their shapes and batch ladder (every (batch, shape) pair of their ladders
  taken as present: a low estimate of what they cost).

``graphs`` is the planner's count -- one per distinct (batch bucket, shape) a plan runs --
for the planner rows and the stack's own count for the defaults; ``stack`` gives, for
the MIP, what each stack compiles from its export, read back by ``model.export --check``
(exit 0: exactly the planned graphs).  warm-up = graphs x compile_ms.
"""

from __future__ import annotations

import contextlib
import io
import json
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

from model import export, pipeline
from model.base.errors import InfeasibleError, InputError, NoPlanFound
from model.cost.device import device_hours
from model.cost.model import DeviceCost
from model.domain.schema import Limits, Problem
from model.domain.shapeset import check_fits
from model.load.profile import load_profile
from model.load.requests import Columns, load_requests
from model.planning.bucket_choice import auto_problem, with_buckets
from model.serving.formats import compile_config
from model.serving.settings import parse_flag

EXPORT_FORMATS = ("gaudi-file", "gaudi-env", "vllm-tpu", "nxdi", "vllm-neuron", "json")
GRAPH_CAP = 16


@dataclass(frozen=True)
class GraphRow:
    """One line of the table."""

    planner: str
    graphs: int
    warmup_s: float
    device_h: float
    pad: float
    ok: bool
    note: str = ""


def graph_problem(data: Path, trace: str, profile: Path, cap: int = GRAPH_CAP) -> Problem:
    """One Azure trace alone, device mode, K = 8, the planner choosing the batch buckets under ``cap`` graphs."""
    bucket = load_requests(data / "traces" / f"AzureLLMInferenceTrace_{trace}.csv", trace, Columns.parse("azure"))
    return auto_problem(Problem((bucket,), (Limits(),), 8, DeviceCost(load_profile(profile)), max_graphs=cap))


def row_of(name: str, run: pipeline.Run, compile_ms: float, graphs: int | None = None, note: str = "") -> GraphRow:
    """A planner's run as a row: its own graph count unless the stack's is given."""
    m = run.evaluation.results[0].metrics
    count = len(m.graphs) if graphs is None else graphs
    return GraphRow(name, count, count * compile_ms / 1000.0, float(device_hours(m.cost)), m.pad_ratio,
                    run.evaluation.ok, note)


def write_case(folder: Path, problem: Problem, run: pipeline.Run) -> tuple[Path, Path]:
    """The plans (as model.solve writes them) and their requests as JSONL, for model.export."""
    plans = folder / "plans"
    pipeline.write(plans, problem, run.plans)
    b = problem.buckets[0]
    req = folder / f"{b.name}.jsonl"
    req.write_text("".join(json.dumps({"request_id": str(i), "prompt_len": int(p), "gen_len": int(g)}) + "\n"
                           for i, p, g in zip(b.request_ids, b.prompt_len, b.gen_len, strict=True)))
    return plans, req


def quiet_main(argv: list[str]) -> tuple[int | str, str]:
    """model.export's main in process: (exit status or the one-line error, its output)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        try:
            return export.main(argv), out.getvalue()
        except InputError as exc:
            return str(exc), out.getvalue()


def export_checks(folder: Path, problem: Problem, run: pipeline.Run, profile: Path) -> tuple[dict[str, str], dict]:
    """Per format: the export's stack count and whether ``model.export --check`` finds it exactly the plans'
    graphs (or why the format refuses); and the server settings of the gaudi-file export."""
    plans, req = write_case(folder, problem, run)
    buckets = ",".join(map(str, problem.cost.batch_buckets))
    common = ["--requests", str(req), "--device-profile", str(profile), "--batch-buckets", buckets]
    out: dict[str, str] = {}
    settings: dict[str, int] = {}
    for fmt in EXPORT_FORMATS:
        target = folder / f"config.{fmt}"
        code, _ = quiet_main(["--plans", str(plans), "--format", fmt, "--out", str(target), *common])
        if code != 0:
            out[fmt] = f"refused ({str(code).split(': ', 2)[-1][:70]}...)"
            continue
        code, _ = quiet_main(["--check", str(target), "--format", fmt, "--plans", str(plans), *common])
        graphs = compile_config(target, fmt).graphs
        out[fmt] = f"{len(graphs)} graphs, --check {'exact' if code == 0 else 'DIFFERENT'}"
        if fmt == "gaudi-file":
            settings = dict(compile_config(target, fmt).settings)
    return out, settings


def default_configs(settings: dict[str, int], top_shape: int) -> dict[str, tuple[str, str, tuple[int, ...]]]:
    """The stacks' defaults at the MIP export's server settings: name -> (format, config text, the batch ladder
    its graphs run at)."""
    seqs, budget, model_len = settings["max_num_seqs"], settings["max_num_batched_tokens"], settings["max_model_len"]
    pow2 = tuple(sorted({1 << k for k in range(seqs.bit_length()) if 1 << k < seqs} | {seqs}))
    nxdi = json.dumps({"max_context_length": top_shape, "seq_len": model_len, "batch_size": seqs,
                       "enable_bucketing": True})
    return {
        "gaudi exp": ("gaudi-env", "VLLM_BUCKETING_STRATEGY=exp\n", ()),
        "nxdi pow2": ("nxdi", nxdi, (seqs,)),
        "tpu pow2": ("vllm-tpu", f"MAX_NUM_BATCHED_TOKENS={budget}\n", pow2),
    }


def default_row(name: str, fmt: str, text: str, ladder: tuple[int, ...], problem: Problem, flags: str,
                compile_ms: float, time_limit: float) -> GraphRow | str:
    """A stack default priced on the traffic: the MIP within its shapes and batch ladder, its stack's count."""
    try:
        compiled = compile_config(Path(f"<{name}>"), fmt, parse_flag(flags), text=text)
    except InputError as exc:
        return f"{name}: {exc}"
    if compiled.graphs is None:
        return f"{name}: graphs not countable ({'; '.join(compiled.notes)})"
    shapes = tuple(sorted({-(-g.value // 64) * 64 for g in compiled.lengths}))
    if not ladder:  # gaudi: the batch values of its prompt graphs
        ladder = tuple(sorted({g.dims[0] for g in compiled.graphs if g.kind == "prompt"}))
    within = replace(with_buckets(problem, ladder), allowed_shapes=shapes, max_shapes=len(shapes), max_graphs=None)
    what = f"{len(shapes)} shapes, batch ladder {', '.join(map(str, ladder))}"
    try:
        check_fits(within)  # a default whose longest shape is shorter than a prompt names the request
        run = pipeline.run(within, "mip", time_limit=time_limit)
    except (InputError, InfeasibleError, NoPlanFound) as exc:  # a default that cannot run the traffic says so
        count = len(compiled.graphs)
        return GraphRow(name, count, count * compile_ms / 1000.0, float("nan"), float("nan"), False,
                        f"{what}; cannot run the traffic: {str(exc).split('; ')[0][-150:]}")
    return row_of(name, run, compile_ms, len(compiled.graphs), what)


def graph_table(problem: Problem, profile: Path, time_limit: float) -> None:
    """The rows, the MIP's exports read back, and the targets."""
    compile_ms = problem.cost.params.compile_ms
    t0 = time.perf_counter()
    mip = pipeline.run(problem, "mip", time_limit=time_limit)
    chosen = pipeline.planned_problem(problem, mip.planned)
    rep = mip.planned.report
    shapes = tuple(sorted({int(s) for s in mip.evaluation.results[0].metrics.shapes}))
    rows = [row_of("mip", mip, compile_ms, note=f"buckets {', '.join(map(str, chosen.cost.batch_buckets))}; "
                   f"gap {rep.gap:.2%}, {time.perf_counter() - t0:.0f} s" if rep.gap is not None else "")]
    dp_auto = pipeline.run(problem, "dpfill")
    dp_buckets = pipeline.planned_problem(problem, dp_auto.planned).cost.batch_buckets
    rows.append(row_of("dpfill", dp_auto, compile_ms, note=f"buckets {', '.join(map(str, dp_buckets))}"))
    same = pipeline.run(replace(chosen, allowed_shapes=shapes), "dpfill")
    rows.append(row_of("dpfill same", same, compile_ms, note="the MIP's buckets and shapes"))
    with tempfile.TemporaryDirectory(prefix="shapeplan-graphs-") as tmp:
        exports, settings = export_checks(Path(tmp), chosen, mip, profile)
    flags = ",".join(f"{k}={v}" for k, v in settings.items() if k in ("max_num_batched_tokens", "max_num_seqs",
                                                                     "max_model_len", "block_size",
                                                                     "prompt_bs_bucket_max"))
    defaults = []
    for name, (fmt, text, ladder) in default_configs(settings, shapes[-1]).items():
        got = default_row(name, fmt, text, ladder, problem, flags, compile_ms, time_limit / 2)
        defaults.append((name, fmt, got))
        if isinstance(got, GraphRow):
            rows.append(got)
    print(f"  {'planner':<12}{'graphs':>7}{'warm-up s':>11}{'device-h':>10}{'pad':>8}  ok   note")
    for r in rows:
        print(f"  {r.planner:<12}{r.graphs:>7}{r.warmup_s:>11.0f}{r.device_h:>10.4f}{r.pad:>8.3f}  "
              f"{'yes' if r.ok else 'NO ':<4} {r.note}")
    for name, _, got in defaults:
        if not isinstance(got, GraphRow):
            print(f"  {got}")
    print(f"  server settings (the MIP's gaudi-file export): {flags}")
    print("  the MIP's exports: " + "; ".join(f"{fmt} {text}" for fmt, text in exports.items()))
    mine = rows[0]
    stack_of = {"gaudi exp": "gaudi-file", "nxdi pow2": "nxdi", "tpu pow2": "vllm-tpu"}
    for name, fmt, got in defaults:
        if not isinstance(got, GraphRow):
            continue
        ours = exports.get(stack_of[name], "")
        count = int(ours.split()[0]) if ours and ours[0].isdigit() else None
        verdict = ("yes" if count is not None and count < got.graphs else "NO") if count is not None else \
            f"not comparable ({ours or 'no export'}); planner graphs {mine.graphs} vs {got.graphs}: " \
            f"{'yes' if mine.graphs < got.graphs else 'NO'}"
        print(f"  target: fewer graphs than {name}: {count if count is not None else '-'} vs {got.graphs} "
              f"({stack_of[name]} count): {verdict}")
    print(f"  target: no more device-hours than dpfill with the same graphs: {mine.device_h:.4f} vs "
          f"{rows[2].device_h:.4f}: {'yes' if mine.device_h <= rows[2].device_h * (1 + 1e-12) else 'NO'}")
    exact = all("exact" in t for t in exports.values() if not t.startswith("refused"))
    print(f"  target: every export read back by model.export --check compiles exactly the planned graphs: "
          f"{'yes' if exact else 'NO'}")
