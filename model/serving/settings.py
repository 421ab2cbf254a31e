"""Server settings a stack's bucketing rules depend on, from the config file and from ``--server-settings``.

Which graphs a stack compiles is not in its bucket list alone: vllm-gaudi drops a
prompt graph whose batch x length exceeds ``--max-num-batched-tokens`` and builds its
``exp`` range up to it, the TPU ladder runs up to it too, NxDI's settings must agree
with vLLM's ``--max-num-seqs`` / ``--max-model-len``.  A setting is read from the
config (the ``VAR=value`` formats take ``MAX_NUM_BATCHED_TOKENS=...`` standing for the
flag, the Gaudi bucket file ``# setting: NAME=value`` comment lines, the JSON formats
their ``engine_args``) or given on the command line; when both give one they must
agree.  A rule that needs a setting nobody gave names it: nothing is guessed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from model.base.errors import InputError
from model.load.requests import MAX_LEN
from model.serving.parse import parse_int, shown

FLAG = "--server-settings"

# canonical name -> (the key a config file uses, what the server calls it)
NAMES: dict[str, tuple[str, str]] = {
    "max_model_len": ("MAX_MODEL_LEN", "--max-model-len"),
    "max_num_batched_tokens": ("MAX_NUM_BATCHED_TOKENS", "--max-num-batched-tokens"),
    "max_num_seqs": ("MAX_NUM_SEQS", "--max-num-seqs"),
    "block_size": ("BLOCK_SIZE", "--block-size"),
    "num_gpu_blocks_override": ("NUM_GPU_BLOCKS_OVERRIDE", "--num-gpu-blocks-override"),
    "prompt_bs_bucket_max": ("VLLM_PROMPT_BS_BUCKET_MAX", "VLLM_PROMPT_BS_BUCKET_MAX"),
}
BY_KEY = {key: name for name, (key, _) in NAMES.items()}
MAX_SETTING = MAX_LEN * MAX_LEN  # a block count may be batch x blocks per sequence


@dataclass(frozen=True)
class Setting:
    """One setting's value and where it was stated (so a disagreement can name the line)."""

    value: int
    source: str
    line: int | None
    field: str


@dataclass(frozen=True)
class Settings:
    """The server settings known for one config, by canonical name (see NAMES)."""

    values: dict[str, Setting] = field(default_factory=dict)

    def get(self, name: str) -> int | None:
        s = self.values.get(name)
        return None if s is None else s.value

    def merged(self, other: Settings) -> Settings:
        """These settings and ``other``'s; a setting both give must be the same (the first one is named)."""
        out = dict(self.values)
        for name, s in other.values.items():
            mine = out.get(name)
            if mine is not None and mine.value != s.value:
                raise InputError(mine.source, mine.line, mine.field, f"{mine.value} disagrees with {s.field}="
                                 f"{s.value} from {s.source}")
            out.setdefault(name, s)
        return Settings(out)

    def pairs(self, names: tuple[str, ...]) -> tuple[tuple[str, int], ...]:
        """(canonical name, value) of the given settings that are known, for a result to use and show."""
        return tuple((n, self.values[n].value) for n in names if n in self.values)


def shown_pairs(pairs: tuple[tuple[str, int], ...]) -> str:
    """Settings as the server spells them: "--max-num-batched-tokens 8192, VLLM_PROMPT_BS_BUCKET_MAX 4"."""
    return ", ".join(f"{NAMES[n][1]} {v}" for n, v in pairs)


def missing(name: str, why: str) -> str:
    """The sentence naming a setting a rule needs: where to give it."""
    key, server = NAMES[name]
    return (f"{why} needs {server} ({name}): give {key}=N in the config or {FLAG} {name}=N")


def canonical(raw: str, src: str, line: int | None) -> str:
    """A setting's canonical name from any of its spellings (max_model_len, MAX_MODEL_LEN, --max-model-len)."""
    word = raw.strip().lstrip("-").replace("-", "_")
    if word.upper() in BY_KEY:
        return BY_KEY[word.upper()]
    if word.lower() in NAMES:
        return word.lower()
    raise InputError(src, line, raw.strip()[:40] or None, f"unknown server setting {shown(raw.strip())} "
                     f"(known: {', '.join(NAMES)})")


def most(name: str) -> int:
    """The largest value a setting may take: a length or a count of sequences up to 2**20; a token budget or
    a KV block count up to 2**40 (a batch of up to 2**20 sequences, each up to 2**20 tokens)."""
    return MAX_SETTING if name in ("num_gpu_blocks_override", "max_num_batched_tokens") else MAX_LEN


def setting_value(text: str, src: str, line: int | None, name: str) -> Setting:
    """One setting's integer, range-checked (1 up to ``most``)."""
    value = parse_int(text, src, line, name, 1, most(canonical(name, src, line)))
    return Setting(value, src, line, name)


_ASSIGN = re.compile(r"\s*([^=,\s]+)\s*=\s*([^,]*)")


def parse_flag(text: str | None) -> Settings:
    """``--server-settings max_num_batched_tokens=8192,max_num_seqs=64``: canonical name -> value."""
    if text is None:
        return Settings()
    if not text.strip():
        raise InputError(FLAG, None, None, "empty; expected NAME=VALUE pairs like max_num_batched_tokens=8192")
    out: dict[str, Setting] = {}
    for part in text.split(","):
        m = _ASSIGN.fullmatch(part)
        if m is None:
            raise InputError(FLAG, None, None, f"expected NAME=VALUE, got {shown(part.strip())}")
        name = canonical(m.group(1), FLAG, None)
        if name in out:
            raise InputError(FLAG, None, None, f"{name} given twice")
        out[name] = setting_value(m.group(2), FLAG, None, name)
    return Settings(out)


def from_env(env: dict, src: str) -> Settings:
    """The settings a ``VAR=value`` config states by their file keys (MAX_MODEL_LEN=..., ...)."""
    return Settings({BY_KEY[k]: setting_value(v.value, src, v.line, k) for k, v in env.items() if k in BY_KEY})


_COMMENT_SETTING = re.compile(r"#\s*setting:\s*([A-Za-z_][A-Za-z0-9_]*)=(\S*)\s*")


def from_comments(text: str, src: str) -> Settings:
    """``# setting: NAME=value`` lines of a file whose stack reads no settings (the Gaudi bucket file)."""
    out: dict[str, Setting] = {}
    for number, raw in enumerate(text.split("\n"), start=1):
        m = _COMMENT_SETTING.fullmatch(raw.strip())
        if m is None or m.group(1) == "VLLM_BUCKETING_FROM_FILE":
            continue
        name = canonical(m.group(1), src, number)
        if name in out:
            raise InputError(src, number, m.group(1), f"set twice (first on line {out[name].line})")
        out[name] = setting_value(m.group(2), src, number, m.group(1))
    return Settings(out)


def from_json(obj: dict, src: str, line_of, where: str) -> Settings:
    """The settings of a JSON object (``engine_args``) under their canonical names."""
    out: dict[str, Setting] = {}
    for key, value in obj.items():
        if key not in NAMES:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most(key):
            raise InputError(src, line_of(key), f"{where}{key}", f"expected a positive integer, got {shown(value)}")
        out[key] = Setting(value, src, line_of(key), f"{where}{key}")
    return Settings(out)
