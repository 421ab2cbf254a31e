"""The contract's worked example (``shared/serving_model.md``) as data, and small builders the replay tests share.

Imported as ``from replay_helpers import ...`` (pytest puts ``tests/`` on ``sys.path``).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from model.cost.device import DeviceProfile
from model.domain.schema import Bucket
from model.domain.server import GraphSet, ServerSettings
from model.evaluation.replay_run import Trace, trace_of

PROFILE = DeviceProfile(prefill=(10.0, 0.01, 1e-5), decode=(20.0, 0.001, 0.5), compile_ms=10000.0,
                        kv_capacity_tokens=2048)
# (id, prompt, gen, arrival s)
REQUESTS = [("a", 300, 3, 0.0), ("b", 100, 2, 0.0), ("c", 700, 4, 0.01), ("d", 50, 1, 0.05), ("e", 900, 2, 0.06),
            ("f", 200, 5, 0.5), ("g", 120, 2, 20.0)]
GAUDI = GraphSet("gaudi", prompt=((1, 256), (1, 1024), (2, 512), (4, 256)), decode=((2, 8), (4, 12)))
NXDI = GraphSet("nxdi", context=(256, 512, 1024), token_generation=(512, 1024))
GAUDI_SERVER = ServerSettings(stack="gaudi", max_num_seqs=4, max_num_batched_tokens=1024, block_size=128)
NXDI_SERVER = ServerSettings(stack="nxdi", max_num_seqs=4, max_num_batched_tokens=1024)

PROFILE_TOML = """[device]
prefill = [10.0, 0.01, 1e-5]
decode = [20.0, 0.001, 0.5]
compile_ms = 10000
kv_capacity_tokens = 2048

[server]
stack = "gaudi"
max_num_seqs = 4
max_num_batched_tokens = 1024
block_size = 128
"""
GAUDI_JSON = {"prompt": [[1, 256], [1, 1024], [2, 512], [4, 256]], "decode": [[2, 8], [4, 12]]}
NXDI_JSON = {"context": [256, 512, 1024], "token_generation": [512, 1024]}


def bucket_of(rows: list[tuple[str, int, int, float]], source: str = "<example>") -> Bucket:
    """A bucket with arrival times, lines 1, 2, ..."""
    return Bucket(source, source, np.array([r[0] for r in rows], dtype=object),
                  np.array([r[1] for r in rows], dtype=np.int64), np.array([r[2] for r in rows], dtype=np.int64),
                  np.arange(1, len(rows) + 1), np.array([r[3] for r in rows], dtype=np.float64))


def example_trace() -> Trace:
    return trace_of([bucket_of(REQUESTS)])


def write_example(folder: Path) -> dict[str, Path]:
    """The example as files: requests.jsonl (arrival_s), profile.toml ([device] + [server]), gaudi.json, nxdi.json."""
    paths = {name: folder / name for name in ("requests.jsonl", "profile.toml", "gaudi.json", "nxdi.json")}
    paths["requests.jsonl"].write_text("".join(
        json.dumps({"request_id": i, "prompt_len": p, "gen_len": g, "arrival_s": a}) + "\n" for i, p, g, a in REQUESTS))
    paths["profile.toml"].write_text(PROFILE_TOML)
    paths["gaudi.json"].write_text(json.dumps(GAUDI_JSON))
    paths["nxdi.json"].write_text(json.dumps(NXDI_JSON))
    return paths
