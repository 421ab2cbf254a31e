"""JSON-format line numbers: found in one pass over the text (bounded work for 100k entries and 64 bucket
names, counted, not timed), exactly where the per-entry rescans found them, and the caps on named lists.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from model.base.errors import InputError
from model.serving import lists, parse_json
from model.serving.formats import read_shapes
from model.serving.parse import MAX_BUCKET_NAMES, MAX_BUCKETS
from model.serving.parse_json import JsonLineIndex

SETTINGS = settings(max_examples=300, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow])


# ---------------------------------------------------------------- the rescans the index replaces (reference)


def rescan_key_line(text: str, key: str, nth: int = 0) -> int | None:
    """Line of the nth ``"key":``: one regex search over the whole text per call."""
    found = list(re.finditer(re.escape(json.dumps(key)) + r"\s*:", text))
    if len(found) <= nth:
        return None
    return text[:found[nth].start()].count("\n") + 1


def rescan_element_line(text: str, key: str, index: int) -> int | None:
    """Line of entry ``index`` of the list under the first ``"key": [``: a scan from the key per entry."""
    m = re.search(re.escape(json.dumps(key)) + r"\s*:\s*\[", text)
    if m is None:
        return rescan_key_line(text, key)
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
    return rescan_key_line(text, key)


# ---------------------------------------------------------------- the index gives the same lines

# keys with quotes, backslashes, colons, brackets and non-ASCII space: where a text search and a JSON
# reader could disagree about where a key is
KEY_CHARS = ['"', "\\", ":", ": ", ":[", " ", "\n", ",", "[", "]", "{", "}", "a", "\u00e9", "\u2003", "1"]
KEYS = st.lists(st.sampled_from(KEY_CHARS), max_size=4).map("".join) | st.sampled_from(["shapes", "buckets"])
VALUES = st.recursive(st.integers(0, 300) | st.none() | KEYS,
                      lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=3),
                      max_leaves=12)
GAPS = st.sampled_from(["", " ", "\n", "\n  ", "\t", "  \n\n "])
TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')


@st.composite
def json_texts(draw) -> str:
    """A JSON object with random whitespace in every gap and keys spelt ASCII-only or not."""
    def dump(value) -> str:
        if isinstance(value, dict):
            return "{" + ",".join(draw(GAPS) + json.dumps(k, ensure_ascii=draw(st.booleans())) + draw(GAPS) + ":"
                                  + draw(GAPS) + dump(v) + draw(GAPS) for k, v in value.items()) + "}"
        if isinstance(value, list):
            return "[" + ",".join(draw(GAPS) + dump(v) + draw(GAPS) for v in value) + "]"
        return json.dumps(value, ensure_ascii=draw(st.booleans()))
    return dump(draw(st.dictionaries(KEYS, VALUES, min_size=1, max_size=5)))


def keys_to_ask(text: str) -> list[str]:
    """Every key of the text, plus each stretch between two strings and each tail after an escaped quote
    read as a key: the spellings a text search can find somewhere other than at a key."""
    out: set[str] = set()

    def walk(value) -> None:
        if isinstance(value, dict):
            out.update(value)
            for v in value.values():
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)

    walk(json.loads(text))
    tokens = list(TOKEN.finditer(text))
    pieces = [text[a.end():b.start()] for a, b in zip(tokens, tokens[1:], strict=False)]
    pieces += [t.group()[i + 1:-1] for t in tokens for i, ch in enumerate(t.group()[:-1]) if ch == '"' and i]
    for piece in pieces:
        try:
            out.add(json.loads(f'"{piece}"'))
        except ValueError:
            pass
    return sorted(out)


@pytest.mark.slow  # 2-7 s each on 2 cores: the default run's 90 s budget; cheaper siblings cover it by default
@SETTINGS
@given(text=json_texts(), count=st.integers(0, 6))
@example(text='{"a":": [1, 2]", "b": 3}', count=3)  # a key's spelling from a closing quote into the next string
@example(text='{"x\\"a": [1,\n2]}', count=2)  # the key a, from the escaped quote of the key x"a
def test_the_index_gives_the_lines_the_rescans_gave(text: str, count: int):
    keys = keys_to_ask(text)
    index = JsonLineIndex(text, keys[::2])  # half asked for up front, half on demand
    for key in keys:
        assert index.key_line(key) == rescan_key_line(text, key), key
        assert index.element_lines(key, count) == [rescan_element_line(text, key, i) for i in range(count)], key


# ---------------------------------------------------------------- bounded work, counted


class Counted:
    """A compiled pattern whose searches are counted."""

    def __init__(self, pattern: re.Pattern, counts: dict[str, int], name: str):
        self.pattern, self.counts, self.name = pattern, counts, name

    def search(self, *args):
        self.counts[self.name] += 1
        return self.pattern.search(*args)


def long_config(entries: int, names: int, per_name: int) -> dict:
    """A json config: ``entries`` shapes, as many batch sizes, ``names`` bucket lists of ``per_name``."""
    return {"shapes": [64 * (1 + i % 100) for i in range(entries)], "batch_sizes": [1 + i % 64 for i in range(entries)],
            "buckets": {f"kind{k}": [64 * (1 + i % 7) for i in range(per_name)] for k in range(names)}}


@pytest.mark.slow  # 2-7 s each on 2 cores: the default run's 90 s budget; cheaper siblings cover it by default
def test_reading_100k_entries_and_64_named_lists_scans_the_text_once(tmp_path: Path, monkeypatch):
    """One pass finds every key; each list is scanned once for all its entries; no rescan from the top.

    Per entry the scan makes two searches (its start, the comma after it) and every newline is
    counted once for the keys and once for the entries: linear work, however many entries."""
    config = long_config(MAX_BUCKETS, MAX_BUCKET_NAMES, 10)
    text = json.dumps(config, indent=2)
    path = tmp_path / "long.json"
    path.write_text(text)
    counts = dict.fromkeys(["key_spots", "rescans", "element_offsets", "searches"], 0)
    spans: list[int] = []

    def counting(name, real):
        def wrapper(*args, **kwargs):
            counts[name] += 1
            return real(*args, **kwargs)
        return wrapper

    def measured_lines_at(text, offsets, at=0, line=1):
        offsets = list(offsets)
        spans.append(max(offsets, default=at) - at)
        return real_lines_at(text, offsets, at, line)

    real_lines_at = parse_json.lines_at
    monkeypatch.setattr(parse_json, "key_spots", counting("key_spots", parse_json.key_spots))
    monkeypatch.setattr(parse_json, "element_offsets", counting("element_offsets", parse_json.element_offsets))
    monkeypatch.setattr(parse_json, "key_line", counting("rescans", parse_json.key_line))
    monkeypatch.setattr(lists, "key_line", counting("rescans", lists.key_line))
    monkeypatch.setattr(parse_json, "lines_at", measured_lines_at)
    for name in ("_NOT_SPACE", "_STRUCTURE"):
        monkeypatch.setattr(parse_json, name, Counted(getattr(parse_json, name), counts, "searches"))

    got = read_shapes(path, "json")

    assert got.shapes == tuple(64 * k for k in range(1, 101))
    lists_read = 2 + MAX_BUCKET_NAMES
    entries = 2 * MAX_BUCKETS + 10 * MAX_BUCKET_NAMES
    assert counts["key_spots"] == 1 and counts["rescans"] == 0
    assert counts["element_offsets"] == lists_read
    assert counts["searches"] <= 2 * entries + lists_read
    assert sum(spans) <= 2 * len(text)


# ---------------------------------------------------------------- error lines in long, multi-entry files


def line_of(text: str, needle: str) -> int:
    """The line the one occurrence of needle is on."""
    assert text.count(needle) == 1
    return text[:text.index(needle)].count("\n") + 1


@pytest.mark.parametrize("entries, where, index", [(MAX_BUCKETS, "shapes", MAX_BUCKETS - 1), (1000, "shapes", 0),
                                                   (1000, "batch_sizes", 500), (1000, "kind0", 3), (1000, "kind5", 9)])
def test_a_bad_entry_in_a_long_file_names_its_own_line(tmp_path: Path, entries: int, where: str, index: int):
    config = long_config(entries, 6, 10)
    target = config["buckets"][where] if where.startswith("kind") else config[where]
    target[index] = -12345
    text = json.dumps(config, indent=2)
    path = tmp_path / "long.json"
    path.write_text(text)
    with pytest.raises(InputError) as exc:
        read_shapes(path, "json")
    fld = f"buckets.{where}[{index}]" if where.startswith("kind") else f"{where}[{index}]"
    assert (exc.value.line, exc.value.field) == (line_of(text, "-12345"), fld)
    assert "positive" in exc.value.message and "\n" not in exc.value.render()


@pytest.mark.parametrize("fmt, config, fld", [
    ("nxdi", {"neuron_config": {"context_encoding_buckets": [128, 256, 512, 1024, 77.5],
                                "token_generation_buckets": [128, 4096], "max_context_length": 1024}},
     "neuron_config.context_encoding_buckets[4]"),
    ("nxdi", {"context_encoding_buckets": [128, 256], "token_generation_buckets": [128, 256, 77.5]},
     "token_generation_buckets[2]"),
    ("vllm-neuron", {"additional_config": {"neuron_config": {"num_batched_tokens_buckets": [256, 512, 1024],
                                                             "num_seqs_buckets": [1, 2, 77.5, 8]}}},
     "additional_config.neuron_config.num_seqs_buckets[2]"),
])
def test_neuron_formats_name_the_line_of_a_bad_entry(tmp_path: Path, fmt: str, config: dict, fld: str):
    text = json.dumps(config, indent=2)
    path = tmp_path / "conf.json"
    path.write_text(text)
    with pytest.raises(InputError) as exc:
        read_shapes(path, fmt)
    assert (exc.value.line, exc.value.field) == (line_of(text, "77.5"), fld)


# ---------------------------------------------------------------- caps on named lists


def write_json(tmp_path: Path, config: dict) -> tuple[Path, str]:
    text = json.dumps(config, indent=2)
    path = tmp_path / "named.json"
    path.write_text(text)
    return path, text


def test_at_most_64_named_lists(tmp_path: Path):
    names = {f"kind{k}": [64] for k in range(MAX_BUCKET_NAMES)}
    path, _ = write_json(tmp_path, {"shapes": [64], "buckets": names})
    assert read_shapes(path, "json").shapes == (64,)
    path, text = write_json(tmp_path, {"shapes": [64], "buckets": {**names, "one_too_many": [64]}})
    with pytest.raises(InputError) as exc:
        read_shapes(path, "json")
    assert (exc.value.line, exc.value.field) == (line_of(text, '"one_too_many"'), "buckets")
    assert exc.value.message == f"{MAX_BUCKET_NAMES + 1} named lists; at most {MAX_BUCKET_NAMES}"


@pytest.mark.slow  # 2-7 s each on 2 cores: the default run's 90 s budget; cheaper siblings cover it by default
def test_named_lists_hold_at_most_max_buckets_entries_in_all(tmp_path: Path):
    half = MAX_BUCKETS // 2
    path, _ = write_json(tmp_path, {"shapes": [64], "buckets": {"a": [64] * half, "b": [64] * half}})
    assert read_shapes(path, "json").shapes == (64,)
    path, text = write_json(tmp_path, {"shapes": [64], "buckets": {"a": [64] * half, "b": [64] * half, "c": [64]}})
    with pytest.raises(InputError) as exc:
        read_shapes(path, "json")
    assert (exc.value.line, exc.value.field) == (line_of(text, '"c"'), "buckets.c")
    assert f"at most {MAX_BUCKETS} in all" in exc.value.message


def test_one_list_over_the_cap_keeps_its_own_message(tmp_path: Path):
    path, text = write_json(tmp_path, {"shapes": [64], "buckets": {"big": [64] * (MAX_BUCKETS + 1)}})
    with pytest.raises(InputError) as exc:
        read_shapes(path, "json")
    assert (exc.value.line, exc.value.field) == (line_of(text, '"big"'), "buckets.big")
    assert exc.value.message == f"{MAX_BUCKETS + 1} entries; at most {MAX_BUCKETS}"
