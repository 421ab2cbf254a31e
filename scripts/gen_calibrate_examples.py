"""Write data/examples/calibrate/: small inputs of every format model.calibrate reads.

    python scripts/gen_calibrate_examples.py [--out data/examples/calibrate]

The step times are synthetic: the shipped OPT-13B / A100 profile (data/profiles, DistServe's
fit) evaluated at each point with 3 % multiplicative noise from a fixed seed, so the files are
the same on every run and a fit of them should come back near that profile.  Formats:

- ``measurements.csv``: ours (phase,batch_size,seq_len,ms), a small profiler sweep;
- ``step-log.csv``: a per-step timing log with its own column names (read with --columns);
- ``nxdi/RUN/benchmark_report.json`` + ``neuron_config.json``: NxD Inference's benchmark report
  (sections and keys as ``neuronx_distributed_inference/utils/benchmark.py`` writes them) and the
  compiled model's config beside it, one folder per batch/length run;
- ``distserve-profile.json`` is not generated: it is a trimmed copy of DistServe's published file
  (see data/examples/calibrate/README.md).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from model.cost.device import decode_ms, prefill_ms
from model.load.profile import load_profile

ROOT = Path(__file__).resolve().parent.parent
PROFILE = ROOT / "data" / "profiles" / "opt13b-a100-tp1.toml"
NOISE = 0.03
# (batch_size, max_context_length, seq_len) of each NxD Inference run
NXDI_RUNS = ((1, 512, 1024), (2, 1024, 2048), (4, 256, 1024), (8, 512, 2048), (16, 1024, 4096), (32, 128, 512))
RUNS_OF_BENCHMARK = 20  # NxD Inference's Benchmark default num_runs


def noisy(ms: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return ms * np.exp(NOISE * rng.standard_normal(np.shape(ms)))


def measurements_csv(prof, rng) -> str:
    rows = ["phase,batch_size,seq_len,ms"]
    for n in (1, 2, 4, 8):
        for s in (128, 256, 512, 1024, 2048):
            rows.append(f"prefill,{n},{s},{float(noisy(prefill_ms(np.array([n]), np.array([s]), prof), rng)[0]):.4f}")
    for n in (1, 4, 16, 32, 64, 96, 128, 192, 256):
        for c in (128, 512, 1024, 2048):
            if prof.kv_capacity_tokens is None or n * c <= prof.kv_capacity_tokens:
                step = decode_ms(np.array([n]), np.array([c]), 1, prof)
                rows.append(f"decode,{n},{c},{float(noisy(step, rng)[0]):.4f}")
    return "\n".join(rows) + "\n"


def step_log_csv(prof, rng) -> str:
    """A serving log: one line per scheduler step, times in seconds, phases as vLLM-style logs name them."""
    rows = ["step,kind,num_seqs,padded_len,elapsed_s,graph"]
    step = 0
    for n, s in ((1, 256), (2, 512), (4, 1024), (1, 2048), (8, 128), (2, 1536), (4, 768)):
        step += 1
        t = float(noisy(prefill_ms(np.array([n]), np.array([s]), prof), rng)[0]) / 1000
        rows.append(f"{step},prompt,{n},{s},{t:.6f},\"({n}, {s})\"")
    for n, c in ((1, 300), (8, 700), (16, 1200), (32, 400), (64, 900), (96, 1500), (128, 600), (160, 1000),
                 (192, 300), (24, 1900), (48, 200), (112, 800), (4, 1600), (256, 250)):
        step += 1
        t = float(noisy(decode_ms(np.array([n]), np.array([c]), 1, prof), rng)[0]) / 1000
        rows.append(f"{step},decode,{n},{c},{t:.6f},\"({n}, {c})\"")
    return "\n".join(rows) + "\n"


def report(latencies_ms: np.ndarray, max_length: int, batch: int) -> dict:
    """One section as NxD Inference's generate_report computes it."""
    total_s = float(latencies_ms.sum()) / 1000
    out = {f"latency_ms_p{q}": float(np.percentile(latencies_ms, q)) for q in (50, 90, 95, 99, 100)}
    out["latency_ms_avg"] = float(latencies_ms.mean())
    out["throughput"] = len(latencies_ms) * max_length * batch / total_s
    return out


def nxdi_run(prof, rng, batch: int, context: int, seq_len: int) -> tuple[dict, dict]:
    """(benchmark_report.json, neuron_config.json) of one run: per-call latencies, then their statistics.

    The token-generation sub-model is timed on every step of every generate call (contexts from the prompt's
    end to seq_len), the context-encoding one once a call; the end-to-end time is their sum.
    """
    cte = noisy(np.repeat(prefill_ms(np.array([batch]), np.array([context]), prof), RUNS_OF_BENCHMARK), rng)
    contexts = np.arange(context, seq_len)
    steps = decode_ms(np.full(len(contexts), batch), contexts, 1, prof)
    tkg = noisy(np.tile(steps, RUNS_OF_BENCHMARK), rng)
    e2e = cte + tkg.reshape(RUNS_OF_BENCHMARK, -1).sum(axis=1)
    data = {"e2e_model": report(e2e, seq_len, batch), "context_encoding_model": report(cte, seq_len, batch),
            "token_generation_model": report(tkg, seq_len, batch)}
    config = {"neuron_config": {"batch_size": batch, "ctx_batch_size": batch, "tkg_batch_size": batch,
                                "max_batch_size": batch, "max_context_length": context, "seq_len": seq_len,
                                "max_length": seq_len, "enable_bucketing": False, "tp_degree": 32,
                                "torch_dtype": "bfloat16"}}
    return data, config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "data" / "examples" / "calibrate")
    args = parser.parse_args()
    prof = load_profile(PROFILE)
    rng = np.random.default_rng(23)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "measurements.csv").write_text(measurements_csv(prof, rng))
    (args.out / "step-log.csv").write_text(step_log_csv(prof, rng))
    for batch, context, seq_len in NXDI_RUNS:
        folder = args.out / "nxdi" / f"b{batch}-ctx{context}-seq{seq_len}"
        folder.mkdir(parents=True, exist_ok=True)
        data, config = nxdi_run(prof, rng, batch, context, seq_len)
        (folder / "benchmark_report.json").write_text(json.dumps(data, indent=4) + "\n")
        (folder / "neuron_config.json").write_text(json.dumps(config, indent=2) + "\n")


if __name__ == "__main__":
    main()
