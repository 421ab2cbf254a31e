"""Compiled shapes in the formats serving stacks read: one reader and one writer per format.

Import (``read_shapes``) gives the sorted, unique sequence lengths a configuration makes
a server compile, each rounded up to the 64-token granularity of shapeplan's shapes; the
(given, rounded) pairs come back too, so a caller can warn naming them.  Export
(``render``) writes the shapes a set of plans uses and, where the format has them, batch
sizes and decode/context buckets.  Every problem with an input file is an InputError
naming file, line and field; none is a traceback.  See shared/serving-configs.md.

What each format writes, reads and guarantees on a round trip (export, then import):

``list``
    One length a line (or comma separated), ``#`` comments.  Round trip: the same shapes.
``json``
    ``{"shapes": [...], "batch_sizes": [...], "buckets": {name: [...]}}``; the only bucket
    list is ``context`` (per shape: shape + longest generation of its batches, rounded up
    to 64), present when the requests are known.  Round trip: the same shapes.
``gaudi-file``
    vllm-gaudi's ``VLLM_BUCKETING_FROM_FILE``: one Python literal 3-tuple a line.  Export:
    a prompt line ``(batch sizes, shape, 0)`` per shape with exactly the batch sizes the
    plans use at it, and (with requests) a decode line ``(n, 1, [total KV blocks])`` per
    batch size n, a batch's blocks being n * ceil(context / block size).  Import: the
    query_len of every prompt tuple (decode tuples, middle element 1, are checked and
    skipped).  Round trip: the same shapes.
``gaudi-env``
    ``VAR=value`` lines.  Export uses the ``lin`` strategy (``exp``, the default, overwrites
    user values): the prompt query ladder MIN/STEP/MAX must generate EXACTLY the shapes
    (start at MIN, double until STEP, then add STEP up to MAX); a set ``lin`` cannot
    express (192, 704, 1536) is refused with one line pointing at ``gaudi-file``, so the
    export never compiles lengths the plans do not use.  Batch sizes and decode blocks,
    which ``lin`` crosses into a Cartesian product anyway, get the smallest ladder found
    that covers them.  Import: ``lin`` (QUERY or legacy SEQ names), ``exp`` (from the max
    model length, key ``MAX_MODEL_LEN`` or the ``max_model_len`` argument, block size key
    ``BLOCK_SIZE``, default 128), or the bucket file named by ``VLLM_BUCKETING_FROM_FILE``
    (relative to the env file's folder).  Round trip: the same shapes, for every set it
    accepts.
``nxdi``
    NeuronConfig keyword arguments as JSON (top level, or under ``neuron_config`` /
    ``override_neuron_config``).  Export: enable_bucketing, context_encoding_buckets (the
    shapes), token_generation_buckets (the contexts, with requests), max_context_length
    (largest shape), seq_len, batch_size (largest batch).  Import: context_encoding_buckets
    (sorted; the last must be <= max_context_length); without a list, NxDI's default
    powers of two from 128 to max_context_length.  Round trip: the same shapes.
``vllm-neuron``
    ``{"additional_config": {"neuron_config": {"num_batched_tokens_buckets": [...],
    "num_seqs_buckets": [...]}}, "engine_args": {"max_num_batched_tokens": N,
    "max_num_seqs": M}}``: the largest bucket of each list EQUALS its maximum, as the
    plugin requires.  Import also takes the bare ``{"neuron_config": ...}`` object.
    Buckets there are token budgets per scheduler step.  Round trip: the same shapes.
``vllm-tpu``
    ``VAR=value`` lines: ``VLLM_TPU_BUCKET_PADDING_GAP``, ``MAX_MODEL_LEN`` (stands for
    ``--max-model-len``) and ``COMPILATION_SIZES`` (stands for ``--additional-config
    '{"compilation_sizes": [...]}'``, sizes ADDED to the ladder).  The server always
    compiles its whole ladder (gap 0: powers of two from 16 until the max is covered;
    gap g: doubling from 16 up to g, then +g until the max is covered), so export picks
    the gap (0 or a multiple of 64) whose ladder plus the shapes it misses -- written as
    compilation sizes -- is smallest.  Round trip, honestly: the import is exactly what
    the server compiles (ladder plus compilation sizes, rounded up to 64); it contains
    every exported shape, and everything else in it is a rung of the written ladder.
"""

from __future__ import annotations

import ast
import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from model.base.errors import InputError
from model.cost.common import GRANULARITY
from model.load.files import read_input
from model.load.requests import MAX_LEN

MAX_BUCKETS = 100_000  # values a ladder, range or Cartesian product may expand to
MAX_FILE_BYTES = 16 << 20  # a shape configuration is a few lines; more is the wrong file
MAX_LINE_CHARS = 100_000
DEFAULT_BLOCK_SIZE = 128
TPU_MIN_TOKENS = 16  # vLLM's TPU runner starts its ladder at 16 tokens
NXDI_MIN_BUCKET = 128  # NxDI's default buckets start at 128
LIMIT_NOTE = f"the largest accepted is {MAX_LEN} (2**20 tokens); a larger value is a typo, not a length"


# ---------------------------------------------------------------- records


@dataclass(frozen=True)
class Given:
    """One length as a file states it, and where (so errors and warnings can name it)."""

    value: int
    source: str
    line: int | None
    field: str


@dataclass(frozen=True)
class ShapeImport:
    """The shapes a configuration compiles, rounded up to multiples of 64."""

    shapes: tuple[int, ...]  # sorted, unique, positive multiples of 64
    rounded: tuple[tuple[int, int], ...]  # (given, rounded up) for every given length that moved
    source: str

    def warning(self) -> str | None:
        """The line to show when lengths were rounded up, naming each of them (None if none were)."""
        if not self.rounded:
            return None
        pairs = ", ".join(f"{a} -> {b}" for a, b in self.rounded)
        return f"{self.source}: lengths that are not multiples of {GRANULARITY} rounded up: {pairs}"


@dataclass(frozen=True)
class ShapeUse:
    """How the plans use one shape: the batch sizes declared at it and, with requests, its context.

    ``context`` is the shape plus the longest generation among its batches (tokens,
    not rounded): the longest sequence a decode at this shape reaches.
    """

    shape: int
    batch_sizes: tuple[int, ...] = ()
    context: int | None = None


@dataclass(frozen=True)
class ExportSpec:
    """Everything a writer needs, derived from plans (and requests, for the contexts)."""

    uses: tuple[ShapeUse, ...]  # one per shape, sorted by shape
    block_size: int = DEFAULT_BLOCK_SIZE
    max_model_len: int | None = None

    @classmethod
    def of_shapes(cls, shapes, block_size: int = DEFAULT_BLOCK_SIZE,
                  max_model_len: int | None = None) -> ExportSpec:
        """A spec from shapes alone (no batch sizes, no contexts): what a shape list determines."""
        return cls(tuple(ShapeUse(int(s)) for s in sorted(set(shapes))), block_size, max_model_len)

    @property
    def shapes(self) -> tuple[int, ...]:
        return tuple(u.shape for u in self.uses)

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        """Every batch size the plans use, sorted; empty when the spec came from shapes alone."""
        return tuple(sorted({n for u in self.uses for n in u.batch_sizes}))

    @property
    def has_contexts(self) -> bool:
        return bool(self.uses) and all(u.context is not None for u in self.uses)


# ---------------------------------------------------------------- public entry points


def read_shapes(path: str | Path, fmt: str, max_model_len: int | None = None) -> ShapeImport:
    """The shapes the configuration at ``path`` (in format ``fmt``) makes a server compile.

    ``max_model_len`` is needed by the formats whose buckets derive from it (Gaudi's exp
    strategy, TPU) and otherwise bounds every length read.
    """
    if fmt not in READERS:
        raise InputError("--shapes-format", None, None, f"unknown format {fmt!r} ({', '.join(READERS)})")
    if max_model_len is not None:
        max_model_len = check_range(max_model_len, "max_model_len", None, None)
    path = Path(path)
    given = READERS[fmt](path, read_text(path), max_model_len)
    if not given:
        raise InputError(str(path), None, None, "no sequence lengths found")
    if max_model_len is not None and fmt != "vllm-tpu":  # TPU's last rung covers the max, may pass it
        for g in given:
            if g.value > max_model_len:
                raise InputError(g.source, g.line, g.field, f"{g.value} is longer than max_model_len {max_model_len}")
    return finish(given, str(path))


def render(fmt: str, spec: ExportSpec) -> str:
    """The text of ``spec`` in format ``fmt`` (an InputError if the format cannot express it)."""
    if fmt not in WRITERS:
        raise InputError("--format", None, None, f"unknown format {fmt!r} ({', '.join(WRITERS)})")
    check_spec(spec)
    return WRITERS[fmt](spec)


def finish(given: list[Given], source: str) -> ShapeImport:
    """Round every length up to a multiple of 64; keep the pairs that moved for the warning."""
    shapes = sorted({align(g.value) for g in given})
    rounded = sorted({(g.value, align(g.value)) for g in given if g.value % GRANULARITY})
    return ShapeImport(tuple(shapes), tuple(rounded), source)


def align(n: int) -> int:
    """n rounded up to the 64-token granularity (pure int arithmetic)."""
    return -(-n // GRANULARITY) * GRANULARITY


def check_spec(spec: ExportSpec) -> None:
    """Reject a spec no format could write correctly; --max-model-len must hold every sequence."""
    shapes = spec.shapes
    if not shapes:
        raise InputError("<plans>", None, None, "no shapes to export")
    if list(shapes) != sorted(set(shapes)) or any(s <= 0 or s % GRANULARITY or s > MAX_LEN for s in shapes):
        raise InputError("<plans>", None, "shapes", f"must be sorted unique positive multiples of {GRANULARITY}, "
                         f"got {list(shapes)}")
    if spec.block_size < 1 or spec.block_size > MAX_LEN:
        raise InputError("--block-size", None, None, f"must be a positive integer up to {MAX_LEN}, "
                         f"got {spec.block_size}")
    for u in spec.uses:
        if any(n < 1 for n in u.batch_sizes) or (u.context is not None and u.context < u.shape):
            raise InputError("<plans>", None, "uses", f"batch sizes must be positive and the context at least "
                             f"the shape, got {u}")
    if spec.max_model_len is not None:
        longest = max(max(shapes), *(u.context or 0 for u in spec.uses))
        if longest > spec.max_model_len:
            what = "shape" if longest == max(shapes) else "context (shape + longest generation)"
            raise InputError("--max-model-len", None, None,
                             f"{spec.max_model_len} is shorter than the plans' longest {what}, {longest}")


# ---------------------------------------------------------------- reading text safely


def read_text(path: Path) -> str:
    """The file as text: never a traceback for a folder, a missing, huge, binary or non-UTF-8 file."""
    src = str(path)
    # the one place inputs are opened: a FIFO is refused, not waited on
    raw = read_input(path, MAX_FILE_BYTES, folder="is a folder, expected a file")
    if len(raw) > MAX_FILE_BYTES:
        raise InputError(src, None, None, f"larger than {MAX_FILE_BYTES >> 20} MiB; a shape configuration "
                         "is a few lines")
    if b"\0" in raw:
        raise InputError(src, raw[:raw.index(b"\0")].count(b"\n") + 1, None, "NUL byte: a binary file, not text")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(src, raw[:exc.start].count(b"\n") + 1, None,
                         f"not UTF-8 text (byte 0x{raw[exc.start]:02x})") from None
    text = text.removeprefix("\ufeff")
    if not text.strip():
        raise InputError(src, None, None, "empty file")
    return text


def text_lines(text: str, src: str) -> list[tuple[int, str]]:
    """(line number, text without comment) for every line with content; '#' starts a comment."""
    out = []
    for number, raw in enumerate(text.split("\n"), start=1):
        if len(raw) > MAX_LINE_CHARS:
            raise InputError(src, number, None, f"line longer than {MAX_LINE_CHARS} characters")
        body = raw.split("#", 1)[0].strip()
        if body:
            out.append((number, body))
    return out


def check_range(value: int, src: str, line: int | None, fld: str | None, lo: int = 1, hi: int = MAX_LEN) -> int:
    """value if lo <= value <= hi, else an InputError saying which bound it breaks."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(src, line, fld, f"expected an integer, got {shown(value)}")
    if value < lo:
        want = "positive" if lo == 1 else f"at least {lo}"
        raise InputError(src, line, fld, f"must be {want}, got {value}")
    if value > hi:
        raise InputError(src, line, fld, f"{value} is too large: {LIMIT_NOTE}" if hi == MAX_LEN
                         else f"{value} is too large: at most {hi}")
    return value


def parse_int(token: str, src: str, line: int | None, fld: str, lo: int = 1, hi: int = MAX_LEN) -> int:
    """A decimal integer written as text (a list entry, an env value), range-checked."""
    m = re.fullmatch(r"[+-]?([0-9]+)", token.strip())
    if not m:
        raise InputError(src, line, fld, f"expected an integer, got {token.strip()!r}")
    if len(m.group(1).lstrip("0")) > 18:
        raise InputError(src, line, fld, f"{token.strip()[:24]}... is too large: {LIMIT_NOTE}")
    return check_range(int(token), src, line, fld, lo, hi)


def shown(value) -> str:
    """A value as the user wrote it (JSON spelling), cut short."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


# ---------------------------------------------------------------- JSON, strictly


class _Duplicate(Exception):
    pass


class _Oversized(Exception):
    pass


def _unique_pairs(pairs: list[tuple[str, object]]) -> dict:
    out = {}
    for key, value in pairs:
        if key in out:
            raise _Duplicate(key)
        out[key] = value
    return out


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > 30:
        raise _Oversized(text)
    return int(text)


def load_json_object(text: str, src: str) -> dict:
    """A JSON object; duplicate keys are rejected (readers disagree on which one wins).

    NaN and Infinity parse as floats, so the field that holds one is named when its
    integer check fails; integers of more than 30 digits are refused before int() sees them.
    """
    try:
        data = json.loads(text, object_pairs_hook=_unique_pairs, parse_int=_bounded_int)
    except json.JSONDecodeError as exc:
        raise InputError(src, exc.lineno, None, f"malformed JSON: {exc.msg} (column {exc.colno})") from None
    except _Duplicate as exc:
        key = str(exc.args[0])
        raise InputError(src, key_line(text, key, 1), key, "duplicate key (JSON readers disagree on which "
                         "one wins)") from None
    except _Oversized as exc:
        number = str(exc.args[0])
        raise InputError(src, text[:text.find(number)].count("\n") + 1, None,
                         f"number {number[:20]}... is too large: {LIMIT_NOTE}") from None
    except RecursionError:
        raise InputError(src, None, None, "malformed JSON: nested too deeply") from None
    if not isinstance(data, dict):
        raise InputError(src, 1, None, f"expected a JSON object, got {type(data).__name__}")
    return data


def key_line(text: str, key: str, nth: int = 0) -> int | None:
    """Line of the nth ``"key":`` in a JSON text (best effort; None if not found)."""
    found = list(re.finditer(re.escape(json.dumps(key)) + r"\s*:", text))
    if len(found) <= nth:
        return None
    return text[:found[nth].start()].count("\n") + 1


def element_line(text: str, key: str, index: int) -> int | None:
    """Line of element ``index`` of the list under the first ``"key":`` (falls back to the key's line).

    A tiny scanner over the list's text (strings skipped, nesting counted), so an error
    in an indented list one value a line points at the value, not at the key.
    """
    m = re.search(re.escape(json.dumps(key)) + r"\s*:\s*\[", text)
    if m is None:
        return key_line(text, key)
    depth, count, in_string, escaped = 1, 0, False, False
    pos = m.end()
    while pos < len(text):
        ch = text[pos]
        if in_string:
            escaped = ch == "\\" and not escaped
            if ch == '"' and not escaped:
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
            if depth == 0:
                break
        elif ch == "," and depth == 1:
            count += 1
        if count == index and depth == 1 and not ch.isspace() and ch != ",":
            return text[:pos].count("\n") + 1
        pos += 1
    return key_line(text, key)


def json_int_list(text: str, src: str, obj: dict, key: str, where: str, lo: int = 1,
                  required: bool = True) -> list[Given] | None:
    """The list ``obj[key]`` as Given lengths (each an exact JSON integer in range), or None if absent."""
    fld = f"{where}{key}"
    if key not in obj or obj[key] is None:
        if required:
            raise InputError(src, None, fld, "missing")
        return None
    value = obj[key]
    if not isinstance(value, list) or not value:
        raise InputError(src, key_line(text, key), fld, f"expected a non-empty list of integers, got {shown(value)}")
    if len(value) > MAX_BUCKETS:
        raise InputError(src, key_line(text, key), fld, f"{len(value)} entries; at most {MAX_BUCKETS}")
    out = []
    for i, v in enumerate(value):
        line = element_line(text, key, i)
        out.append(Given(check_range(v, src, line, f"{fld}[{i}]", lo), src, line, f"{fld}[{i}]"))
    return out


def json_scalar(text: str, src: str, obj: dict, key: str, where: str, lo: int = 1) -> int | None:
    """An optional integer setting of a JSON object, range-checked."""
    if key not in obj or obj[key] is None:
        return None
    return check_range(obj[key], src, key_line(text, key), f"{where}{key}", lo)


def json_text(obj: dict) -> str:
    """Deterministic JSON: keys in the order given, two-space indent, one trailing newline."""
    return json.dumps(obj, indent=2) + "\n"


# ---------------------------------------------------------------- VAR=value files


@dataclass(frozen=True)
class EnvValue:
    value: str
    line: int


_ENV_LINE = re.compile(r"(?:export\s+)?(?P<name>[A-Za-z_][A-Za-z0-9_]*)=(?P<rest>.*)")


def env_vars(text: str, src: str) -> dict[str, EnvValue]:
    """``NAME=value`` lines (optionally ``export``-ed, values optionally quoted, ``#`` comments).

    A name set twice is an error: which one a shell or a loader keeps differs.
    """
    out: dict[str, EnvValue] = {}
    for number, raw in enumerate(text.split("\n"), start=1):
        if len(raw) > MAX_LINE_CHARS:
            raise InputError(src, number, None, f"line longer than {MAX_LINE_CHARS} characters")
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _ENV_LINE.fullmatch(line)
        if m is None:
            raise InputError(src, number, None, f"expected NAME=value, got {shown(line)}")
        name = m.group("name")
        value = _env_value(m.group("rest"), src, number, name)
        if name in out:
            raise InputError(src, number, name, f"set twice (first on line {out[name].line})")
        out[name] = EnvValue(value, number)
    return out


def _env_value(rest: str, src: str, line: int, name: str) -> str:
    """The value part of one assignment: a quoted string or one word, then at most a comment."""
    if rest[:1] in ("'", '"'):
        end = rest.find(rest[0], 1)
        if end < 0:
            raise InputError(src, line, name, "unterminated quote")
        value, tail = rest[1:end], rest[end + 1:]
    else:
        parts = rest.split(None, 1)
        value, tail = (parts[0] if parts else ""), (" " + parts[1] if len(parts) > 1 else "")
    tail = tail.strip()
    if tail and not tail.startswith("#"):
        raise InputError(src, line, name, f"unexpected text after the value: {shown(tail)}")
    return value


def env_int(env: dict[str, EnvValue], src: str, name: str, lo: int = 1, hi: int = MAX_LEN) -> int | None:
    """An optional integer variable, range-checked, or None when unset."""
    v = env.get(name)
    return None if v is None else parse_int(v.value, src, v.line, name, lo, hi)


def env_int_list(env: dict[str, EnvValue], src: str, name: str) -> list[Given]:
    """A comma-separated list of lengths in one variable (empty when unset)."""
    v = env.get(name)
    if v is None:
        return []
    tokens = v.value.split(",")
    if tokens and not tokens[-1].strip():
        tokens.pop()  # a trailing comma
    if not tokens:
        raise InputError(src, v.line, name, "empty list")
    return [Given(parse_int(t, src, v.line, f"{name}[{i}]"), src, v.line, f"{name}[{i}]")
            for i, t in enumerate(tokens)]


def max_model_len_of(env: dict[str, EnvValue], src: str, given: int | None, why: str) -> int:
    """The max model length: the ``MAX_MODEL_LEN`` key or the argument (they must agree if both are given)."""
    in_file = env_int(env, src, "MAX_MODEL_LEN")
    if in_file is not None and given is not None and in_file != given:
        raise InputError(src, env["MAX_MODEL_LEN"].line, "MAX_MODEL_LEN",
                         f"{in_file} disagrees with max_model_len {given}")
    value = in_file if in_file is not None else given
    if value is None:
        raise InputError(src, None, "MAX_MODEL_LEN", f"missing: {why}; give MAX_MODEL_LEN=N in the file "
                         "or max_model_len")
    return value


# ---------------------------------------------------------------- ladders


def lin_ladder(bmin: int, bstep: int, bmax: int) -> list[int]:
    """vllm-gaudi's ``lin`` rule: start at MIN, double while below STEP, then STEP, 2 STEP, ... up to MAX.

    Values below MIN are dropped, as vllm-gaudi's warmup_range does (bmin >= 1 here).
    Documented example: (2, 32, 64) -> 2, 4, 8, 16, 32, 64.
    """
    ramp = []
    x = bmin
    while x < bstep and x <= bmax:
        ramp.append(x)
        x *= 2
    return [b for b in ramp + list(range(bstep, bmax + 1, bstep)) if b >= bmin]


def lin_count(bmin: int, bstep: int, bmax: int) -> int:
    """How many values lin_ladder would produce, without producing them (to refuse huge ones)."""
    ramp = 0
    x = bmin
    while x < bstep and x <= bmax:
        ramp += 1
        x *= 2
    first = max(bstep, -(-bmin // bstep) * bstep)
    return ramp + (len(range(first, bmax + 1, bstep)) if first <= bmax else 0)


def lin_cover(values: list[int] | tuple[int, ...]) -> tuple[int, int, int]:
    """(MIN, STEP, MAX) of the smallest ``lin`` ladder found that contains every value.

    MIN and MAX are the smallest and largest value; every value on the STEP part is a
    multiple of STEP, so the STEPs worth trying are the divisors of the values.  When an
    exact ladder exists this finds it (its size equals the number of values): a ladder
    made only of doublings is the STEP = MAX case.
    """
    vals = sorted(set(values))
    lo, hi = vals[0], vals[-1]
    best: tuple[int, int] | None = None
    for step in sorted({d for v in vals for d in divisors(v)}):
        if not _lin_covers(vals, lo, step, hi):
            continue
        key = (lin_count(lo, step, hi), -step)
        if best is None or key < best:
            best = key
    assert best is not None  # STEP 1 always covers
    return lo, -best[1], hi


def _lin_covers(vals: list[int], lo: int, step: int, hi: int) -> bool:
    ramp = set()
    x = lo
    while x < step and x <= hi:
        ramp.add(x)
        x *= 2
    return all(v in ramp or (v >= step and v % step == 0) for v in vals)


def divisors(n: int) -> set[int]:
    """Every positive divisor of n (n >= 1; trial division, n is at most 2**20-ish)."""
    out = set()
    for d in range(1, math.isqrt(n) + 1):
        if n % d == 0:
            out.update((d, n // d))
    return out


def exp_ladder(bmin: int, bstep: int, bmax: int, count: int) -> list[int]:
    """vllm-gaudi's ``exp`` spacing: ``count`` points from bmin to bmax on a geometric scale, each
    rounded up to a multiple of bstep, duplicates dropped; the last point is bmax itself (as with
    contiguous PA -- without it vllm-gaudi rounds bmax up to a multiple of bstep).
    """
    if count == 1:
        return [bmax]
    out = set()
    for i in range(count):
        power = bmin * np.float_power(bmax / bmin, (1.0 / float(count - 1)) * i)
        out.add(bmax if i == count - 1 else math.ceil(power / bstep) * bstep)
    return sorted(int(b) for b in out)


def tpu_count(gap: int, max_len: int) -> int:
    """How many sizes tpu_ladder would produce, without producing them."""
    num, count = TPU_MIN_TOKENS, 0
    if gap == 0:
        while True:
            count += 1
            if num >= max_len:
                return count
            num *= 2
    while num <= gap:
        count += 1
        num *= 2
    num //= 2
    return count + (-(-(max_len - num) // gap) if num < max_len else 0)


def tpu_ladder(gap: int, max_len: int) -> list[int]:
    """vLLM's TPU token paddings: gap 0 doubles from 16 until max_len is covered; gap g doubles
    from 16 while <= g, then adds g until max_len is covered (doc: 512, 64 -> 16, 32, 64, 128, ..., 512).
    """
    out, num = [], TPU_MIN_TOKENS
    if gap == 0:
        while True:
            out.append(num)
            if num >= max_len:
                return out
            num *= 2
    while num <= gap:
        out.append(num)
        num *= 2
    num //= 2
    while num < max_len:
        num += gap
        out.append(num)
    return out


def nxdi_default(max_len: int) -> list[int]:
    """NxDI's buckets when none are listed: powers of two from 128, then the maximum itself."""
    if max_len == NXDI_MIN_BUCKET:
        return [max_len]
    return [2 ** i for i in range(int(math.log2(NXDI_MIN_BUCKET)), round(math.log2(max_len)))] + [max_len]


# ---------------------------------------------------------------- readers

Reader = Callable[[Path, str, int | None], list[Given]]


def read_list(path: Path, text: str, max_model_len: int | None) -> list[Given]:
    """``list``: lengths separated by commas or newlines; '#' comments; one trailing comma a line is fine."""
    src = str(path)
    out = []
    for number, body in text_lines(text, src):
        tokens = body.split(",")
        if len(tokens) > 1 and not tokens[-1].strip():
            tokens.pop()
        for token in tokens:
            out.append(Given(parse_int(token, src, number, "length"), src, number, "length"))
    return out


_RANGE = re.compile(r"range\s*\(([^()]*)\)")
_GAUDI_FIELDS = ("batch", "query_len", "ctx_blocks")


def read_gaudi_file(path: Path, text: str, max_model_len: int | None) -> list[Given]:
    """``gaudi-file``: one Python literal 3-tuple a line, read with ast.literal_eval only.

    ``range(a, b[, step])`` is recognised here (its arguments are literal integers) and
    stands in for its values lazily, so ``range(0, 10**12, 1)`` or a huge Cartesian
    product is refused by counting, before anything is expanded.  Strings are not
    allowed in a bucket, which keeps the stand-ins unambiguous.  A tuple whose middle
    element is 1 is a decode bucket (checked, not a shape); any other is a prompt bucket
    whose query_len is a shape.
    """
    src = str(path)
    out: list[Given] = []
    total = 0
    for number, body in text_lines(text, src):
        if "'" in body or '"' in body:
            raise InputError(src, number, None, "strings are not allowed in a bucket line")
        literal, ranges = _range_stand_ins(body, src, number)
        try:
            bucket = ast.literal_eval(literal)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            raise InputError(src, number, None, f"not a Python literal 3-tuple: {shown(body)}") from None
        if not isinstance(bucket, tuple) or len(bucket) != 3:
            raise InputError(src, number, None, f"expected a 3-tuple (batch, query_len, ctx_blocks), got {shown(body)}")
        dims = [_gaudi_values(v, ranges, src, number, name) for v, name in zip(bucket, _GAUDI_FIELDS, strict=True)]
        count = math.prod(len(d) for d in dims)
        total += count
        if count > MAX_BUCKETS or total > MAX_BUCKETS:
            raise InputError(src, number, None, f"expands to {total if count <= MAX_BUCKETS else count} buckets; "
                             f"at most {MAX_BUCKETS} are accepted (refused before expanding)")
        for name, lo, values in zip(_GAUDI_FIELDS, (1, 1, 0), dims, strict=True):
            for v in (values[0], values[-1]) if isinstance(values, range) else values:
                check_range(v, src, number, name, lo)
        out.extend(Given(q, src, number, "query_len") for q in dims[1] if q != 1)
    return out


def _range_stand_ins(body: str, src: str, line: int) -> tuple[str, list[range]]:
    """body with each ``range(...)`` replaced by the string literal 'range#k', and the k-th lazy range."""
    ranges: list[range] = []
    pieces, at = [], 0
    for m in _RANGE.finditer(body):
        ranges.append(_literal_range(m.group(1), src, line))
        pieces += [body[at:m.start()], repr(f"range#{len(ranges) - 1}")]
        at = m.end()
    return "".join(pieces) + body[at:], ranges


def _literal_range(args: str, src: str, line: int) -> range:
    """``range(...)``'s arguments, each a literal integer; the range stays lazy."""
    try:
        values = ast.literal_eval(f"({args},)")
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise InputError(src, line, "range", f"arguments must be literal integers, got {shown(args)}") from None
    if not 1 <= len(values) <= 3 or any(isinstance(v, bool) or not isinstance(v, int) for v in values):
        raise InputError(src, line, "range", f"expected range(a, b[, step]) of integers, got range({args})")
    if len(values) == 3 and values[2] == 0:
        raise InputError(src, line, "range", "step must not be zero")
    r = range(*values)
    try:
        n = len(r)
    except OverflowError:
        n = MAX_BUCKETS + 1
    if n > MAX_BUCKETS:
        raise InputError(src, line, "range", f"range({args}) has more than {MAX_BUCKETS} values; refused "
                         "before expanding")
    if n == 0:
        raise InputError(src, line, "range", f"range({args}) is empty")
    return r if r.step > 0 else r[::-1]


def _gaudi_values(value, ranges: list[range], src: str, line: int, name: str) -> range | list[int]:
    """One element of a bucket tuple: an int, a list of ints or a recognised range."""
    if isinstance(value, str):
        return ranges[int(value.split("#")[1])]
    items = value if isinstance(value, list) else [value]
    if any(isinstance(v, str) for v in items):
        raise InputError(src, line, name, "range(...) cannot stand inside a list: use the range or a list")
    if not items:
        raise InputError(src, line, name, "empty list: the line would describe no bucket")
    for v in items:
        if isinstance(v, bool) or not isinstance(v, int):
            raise InputError(src, line, name, f"expected an integer, a list of integers or range(...), "
                             f"got {shown(v) if not isinstance(v, (tuple, set, dict)) else repr(v)[:40]}")
    return items


_BUCKET_VAR = re.compile(r"VLLM_(PROMPT|DECODE)_\w*BUCKET\w*")
_KNOWN_BUCKET_VARS = frozenset(f"VLLM_{phase}_{dim}_BUCKET_{p}" for phase in ("PROMPT", "DECODE")
                               for dim in ("BS", "QUERY", "SEQ", "CTX", "BLOCK")
                               for p in ("MIN", "STEP", "MAX", "LIMIT", "PAD_MAX", "PAD_PERCENT"))
GAUDI_STRATEGIES = ("exp", "lin", "pad")


def read_gaudi_env(path: Path, text: str, max_model_len: int | None) -> list[Given]:
    """``gaudi-env``: vllm-gaudi's bucketing variables; the shapes are the prompt query lengths.

    ``VLLM_BUCKETING_FROM_FILE`` wins over any strategy (as in vllm-gaudi); then the
    deprecated ``VLLM_EXPONENTIAL_BUCKETING`` (true -> exp, false -> lin) overrides
    ``VLLM_BUCKETING_STRATEGY`` (default exp).  A misspelt bucket variable is an error,
    not a silently ignored line.
    """
    src = str(path)
    env = env_vars(text, src)
    for name, v in env.items():
        if _BUCKET_VAR.fullmatch(name) and name not in _KNOWN_BUCKET_VARS:
            raise InputError(src, v.line, name, "unknown bucketing variable (a typo?)")
    bucket_file = env.get("VLLM_BUCKETING_FROM_FILE")
    if bucket_file is not None:
        target = Path(bucket_file.value)
        target = target if target.is_absolute() else path.parent / target
        if not bucket_file.value or not target.is_file():
            raise InputError(src, bucket_file.line, "VLLM_BUCKETING_FROM_FILE",
                             f"{str(target)!r} is not a file (relative paths are taken from {str(path.parent)!r})")
        return read_gaudi_file(target, read_text(target), max_model_len)
    strategy = gaudi_strategy(env, src)
    if strategy == "pad":
        v = env["VLLM_BUCKETING_STRATEGY"]
        raise InputError(src, v.line, "VLLM_BUCKETING_STRATEGY", "the pad strategy is not supported; "
                         "use lin, exp or VLLM_BUCKETING_FROM_FILE")
    if strategy == "exp":
        return gaudi_exp_query(env, src, max_model_len)
    return gaudi_lin_query(env, src)


def gaudi_strategy(env: dict[str, EnvValue], src: str) -> str:
    """The strategy vllm-gaudi would run with these variables."""
    legacy = env.get("VLLM_EXPONENTIAL_BUCKETING")
    if legacy is not None:
        flag = legacy.value.strip().lower()
        if flag not in ("1", "true", "t", "yes", "0", "false", "f", "no"):
            raise InputError(src, legacy.line, "VLLM_EXPONENTIAL_BUCKETING", f"expected true or false, "
                             f"got {legacy.value!r}")
        return "exp" if flag in ("1", "true", "t", "yes") else "lin"
    chosen = env.get("VLLM_BUCKETING_STRATEGY")
    if chosen is None:
        return "exp"
    if chosen.value not in GAUDI_STRATEGIES:
        raise InputError(src, chosen.line, "VLLM_BUCKETING_STRATEGY", f"expected one of "
                         f"{', '.join(GAUDI_STRATEGIES)}, got {chosen.value!r}")
    return chosen.value


def gaudi_lin_query(env: dict[str, EnvValue], src: str) -> list[Given]:
    """The ``lin`` prompt query ladder, from the QUERY variables or their legacy SEQ names."""
    cfg: list[int] = []
    names: list[str] = []
    for p in ("MIN", "STEP", "MAX"):
        new, old = f"VLLM_PROMPT_QUERY_BUCKET_{p}", f"VLLM_PROMPT_SEQ_BUCKET_{p}"
        a, b = env_int(env, src, new), env_int(env, src, old)
        if a is not None and b is not None and a != b:
            raise InputError(src, env[old].line, old, f"{b} disagrees with {new}={a}")
        if a is None and b is None:
            raise InputError(src, None, new, "missing (or its legacy name " + old + "); lin's default depends on "
                             "the server's block size and token budget")
        cfg.append(a if a is not None else b)
        names.append(new if a is not None else old)
    bmin, bstep, bmax = cfg
    if bmin > bmax:
        raise InputError(src, env[names[2]].line, names[2], f"{bmax} is below MIN {bmin}")
    n = lin_count(bmin, bstep, bmax)
    if n > MAX_BUCKETS:
        raise InputError(src, env[names[1]].line, names[1], f"the ladder has {n} values; at most {MAX_BUCKETS}")
    line = env[names[2]].line
    return [Given(v, src, line, names[2]) for v in lin_ladder(bmin, bstep, bmax)]


def gaudi_exp_query(env: dict[str, EnvValue], src: str, max_model_len: int | None) -> list[Given]:
    """The ``exp`` prompt query buckets vllm-gaudi derives, ignoring the user's QUERY values.

    block_size to max_model_len, ceil(log2(max_model_len)) + 1 points on a geometric
    scale rounded up to the block size -- before the server drops buckets over its
    token budget, which this file cannot know.
    """
    mml = max_model_len_of(env, src, max_model_len, "the exp strategy derives its buckets from the max model length")
    block = env_int(env, src, "BLOCK_SIZE") or DEFAULT_BLOCK_SIZE
    if block > mml:
        raise InputError(src, env["BLOCK_SIZE"].line if "BLOCK_SIZE" in env else None, "BLOCK_SIZE",
                         f"{block} is larger than the max model length {mml}")
    line = env["MAX_MODEL_LEN"].line if "MAX_MODEL_LEN" in env else None
    count = math.ceil(math.log2(mml)) + 1
    return [Given(v, src, line, "MAX_MODEL_LEN") for v in exp_ladder(block, block, mml, count)]


def read_nxdi(path: Path, text: str, max_model_len: int | None) -> list[Given]:
    """``nxdi``: NeuronConfig settings as JSON -- top level, or under neuron_config / override_neuron_config.

    Exactly one of those places may hold the settings.  context_encoding_buckets is sorted
    (as NxDI does on load) and its last entry must be <= max_context_length; without a
    list, bucketing gives powers of two from 128 to max_context_length, and with
    bucketing off the one shape is max_context_length.
    """
    src = str(path)
    top = load_json_object(text, src)
    keys = ("context_encoding_buckets", "token_generation_buckets", "max_context_length", "seq_len",
            "enable_bucketing")
    scopes: list[tuple[str, dict]] = [("", top)]
    for name in ("neuron_config", "override_neuron_config"):
        if name in top:
            if not isinstance(top[name], dict):
                raise InputError(src, key_line(text, name), name, f"expected an object, got {shown(top[name])}")
            scopes.append((name + ".", top[name]))
    holding = [(w, c) for w, c in scopes if any(k in c for k in keys)]
    if not holding:
        raise InputError(src, None, "context_encoding_buckets", "missing (no NeuronConfig settings found at the "
                         "top level, in neuron_config or in override_neuron_config)")
    if len(holding) > 1:
        raise InputError(src, None, holding[1][0].rstrip("."), f"NeuronConfig settings in both "
                         f"{holding[0][0].rstrip('.') or 'the top level'} and {holding[1][0].rstrip('.')}: "
                         "which one applies is ambiguous")
    where, conf = holding[0]
    enabled = conf.get("enable_bucketing")
    if enabled is not None and not isinstance(enabled, bool):
        raise InputError(src, key_line(text, "enable_bucketing"), f"{where}enable_bucketing",
                         f"expected true or false, got {shown(enabled)}")
    max_ctx = json_scalar(text, src, conf, "max_context_length", where)
    seq_len = json_scalar(text, src, conf, "seq_len", where)
    buckets = json_int_list(text, src, conf, "context_encoding_buckets", where, required=False)
    tkg = json_int_list(text, src, conf, "token_generation_buckets", where, required=False)
    if tkg and seq_len is not None and max(g.value for g in tkg) > seq_len:
        worst = max(tkg, key=lambda g: g.value)
        raise InputError(src, worst.line, worst.field, f"{worst.value} is above seq_len {seq_len}")
    if buckets is not None and enabled is False:
        raise InputError(src, key_line(text, "context_encoding_buckets"), f"{where}context_encoding_buckets",
                         "given while enable_bucketing is false")
    if buckets is not None:
        if max_ctx is not None and max(g.value for g in buckets) > max_ctx:
            worst = max(buckets, key=lambda g: g.value)
            raise InputError(src, worst.line, worst.field, f"{worst.value} is above max_context_length {max_ctx} "
                             "(the last bucket, after sorting, must be <= it)")
        return sorted(buckets, key=lambda g: g.value)
    if max_ctx is None:
        raise InputError(src, None, f"{where}context_encoding_buckets", "missing, and no max_context_length "
                         "to derive the buckets from")
    line, fld = key_line(text, "max_context_length"), f"{where}max_context_length"
    values = nxdi_default(max_ctx) if enabled else [max_ctx]
    return [Given(v, src, line, fld) for v in values]


def read_vllm_neuron(path: Path, text: str, max_model_len: int | None) -> list[Given]:
    """``vllm-neuron``: num_batched_tokens_buckets of the plugin's neuron_config.

    Takes the ``--additional-config`` object itself or this module's export (under
    additional_config, with engine_args).  Where max_num_batched_tokens / max_num_seqs
    are given, the largest bucket must EQUAL them, as the plugin requires.
    """
    src = str(path)
    top = load_json_object(text, src)
    holder, where = top, ""
    if "neuron_config" not in top and isinstance(top.get("additional_config"), dict):
        holder, where = top["additional_config"], "additional_config."
    conf = holder.get("neuron_config")
    if not isinstance(conf, dict):
        raise InputError(src, key_line(text, "neuron_config"), f"{where}neuron_config",
                         "missing or not an object (expected {\"neuron_config\": {\"num_batched_tokens_buckets\": "
                         "[...]}})")
    where += "neuron_config."
    tokens = json_int_list(text, src, conf, "num_batched_tokens_buckets", where)
    seqs = json_int_list(text, src, conf, "num_seqs_buckets", where, required=False)
    engine = top.get("engine_args", top)
    if not isinstance(engine, dict):
        raise InputError(src, key_line(text, "engine_args"), "engine_args", f"expected an object, got {shown(engine)}")
    for key, lst in (("max_num_batched_tokens", tokens), ("max_num_seqs", seqs)):
        value = json_scalar(text, src, engine, key, "engine_args." if engine is not top else "")
        if value is not None and lst and value != max(g.value for g in lst):
            raise InputError(src, key_line(text, key), key, f"{value} must equal the largest bucket, "
                             f"{max(g.value for g in lst)} (vllm-neuron requires it)")
    return tokens


def read_vllm_tpu(path: Path, text: str, max_model_len: int | None) -> list[Given]:
    """``vllm-tpu``: the ladder VLLM_TPU_BUCKET_PADDING_GAP generates up to the max model length,
    plus COMPILATION_SIZES (sizes added through --additional-config compilation_sizes).

    The max model length is the ``MAX_MODEL_LEN`` key or the ``max_model_len`` argument.
    """
    src = str(path)
    env = env_vars(text, src)
    mml = max_model_len_of(env, src, max_model_len, "the TPU ladder runs up to the max model length")
    gap = env_int(env, src, "VLLM_TPU_BUCKET_PADDING_GAP", lo=0) or 0
    n = tpu_count(gap, mml)
    if n > MAX_BUCKETS:
        raise InputError(src, env["VLLM_TPU_BUCKET_PADDING_GAP"].line, "VLLM_TPU_BUCKET_PADDING_GAP",
                         f"gap {gap} up to {mml} makes {n} sizes; at most {MAX_BUCKETS}")
    line = env["VLLM_TPU_BUCKET_PADDING_GAP"].line if "VLLM_TPU_BUCKET_PADDING_GAP" in env else None
    extra = env_int_list(env, src, "COMPILATION_SIZES")
    for g in extra:
        if g.value > mml:
            raise InputError(src, g.line, g.field, f"{g.value} is above the max model length {mml}: the server "
                             "ignores it")
    return [Given(v, src, line, "VLLM_TPU_BUCKET_PADDING_GAP") for v in tpu_ladder(gap, mml)] + extra


def read_json(path: Path, text: str, max_model_len: int | None) -> list[Given]:
    """``json``: exactly ``{"shapes": [...], "batch_sizes": [...], "buckets": {name: [...]}}``."""
    src = str(path)
    top = load_json_object(text, src)
    for key in top:
        if key not in ("shapes", "batch_sizes", "buckets"):
            raise InputError(src, key_line(text, key), key, "unknown key (expected shapes, batch_sizes, buckets)")
    shapes = json_int_list(text, src, top, "shapes", "")
    if "batch_sizes" in top and top["batch_sizes"] != []:
        json_int_list(text, src, top, "batch_sizes", "")
    buckets = top.get("buckets", {})
    if not isinstance(buckets, dict):
        raise InputError(src, key_line(text, "buckets"), "buckets", f"expected an object of named lists, "
                         f"got {shown(buckets)}")
    for name in buckets:
        json_int_list(text, src, buckets, name, "buckets.")
    return shapes


READERS: dict[str, Reader] = {
    "list": read_list,
    "gaudi-env": read_gaudi_env,
    "gaudi-file": read_gaudi_file,
    "nxdi": read_nxdi,
    "vllm-neuron": read_vllm_neuron,
    "vllm-tpu": read_vllm_tpu,
    "json": read_json,
}


# ---------------------------------------------------------------- writers


def contexts(spec: ExportSpec) -> list[int]:
    """Per-shape context buckets: shape + longest generation, rounded up to 64 and held under
    --max-model-len (the rounding must not push a bucket past the server's limit)."""
    cap = spec.max_model_len or MAX_LEN
    return sorted({min(align(u.context), cap) for u in spec.uses if u.context is not None})


def decode_buckets(spec: ExportSpec) -> list[tuple[int, int]]:
    """Gaudi decode buckets (batch n, total KV blocks) for every (shape, n) the plans use.

    A batch of n sequences at context c holds n * ceil(c / block size) blocks; the shape's
    context (its longest) covers every batch at that shape.
    """
    out = set()
    for u in spec.uses:
        if u.context is None:
            continue
        per_seq = -(-u.context // spec.block_size)
        out.update((n, n * per_seq) for n in (u.batch_sizes or (1,)))
    return sorted(out)


def _literal(values: list[int] | tuple[int, ...]) -> str:
    """One gaudi-file element: a bare int when there is one value, else a list."""
    return str(values[0]) if len(values) == 1 else "[" + ", ".join(map(str, values)) + "]"


def write_list(spec: ExportSpec) -> str:
    """``list``: a comment, then one shape a line."""
    return "# shapeplan export: compiled sequence lengths, one a line\n" + "".join(f"{s}\n" for s in spec.shapes)


def write_json(spec: ExportSpec) -> str:
    """``json``: shapes, the batch sizes used, and the context buckets when requests were given."""
    buckets = {"context": contexts(spec)} if spec.has_contexts else {}
    return json_text({"shapes": list(spec.shapes), "batch_sizes": list(spec.batch_sizes), "buckets": buckets})


def write_gaudi_file(spec: ExportSpec) -> str:
    """``gaudi-file``: exactly the (batch, shape) pairs used, and their decode buckets."""
    lines = ["# shapeplan export: vLLM on Gaudi bucket file. Start the server with",
             "# VLLM_BUCKETING_FROM_FILE=<this file>; it takes precedence over VLLM_BUCKETING_STRATEGY.",
             "# prompt: (batch sizes, query_len, ctx_blocks) -- each shape with the batch sizes the plans use"]
    lines += [f"({_literal(u.batch_sizes or (1,))}, {u.shape}, 0)" for u in spec.uses]
    decode = decode_buckets(spec)
    if decode:
        lines.append(f"# decode: (batch, 1, total KV blocks of the batch at block size {spec.block_size}), "
                     "a sequence's context being shape + longest generation")
        by_size: dict[int, list[int]] = {}
        for n, blocks in decode:
            by_size.setdefault(n, []).append(blocks)
        lines += [f"({n}, 1, {_literal(blocks)})" for n, blocks in sorted(by_size.items())]
    else:
        lines.append("# decode buckets need the generation lengths: export with --requests or --scenario")
    return "\n".join(lines) + "\n"


def write_gaudi_env(spec: ExportSpec) -> str:
    """``gaudi-env``: the lin strategy with a query ladder that generates exactly the shapes.

    Refused (one line naming gaudi-file) when no MIN/STEP/MAX generates exactly them:
    a covering ladder would compile lengths the plans never use, which is what they
    were optimised to avoid.
    """
    shapes = spec.shapes
    qmin, qstep, qmax = lin_cover(shapes)
    if lin_ladder(qmin, qstep, qmax) != list(shapes):
        raise InputError("--format", None, None,
                         f"gaudi-env cannot express the shapes {', '.join(map(str, shapes))}: the lin strategy "
                         "only makes ladders (MIN, doubling up to STEP, then +STEP up to MAX); export with "
                         "--format gaudi-file and set VLLM_BUCKETING_FROM_FILE to that file")
    sizes = spec.batch_sizes or (1,)
    lines = ["# shapeplan export: vLLM on Gaudi bucketing variables (VAR=value; source or pass as environment).",
             "# lin keeps these values; exp (the default) would overwrite them. VLLM_EXPONENTIAL_BUCKETING,",
             "# deprecated, overrides the strategy when set, so it is pinned to lin (false) as well.",
             "VLLM_BUCKETING_STRATEGY=lin",
             "VLLM_EXPONENTIAL_BUCKETING=false",
             f"# prompt query lengths: exactly the shapes {', '.join(map(str, shapes))}",
             *_triple("VLLM_PROMPT_QUERY_BUCKET", (qmin, qstep, qmax)),
             "# the same under the legacy names older releases read",
             *_triple("VLLM_PROMPT_SEQ_BUCKET", (qmin, qstep, qmax))]
    bs = lin_cover(sizes)
    lines += [(f"# prompt batch sizes: a ladder covering {', '.join(map(str, sizes))} "
               f"(it makes {', '.join(map(str, lin_ladder(*bs)))}); lin crosses it with every query length"),
              *_triple("VLLM_PROMPT_BS_BUCKET", bs)]
    decode = decode_buckets(spec)
    if decode:
        dbs = lin_cover([n for n, _ in decode])
        blocks = lin_cover([b for _, b in decode])
        lines += [(f"# decode: batch sizes and total KV blocks (block size {spec.block_size}); each ladder "
                   "covers what the plans' batches need"),
                  *_triple("VLLM_DECODE_BS_BUCKET", dbs), *_triple("VLLM_DECODE_BLOCK_BUCKET", blocks)]
    else:
        lines.append("# decode buckets need the generation lengths: export with --requests or --scenario")
    return "\n".join(lines) + "\n"


def _triple(prefix: str, cfg: tuple[int, int, int]) -> list[str]:
    return [f"{prefix}_{p}={v}" for p, v in zip(("MIN", "STEP", "MAX"), cfg, strict=True)]


def write_nxdi(spec: ExportSpec) -> str:
    """``nxdi``: NeuronConfig keyword arguments; every list sorted, each maximum equal to its limit."""
    shapes = list(spec.shapes)
    conf: dict[str, object] = {"enable_bucketing": True, "context_encoding_buckets": shapes}
    tkg = contexts(spec)
    if tkg:
        conf["token_generation_buckets"] = tkg
    conf["max_context_length"] = shapes[-1]
    conf["seq_len"] = spec.max_model_len or (tkg[-1] if tkg else shapes[-1])
    conf["batch_size"] = max(spec.batch_sizes or (1,))
    return json_text(conf)


def write_vllm_neuron(spec: ExportSpec) -> str:
    """``vllm-neuron``: the --additional-config object and the engine maxima its lists must end at."""
    tokens = list(spec.shapes)
    seqs = list(spec.batch_sizes or (1,))
    return json_text({
        "comment": "shapeplan export for the vllm-neuron plugin: pass additional_config as --additional-config and "
                   "engine_args as --max-num-batched-tokens / --max-num-seqs. Buckets are token budgets per "
                   "scheduler step (requests packed together): the plans' shapes are used as token budgets.",
        "additional_config": {"neuron_config": {"num_batched_tokens_buckets": tokens, "num_seqs_buckets": seqs}},
        "engine_args": {"max_num_batched_tokens": tokens[-1], "max_num_seqs": seqs[-1]},
    })


def tpu_plan(shapes: tuple[int, ...], max_len: int) -> tuple[int, list[int], list[int]]:
    """(gap, compiled sizes, compilation sizes): the gap whose ladder plus the shapes it misses
    compiles the fewest sizes (ties: fewer compilation sizes, then the smaller gap).

    Gaps tried: 0 and every multiple of 64 up to max_len (beyond 16 and 32, which round
    up to 64, those ladders are multiples of 64 like the shapes).
    """
    wanted = set(shapes)
    best: tuple[tuple[int, int, int], list[int], list[int]] | None = None
    for gap in (0, *range(GRANULARITY, max_len + 1, GRANULARITY)):
        ladder = {align(v) for v in tpu_ladder(gap, max_len)}
        missing = sorted(wanted - ladder)
        key = (len(ladder) + len(missing), len(missing), gap)
        if best is None or key < best[0]:
            best = (key, sorted(ladder | wanted), missing)
    assert best is not None
    return best[0][2], best[1], best[2]


def write_vllm_tpu(spec: ExportSpec) -> str:
    """``vllm-tpu``: padding gap, max model length and the compilation sizes the ladder misses."""
    shapes = spec.shapes
    mml = spec.max_model_len or max(shapes[-1], *(u.context or 0 for u in spec.uses))
    gap, compiled, extra = tpu_plan(shapes, mml)
    ladder = tpu_ladder(gap, mml)
    lines = ["# shapeplan export for vLLM on TPU (VAR=value lines).",
             "# TPU buckets are token budgets per scheduler step (requests packed together), not per-request",
             "# prompt lengths: the plans' shapes are used as token budgets.",
             "# The server compiles its whole ladder: gap 0 doubles from 16 until the max model length is",
             "# covered; gap g doubles from 16 up to g, then adds g. Extra sizes go in compilation_sizes,",
             "# passed as --additional-config '{\"compilation_sizes\": [...]}'; they are ADDED to the ladder.",
             "# MAX_MODEL_LEN and COMPILATION_SIZES are not read by vLLM: they record --max-model-len and",
             "# the compilation_sizes this export needs.",
             f"# ladder: {', '.join(map(str, ladder))}",
             f"# compiled in all (rounded up to 64): {', '.join(map(str, compiled))}",
             f"# start: --max-model-len {mml}"
             + (f" --additional-config '{{\"compilation_sizes\": [{', '.join(map(str, extra))}]}}'" if extra else ""),
             f"VLLM_TPU_BUCKET_PADDING_GAP={gap}",
             f"MAX_MODEL_LEN={mml}"]
    if extra:
        lines.append(f"COMPILATION_SIZES={','.join(map(str, extra))}")
    return "\n".join(lines) + "\n"


WRITERS: dict[str, Callable[[ExportSpec], str]] = {
    "list": write_list,
    "gaudi-file": write_gaudi_file,
    "gaudi-env": write_gaudi_env,
    "nxdi": write_nxdi,
    "vllm-neuron": write_vllm_neuron,
    "vllm-tpu": write_vllm_tpu,
    "json": write_json,
}
