"""Which serving-config format a file looks like, from its content: for the hint when it was read as another.

``--shapes-from neuron.json`` without ``--shapes-format`` read the JSON as a ``list`` and said
``expected an integer, got '{'``.  The error now names the format the content suggests.  This is
a hint only: nothing is ever read in a format the user did not choose (a guess that reads a file
wrongly would plan with the wrong shapes without a word).
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path

from model.base.errors import InputError

_ENV_LINE = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*=")
_TUPLE_LINE = re.compile(r"^\s*\(")
GAUDI_ENV_PREFIXES = ("VLLM_PROMPT_", "VLLM_DECODE_", "VLLM_BUCKETING_", "VLLM_EXPONENTIAL_BUCKETING")
TPU_NAMES = ("MIN_TOKEN_BUCKET", "VLLM_TPU_BUCKET_PADDING_GAP", "COMPILATION_SIZES")
VLLM_NEURON_KEYS = {"num_batched_tokens_buckets", "num_seqs_buckets"}
NXDI_KEYS = {"context_encoding_buckets", "token_generation_buckets", "override_neuron_config", "neuron_config"}
JSON_KEYS = {"shapes", "graphs", "prompt", "decode", "context", "token_generation", "buckets"}


def json_keys(value: object, depth: int = 0) -> Iterator[str]:
    """Every key of a parsed JSON value, nested objects included (a few levels: configs are shallow)."""
    if depth > 4:
        return
    if isinstance(value, dict):
        for key, inner in value.items():
            yield str(key)
            yield from json_keys(inner, depth + 1)
    elif isinstance(value, list):
        for inner in value[:16]:
            yield from json_keys(inner, depth + 1)


def looks_like(text: str) -> str | None:
    """The format the content suggests (``nxdi``, ``vllm-neuron``, ``json``, ``gaudi-env``, ``vllm-tpu``,
    ``gaudi-file``), or None when it suggests none."""
    body = text.lstrip("\ufeff \t\r\n")
    if body[:1] in ("{", "["):
        try:
            keys = set(json_keys(json.loads(body)))
        except (ValueError, RecursionError):
            return None
        if keys & VLLM_NEURON_KEYS:
            return "vllm-neuron"
        if keys & NXDI_KEYS:
            return "nxdi"
        return "json" if keys & JSON_KEYS or body[:1] == "[" else None
    lines = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    names = [m.group(1) for m in map(_ENV_LINE.match, lines) if m]
    if any(n.startswith(GAUDI_ENV_PREFIXES) for n in names):
        return "gaudi-env"
    if any(n in TPU_NAMES for n in names):
        return "vllm-tpu"
    if lines and all(_TUPLE_LINE.match(line) for line in lines[:20]):
        return "gaudi-file"
    return None


SNIFF_BYTES = 1 << 23  # a config is kilobytes; a file past 8 MB is not sniffed (its error stays as it was)


def with_format_hint(exc: InputError, path: str | Path, chosen: str, defaulted: bool,
                     flag: str = "--shapes-format") -> InputError:
    """``exc`` (the file read as ``chosen``) with the format its content suggests, when that is another one."""
    try:  # a regular file only: opening a FIFO blocks until a writer comes (the error at hand may be that)
        if not stat.S_ISREG(os.stat(path).st_mode):
            return exc
        with open(path, "rb") as handle:
            raw = handle.read(SNIFF_BYTES + 1)
    except (OSError, ValueError):
        return exc
    if len(raw) > SNIFF_BYTES:
        return exc
    suggested = looks_like(raw.decode("utf-8", errors="replace"))
    if suggested is None or suggested == chosen:
        return exc
    read_as = f"read as {chosen}, the default" if defaulted else f"read as {chosen}"
    return InputError(exc.file, exc.line, exc.field, f"{exc.message} ({read_as}; the file looks like "
                      f"{suggested}: {flag} {suggested})")
