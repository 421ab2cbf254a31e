"""Digests of what the command lines write for deterministic runs: the byte-identity check of a refactor.

Run from a checkout's root: ``python scripts/golden_outputs.py > tests/golden_outputs.json`` records, for every
packer on the shared workloads, the embedded default and the Azure traces (strict and device mode), the sha256
of each plan file ``model.solve`` writes and its exit status; ``tests/test_golden_outputs.py`` runs the same
cases and compares.  Record it on the code before a change that must not change behaviour, then keep it.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKERS = ("greedy", "dpfill", "pow2", "exp", "solo", "cells", "baseline")
TRACES = ROOT / "data" / "traces"
INPUTS = {
    "default": [],
    "twin-1": ["--scenario", str(ROOT / "data" / "workloads" / "twin-1" / "scenario.toml")],
    "twin-2": ["--scenario", str(ROOT / "data" / "workloads" / "twin-2" / "scenario.toml")],
    "code-strict": [str(TRACES / "AzureLLMInferenceTrace_code.csv"), "--columns", "azure", "--cost-model", "strict",
                    "--limit-shapes", "8"],
    "conv-device": [str(TRACES / "AzureLLMInferenceTrace_conv.csv"), "--columns", "azure", "--device-profile",
                    str(ROOT / "data" / "profiles" / "opt13b-a100-tp1.toml"), "--limit-shapes", "8"],
}


def case_digest(argv: list[str]) -> dict[str, object]:
    """Run ``model.solve`` in this process with ``argv`` into a fresh folder: exit status and plan digests."""
    from model import solve
    from model.cli_common import run_main

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        status, said = 0, io.StringIO()
        with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):
            try:
                run_main(lambda: solve.main([*argv, "--quiet", "--out", str(out)]))
            except SystemExit as done:
                status = done.code
        files = sorted(out.glob("*.jsonl")) if out.is_dir() else []
        return {"status": status, "plans": {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in files},
                "said": hashlib.sha256(steady(said.getvalue(), tmp).encode()).hexdigest()}


def steady(text: str, tmp: str) -> str:
    """What a run prints, without what differs between two runs of the same code: wall times and paths."""
    text = text.replace(tmp, "<out>").replace(str(ROOT), "<root>")
    return re.sub(r"\d+(\.\d+)? s\b", "<t> s", text)


def cases() -> dict[str, list[str]]:
    """Every (input, packer) case by name."""
    return {f"{name}/{packer}": [*argv, "--solver", packer] for name, argv in INPUTS.items() for packer in PACKERS}


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    json.dump({name: case_digest(argv) for name, argv in cases().items()}, sys.stdout, indent=1, sort_keys=True)
    print()
