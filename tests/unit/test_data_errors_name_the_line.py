"""An error about a record of a user's data file names the file and the line an editor shows
(a Parquet file: the row), for a syntax error and a missing or wrongly typed field alike, in
every text source: the instruction formats (JSON, JSONL, CSV, Parquet) and text-labels."""

import json
import re

import pytest

from paratrain.data.text import data as lmdata
from paratrain.data.text.encoder import read_labelled
from paratrain.data.text.tokenizer import byte_tokenizer
from paratrain.errors import DataError

GOOD = {"instruction": "a", "input": "", "output": "b"}


def alpaca_error(path) -> str:
    """The line a user sees for an alpaca file: reading it, then its records' fields."""
    with pytest.raises(DataError) as e:
        records = lmdata.read_records(str(path))
        lmdata.tokenize(
            records, "alpaca", byte_tokenizer(), max_length=4096, truncation=False, where=str(path)
        )
    assert "\n" not in str(e.value)
    return str(e.value)


def jsonl(tmp_path, name, lines) -> str:
    f = tmp_path / name
    f.write_text("\n".join(lines) + "\n")
    return f


@pytest.mark.parametrize(
    "bad,says",
    [
        ({"instruction": "x"}, "line 37: missing field 'output'"),
        ({"instruction": "x", "output": 3}, "line 37: field 'output' must be text, got int"),
    ],
)
def test_alpaca_jsonl_field_errors_name_the_files_line(tmp_path, bad, says):
    # a blank line among the first 36: the record's index (35) is not its line
    lines = [json.dumps(GOOD)] * 35 + ["", json.dumps(bad)]
    f = jsonl(tmp_path, "d.jsonl", lines)
    assert f"{f} {says}" in alpaca_error(f)


def test_alpaca_json_array_records_are_named_by_the_line_they_start_on(tmp_path):
    records = [GOOD] * 5 + [{"instruction": "x", "output": None}] + [GOOD]
    f = tmp_path / "d.json"
    f.write_text(json.dumps(records, indent=2))  # each record spans 5 lines, from line 2
    assert f"{f} line 27: field 'output' must be text, got NoneType" in alpaca_error(f)
    f.write_text("[\n" + ",\n".join(json.dumps(r) for r in records[:5]) + ',\n  "oops"\n]')
    assert f"{f} line 7: a string, not a record" in alpaca_error(f)


@pytest.mark.parametrize(
    "text,says",
    [
        (
            '[\n  {"instruction": "a", "output": "b"},\n  {"instruction": "a" "output": "b"}\n]',
            "line 3: not JSON (Expecting ',' delimiter at column 23)",
        ),
        (
            '[\n  {"instruction": "a", "output": "b"}\n  {"instruction": "a"}\n]',
            "line 3: not JSON (Expecting ',' delimiter at column 3)",
        ),
        ('[\n  {"instruction": "a", "output": "b"}\n]\n]', "line 4: not JSON (Extra data"),
        ('{\n  "instruction": "a",\n  oops\n}', "line 3: not JSON"),
    ],
)
def test_json_syntax_errors_name_the_files_line_and_column(tmp_path, text, says):
    f = tmp_path / "d.json"
    f.write_text(text)
    assert f"cannot read {f} {says}" in alpaca_error(f)


def test_alpaca_csv_rows_are_named_by_their_line_header_counted(tmp_path):
    f = tmp_path / "d.csv"
    f.write_text('instruction,output\na,b\n\n"two\nlines",b\nc\n')
    assert f"{f} line 6: missing field 'output'" in alpaca_error(f)
    f.write_text("instruction,output\na,b\n")
    assert [r["output"] for r in lmdata.read_records(str(f))] == ["b"]


def test_alpaca_parquet_records_are_named_by_their_row(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    f = tmp_path / "d.parquet"
    rows = [{"instruction": "a", "output": "b"}] * 4 + [{"instruction": "a", "output": None}]
    pq.write_table(pa.Table.from_pylist(rows), f)
    assert f"{f} row 5: field 'output' must be text, got NoneType" in alpaca_error(f)


def test_a_line_separator_inside_a_jsonl_string_is_no_line_break(tmp_path):
    """JSON allows U+2028 raw in a string (json.dumps(ensure_ascii=False) writes it)."""
    lines = [json.dumps({"instruction": "a\u2028b", "output": "c"}, ensure_ascii=False)] * 3
    f = jsonl(tmp_path, "d.jsonl", [*lines, json.dumps({"instruction": "x"})])
    records = lmdata.read_records(str(f))
    assert records[0]["instruction"] == "a\u2028b"
    assert f"{f} line 4: missing field 'output'" in alpaca_error(f)


def labelled_error(f) -> str:
    with pytest.raises(DataError) as e:
        read_labelled(str(f))
    assert "\n" not in str(e.value)
    return str(e.value)


def test_text_labels_jsonl_errors_name_the_files_line(tmp_path):
    good = json.dumps({"text": "some words", "label": "a"})
    f = jsonl(tmp_path, "l.jsonl", [good] * 36 + ['{"text": "x", "label": "b",, }'])
    says = labelled_error(f)
    assert f"cannot read {f} line 37: not JSON" in says and "line 1" not in says
    f = jsonl(tmp_path, "l.jsonl", [good] * 35 + ["", json.dumps({"text": "x"})])
    assert f"{f} line 37: missing field 'label' (has: text)" in labelled_error(f)
    f = jsonl(tmp_path, "l.jsonl", [good] * 36 + [json.dumps({"text": "x", "label": [1]})])
    assert f"{f} line 37: field 'label' must be a name or an integer, got list" in (
        labelled_error(f)
    )
    f = jsonl(tmp_path, "l.jsonl", [good] * 36 + [json.dumps({"text": None, "label": "b"})])
    assert f"{f} line 37: field 'text' must be text, got NoneType" in labelled_error(f)


def test_text_labels_csv_rows_are_named_by_their_line(tmp_path):
    f = tmp_path / "l.csv"
    f.write_text('text,label\n"a\nb",x\ny,z\nno label here\n')
    assert re.search(rf"{re.escape(str(f))} line 5: missing field 'label'", labelled_error(f))
    f.write_text('text,label\n"a\nb",x\ny,z\n')
    assert read_labelled(str(f)) == (["a\nb", "y"], [0, 1], ["x", "z"])


def test_a_run_on_a_broken_text_labels_file_says_its_line_in_one_line(tmp_path, capsys):
    from paratrain.cli import main

    good = json.dumps({"text": "some words", "label": "a"})
    f = jsonl(tmp_path, "l.jsonl", [good] * 36 + ['{"text": "x", oops}'])
    settings = ["task=text_classification", "data.source=text-labels", f"data.path={f}"]
    settings += ["model.init=random", "model.shape=tiny-bert", "device=cpu", "data.max_length=64"]
    args = [x for s in settings for x in ("--set", s)]
    assert main(["run", *args, "--output-dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"cannot read {f} line 37: not JSON (Expecting property name" in err
