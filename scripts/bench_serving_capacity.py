"""Benchmark: the capacity answer in serving mode -- how many replicas each graph set needs at 1x, 2x and 4x.

    python scripts/bench_serving_capacity.py [--planned GRAPHS.json [--planned-format json]] [--rate-scale 1 2 4]
        [--slo-ttft-ms 2000] [--slo-tpot-ms 200] [--max-replicas 1024] [--traces code conv] [--json FILE]

The Azure code and conversation traces (``data/traces``, arrival times from TIMESTAMP),
the shared OPT-13B / A100 profile (``data/profiles/opt13b-a100-tp1.toml``: DistServe's
fitted step times, compile 20 s a graph, run-time compiles as long) and the server of
issue 20's targets: stack gaudi, max_num_seqs 128, max_num_batched_tokens 16384,
block_size 128.  Today's side is vllm-gaudi's ``exp`` bucketing at those settings, read
by the stack's rules (``model.serving.gaudi_read``) from a ``gaudi-env`` config with
MAX_MODEL_LEN 16384 (the token budget; the longest request of either trace is 14,089
tokens), NUM_GPU_BLOCKS_OVERRIDE the profile's KV blocks (66,144 // 128 = 516: the exp
decode range is clamped to 3 x the KV cache's blocks) and VLLM_PROMPT_BS_BUCKET_MAX 128
(prompt batches up to max_num_seqs, as issue 20 counts them: 181 graphs; leave it out
with ``--prompt-bs-max 1``, vllm-gaudi's value when the variable is unset: 87 graphs).
``--planned`` adds a column for any graph set ``model.replay --graphs`` reads (e.g. the
graph-set JSON of ``model.solve --cost-model serving``).

For each trace, each rate scale and each graph set: the fewest replicas whose replay
meets TTFT p95 <= 2 s and TPOT p95 <= 200 ms (``model.evaluation.capacity``: 1, 2, 4, ...
then bisection, every count below a small answer replayed), and then both sides replayed
at the larger chosen count at the first rate (``model.deploy.serving_audit``), printed as
the serving audit prints them.  The machine's load average is printed beside the times.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from model.cost.serving import ServingCost  # noqa: E402
from model.deploy.serving_audit import serving_audit  # noqa: E402
from model.deploy.serving_flags import SCAN_BELOW  # noqa: E402
from model.deploy.serving_present import audit_blocks, audit_json  # noqa: E402
from model.domain.server import ServerSettings  # noqa: E402
from model.evaluation.replay_metrics import Slo  # noqa: E402
from model.evaluation.replay_run import check_fits, trace_of  # noqa: E402
from model.load.profile import load_profile_file  # noqa: E402
from model.load.requests import Columns, load_requests  # noqa: E402
from model.report.document import to_text  # noqa: E402
from model.serving.replay_graphs import read_graph_set  # noqa: E402

TRACES = {name: REPO / "data" / "traces" / f"AzureLLMInferenceTrace_{name}.csv" for name in ("code", "conv")}
PROFILE = REPO / "data" / "profiles" / "opt13b-a100-tp1.toml"
SERVER = ServerSettings(stack="gaudi", max_num_seqs=128, max_num_batched_tokens=16384, block_size=128)
MAX_MODEL_LEN = 16384


def exp_config(folder: Path, kv_capacity_tokens: int, prompt_bs_max: int) -> Path:
    """vllm-gaudi's exp bucketing as a gaudi-env config (the variables the module docstring names)."""
    lines = ["VLLM_BUCKETING_STRATEGY=exp", f"MAX_MODEL_LEN={MAX_MODEL_LEN}",
             f"NUM_GPU_BLOCKS_OVERRIDE={kv_capacity_tokens // SERVER.block_size}"]
    if prompt_bs_max > 1:
        lines.append(f"VLLM_PROMPT_BS_BUCKET_MAX={prompt_bs_max}")
    path = folder / "gaudi-exp.env"
    path.write_text("\n".join(lines) + "\n")
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--planned", type=Path, help="a planned graph set, replayed beside the exp buckets")
    parser.add_argument("--planned-format", default="json", help="its format (default json)")
    parser.add_argument("--rate-scale", type=float, nargs="+", default=[1.0, 2.0, 4.0])
    parser.add_argument("--slo-ttft-ms", type=float, default=2000.0)
    parser.add_argument("--slo-tpot-ms", type=float, default=200.0)
    parser.add_argument("--max-replicas", type=int, default=1024)
    parser.add_argument("--prompt-bs-max", type=int, default=128, help="VLLM_PROMPT_BS_BUCKET_MAX of the exp side")
    parser.add_argument("--traces", nargs="+", choices=tuple(TRACES), default=list(TRACES))
    parser.add_argument("--json", type=Path, help="write every number (audit.json per trace) here")
    args = parser.parse_args()
    profile, _ = load_profile_file(PROFILE)
    cost = ServingCost(profile)
    slo = Slo(args.slo_ttft_ms, args.slo_tpot_ms)
    docs = {}
    with tempfile.TemporaryDirectory() as folder:
        exp = exp_config(Path(folder), profile.kv_capacity_tokens, args.prompt_bs_max)
        sides = [("exp buckets", f"vllm-gaudi exp, prompt batch up to {args.prompt_bs_max}",
                  read_graph_set(exp, "gaudi-env", SERVER).graphs)]
        if args.planned is not None:
            sides.append(("planned graphs", str(args.planned),
                          read_graph_set(args.planned, args.planned_format, SERVER).graphs))
        for name in args.traces:
            trace = trace_of([load_requests(TRACES[name], name, Columns.parse("azure"))])
            for _, _, graphs in sides:
                check_fits(trace, SERVER, graphs, profile.kv_capacity_tokens)
            load_before = os.getloadavg()
            t0 = time.perf_counter()
            audit = serving_audit(trace, SERVER, sides, cost, None, args.rate_scale, slo, args.max_replicas,
                                  scan_below=SCAN_BELOW)
            seconds = time.perf_counter() - t0
            replays = sum(len(s.probes) for side in audit.sides for s in side.capacity)
            print(to_text(audit_blocks(audit, f"Azure {name} trace ({TRACES[name].name})")))
            print(f"\n{name}: {replays} capacity replays and {len(sides)} side-by-side replay(s) in {seconds:.1f} s; "
                  f"load average before {', '.join(f'{x:.2f}' for x in load_before)}, after "
                  f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}; {os.cpu_count()} cores\n")
            docs[name] = json.loads(audit_json(audit))
    if args.json is not None:
        args.json.write_text(json.dumps(docs, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
