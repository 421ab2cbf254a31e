"""Request loading: the three formats agree, real traces load, and errors keep their line numbers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import TRACES
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from model.base.errors import InputError
from model.load.requests import MAX_LEN, Columns, line_numbers, load_requests
from model.load.synth import CHAT, SHORT, bucket_arrays, requests_jsonl


def sample(n: int = 300, seed: int = 3) -> pd.DataFrame:
    """A small bucket drawn like the default scenario's chat traffic."""
    ids, prompt, gen = bucket_arrays(np.random.default_rng(seed), CHAT, n)
    return pd.DataFrame({"request_id": ids, "prompt_len": prompt, "gen_len": gen})


def write(frame: pd.DataFrame, path: Path) -> Path:
    """The frame in the format its suffix names."""
    if path.suffix == ".jsonl":
        path.write_text(requests_jsonl(frame.request_id.to_numpy(), frame.prompt_len, frame.gen_len))
    elif path.suffix == ".csv":
        frame.to_csv(path, index=False)
    else:
        pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), path)
    return path


@pytest.mark.parametrize("suffix, first_line", [(".jsonl", 1), (".csv", 2), (".parquet", 1)])
def test_round_trip_every_format(tmp_path: Path, suffix: str, first_line: int):
    frame = sample()
    bucket = load_requests(write(frame, tmp_path / f"reqs{suffix}"))
    assert bucket.name == "reqs" and len(bucket) == len(frame)
    assert list(bucket.request_ids) == list(frame.request_id)
    assert bucket.prompt_len.dtype == np.int64 and bucket.gen_len.dtype == np.int64
    np.testing.assert_array_equal(bucket.prompt_len, frame.prompt_len)
    np.testing.assert_array_equal(bucket.gen_len, frame.gen_len)
    np.testing.assert_array_equal(bucket.lines, np.arange(len(frame)) + first_line)


def test_synth_text_is_what_json_dumps_writes():
    ids, prompt, gen = bucket_arrays(np.random.default_rng(0), SHORT, 50)
    expected = "".join(json.dumps({"request_id": i, "prompt_len": int(p), "gen_len": int(g)}) + "\n"
                       for i, p, g in zip(ids, prompt, gen, strict=True))
    assert requests_jsonl(ids, prompt, gen) == expected


@pytest.mark.parametrize("name, rows", [("AzureLLMInferenceTrace_conv.csv", 19366),
                                        ("AzureLLMInferenceTrace_code.csv", 8819)])
def test_azure_trace_with_the_azure_preset(name: str, rows: int):
    path = TRACES / name
    bucket = load_requests(path, columns=Columns.parse("azure"))
    raw = pd.read_csv(path)
    assert len(bucket) == rows
    assert list(bucket.request_ids[:3]) == ["0", "1", "2"] and bucket.request_ids[-1] == str(rows - 1)
    np.testing.assert_array_equal(bucket.prompt_len, raw.ContextTokens)
    np.testing.assert_array_equal(bucket.gen_len, raw.GeneratedTokens)
    assert bucket.lines[0] == 2  # the header is line 1


def test_azure_header_is_recognised_without_the_flag():
    bucket = load_requests(TRACES / "AzureLLMInferenceTrace_code.csv")
    assert len(bucket) == 8819 and bucket.request_ids[0] == "0"


@pytest.mark.parametrize("name, text, ids", [
    ("numeric.jsonl", '{"request_id": 7, "prompt_len": 3, "gen_len": 4}\n{"request_id": 12, "prompt_len": 5, "gen_len": 6}\n',
     ["7", "12"]),
    ("mixed.jsonl", '{"request_id": 7, "prompt_len": 3, "gen_len": 4}\n{"request_id": "x", "prompt_len": 5, "gen_len": 6}\n',
     ["7", "x"]),  # pyarrow refuses mixed types: the slow path must agree
    ("zeros.csv", "request_id,prompt_len,gen_len\n007,3,4\n8,5,6\n", ["007", "8"]),  # CSV ids stay text
])
def test_ids_become_strings(tmp_path: Path, name: str, text: str, ids: list[str]):
    path = tmp_path / name
    path.write_text(text)
    bucket = load_requests(path)
    assert list(bucket.request_ids) == ids and bucket.prompt_len.tolist() == [3, 5]


def test_explicit_columns_and_row_numbering(tmp_path: Path):
    path = tmp_path / "r.csv"
    path.write_text("when,p,g\n0.1,30,4\n0.2,50,6\n")
    bucket = load_requests(path, columns=Columns.parse("p,g"))
    assert list(bucket.request_ids) == ["0", "1"] and list(bucket.prompt_len) == [30, 50]


def test_blank_lines_are_skipped_and_later_errors_keep_their_line(tmp_path: Path):
    path = tmp_path / "r.jsonl"
    path.write_text('\n{"request_id": "a", "prompt_len": 3, "gen_len": 4}\n\n \r\n'
                    '{"request_id": "b", "prompt_len": 5, "gen_len": 6}\n\n')
    assert list(load_requests(path).lines) == [2, 5]
    path.write_text(path.read_text() + '{"request_id": "c", "prompt_len": 0, "gen_len": 6}\n')
    with pytest.raises(InputError, match=r"r\.jsonl:7: field 'prompt_len': must be a positive integer, got 0$"):
        load_requests(path)


def test_crlf_line_endings(tmp_path: Path):
    path = tmp_path / "r.jsonl"
    path.write_bytes(b'{"request_id": "a", "prompt_len": 3, "gen_len": 4}\r\n\r\n'
                     b'{"request_id": "b", "prompt_len": 5, "gen_len": 6}\r\n')
    assert list(load_requests(path).lines) == [1, 3]


def test_line_separator_inside_a_string_does_not_split_the_line(tmp_path: Path):
    """U+2028 is legal inside a JSON string; only "\\n" ends a JSONL record."""
    path = tmp_path / "r.jsonl"
    path.write_text('{"request_id": "a\u2028b", "prompt_len": 3, "gen_len": 4}\n'
                    '{"request_id": "c", "prompt_len": 3, "gen_len": "x"}\n', encoding="utf-8")
    with pytest.raises(InputError, match=r":2: field 'gen_len'"):
        load_requests(path)


def test_integral_floats_are_lengths(tmp_path: Path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"request_id": "a", "prompt_len": 3.0, "gen_len": 4}\n')
    assert load_requests(path).prompt_len.tolist() == [3]


def test_line_numbers_of_blank_and_whitespace_lines():
    assert line_numbers(b"a\n\n  \n\tb\r\n\r\nc").tolist() == [1, 4, 6]
    assert line_numbers(b"").tolist() == []


good_rows = st.lists(st.tuples(st.integers(1, MAX_LEN), st.integers(1, MAX_LEN)), min_size=1, max_size=30)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=good_rows, blanks=st.lists(st.integers(0, 3), min_size=31, max_size=31),
       bad_at=st.integers(0, 29), bad=st.sampled_from(['0', '-1', '"x"', "1.5", "true", "null", str(MAX_LEN + 1)]))
def test_the_first_bad_line_is_named_wherever_it_is(tmp_path: Path, rows, blanks, bad_at, bad):
    """Among blank lines and good rows, one bad value is reported at its physical line."""
    bad_at = bad_at % len(rows)
    text, line, bad_line = "", 0, None
    for i, (p, g) in enumerate(rows):
        text += "\n" * blanks[i]
        line += blanks[i] + 1
        gen = bad if i == bad_at else str(g)
        bad_line = line if i == bad_at else bad_line
        text += f'{{"request_id": "r{i}", "prompt_len": {p}, "gen_len": {gen}}}\n'
    path = tmp_path / "p.jsonl"
    path.write_text(text)
    with pytest.raises(InputError) as exc:
        load_requests(path)
    assert (exc.value.line, exc.value.field) == (bad_line, "gen_len")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=good_rows, ids=st.lists(st.one_of(st.text(min_size=1, max_size=8), st.integers(-10**12, 10**12)),
                                    min_size=30, max_size=30, unique_by=str))
def test_any_good_file_loads_exactly(tmp_path: Path, rows, ids):
    """Whatever ids (text of any kind, or integers) and lengths, the bucket is what was written."""
    ids = ids[:len(rows)]
    rows = rows[:len(ids)]
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps({"request_id": i, "prompt_len": p, "gen_len": g}) + "\n"
                            for i, (p, g) in zip(ids, rows, strict=True)), encoding="utf-8")
    bucket = load_requests(path)
    assert list(bucket.request_ids) == [str(i) for i in ids]
    assert bucket.prompt_len.tolist() == [p for p, _ in rows] and bucket.gen_len.tolist() == [g for _, g in rows]


HEAD = "request_id,prompt_len,gen_len,arrival_s\n"


@pytest.mark.parametrize("name, text, message", [
    # 5,000 digits: past what int() converts (it raised ValueError); 10**7: pyarrow cannot place the field in a
    # block and the csv module's field limit refused it (a _csv.Error traceback)
    ("long.csv", HEAD + "a," + "9" * 5000 + ",5,0\n", r"long\.csv:2: field 'prompt_len': must be at most 1048576, "
                                                      r"got '9{56}\.\.\. \(5000 digits\)$"),
    ("neg.csv", HEAD + "a,10,5,0\nb,-" + "9" * 5000 + ".0,5,0\n", r"neg\.csv:3: field 'prompt_len': must be a "
                                                                  r"positive integer, got '-9{55}\.\.\. \(5000 digits\)$"),
    ("field.csv", HEAD + "a,10,5,0\nb,10," + "9" * 10**7 + ",0\n", r"field\.csv:3: malformed CSV: field larger"),
    ("quoted.csv", HEAD + '"a\nb",10,5,0\nc,' + "9" * 200_000 + ",5,1\n", r"quoted\.csv:4: malformed CSV: field larger"),
    # a JSON integer no float holds made pandas raise OverflowError; in a column with text, "expected an integer"
    ("big.jsonl", '{"request_id": "a", "prompt_len": 1' + "0" * 400 + ', "gen_len": 5}\n',
     r"big\.jsonl:1: field 'prompt_len': must be at most 1048576, got 10{56}\.\.\.$"),
    ("mixed.jsonl", '{"request_id": "a", "prompt_len": 1' + "0" * 400 + ', "gen_len": 5}\n'
                    '{"request_id": "b", "prompt_len": "x", "gen_len": 5}\n',
     r"mixed\.jsonl:1: field 'prompt_len': must be at most 1048576, got 10{56}\.\.\.$"),
    ("deep.jsonl", "[" * 100_000 + "\n", r"deep\.jsonl:1: malformed JSON: nested too deeply$"),  # RecursionError
])
def test_hostile_numbers_and_fields_are_one_line_errors(tmp_path: Path, name: str, text: str, message: str):
    (tmp_path / name).write_text(text)
    with pytest.raises(InputError, match=message):
        load_requests(tmp_path / name)


def test_a_column_named_for_two_roles_is_one_line(tmp_path: Path):
    """pyarrow raised KeyError ('Field "prompt_len" exists 2 times in schema') for --time-column prompt_len and
    --columns p,p."""
    (tmp_path / "r.csv").write_text(HEAD + "a,10,5,0\n")
    with pytest.raises(InputError, match=r"^--time-column: 'prompt_len' is already the id or a length column$"):
        load_requests(tmp_path / "r.csv", time_column="prompt_len")
    with pytest.raises(InputError, match=r"^--columns: a column is named twice in 'prompt_len,prompt_len'"):
        Columns.parse("prompt_len,prompt_len")
