"""A user's data file as records, each carrying its place in the file: the file's own 1-based
line (JSONL: the record's line; a JSON array: the line its record starts on; CSV: the row's
line, the header counted) or a Parquet row. An error about a record, found when reading it or
later (a missing or wrongly typed field), then names the line an editor shows."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from paratrain.errors import DataError

_SKIP_SPACE = json.decoder.WHITESPACE.match


class Record(dict):
    """One record's fields, and where it is in its file ("line 37", "row 5")."""

    __slots__ = ("place",)

    def __init__(self, fields: dict, place: str):
        super().__init__(fields)
        self.place = place


def place_of(record: dict, index: int) -> str:
    """Where a record is: its place in its file, else (a hub data set's) its 0-based index."""
    return getattr(record, "place", None) or f"record {index}"


def read_file(p: Path, kind: str) -> list[Record]:
    """The records of p read as `kind` (json, jsonl, csv, parquet): one-line DataErrors."""
    records = _read(p, kind)
    if not records:
        raise DataError(f"data.path: {p} is empty (no records)")
    return records


def _read(p: Path, kind: str) -> list[Record]:
    try:
        if kind == "parquet":
            import pyarrow.parquet as pq

            rows = pq.read_table(p).to_pylist()
            return [Record(r, f"row {n}") for n, r in enumerate(rows, 1)]
        if kind == "csv":
            return csv_records(p)
        text = p.read_text(encoding="utf-8")
    except (OSError, ValueError) as e:  # pyarrow's errors, a bad encoding: ValueErrors
        if isinstance(e, DataError):
            raise
        raise DataError(f"data.path: cannot read {p} ({str(e).splitlines()[0][:160]})") from None
    if not text.strip():
        raise DataError(f"data.path: {p} is empty (no records)")
    return jsonl_records(p, text) if kind == "jsonl" else json_records(p, text)


def not_json(p: Path, e: json.JSONDecodeError, line: int | None = None) -> DataError:
    """A syntax error at the file's line and column (a JSONL line is decoded alone: its line
    number is given, the decoder's own is 1)."""
    return DataError(
        f"data.path: cannot read {p} line {line or e.lineno}: not JSON "
        f"({e.msg} at column {e.colno})"
    )


def not_a_record(p: Path, place: str, value: object, shape: str) -> DataError:
    kind = {list: "an array", str: "a string"}.get(type(value), type(value).__name__)
    return DataError(f"data.path: {p} {place}: {kind}, not a record ({shape})")


def jsonl_records(p: Path, text: str) -> list[Record]:
    """One JSON object a line. Lines end at \\n only: str.splitlines would also cut at U+2028
    and other separators that JSON allows inside a string, and miscount the lines."""
    records = []
    for number, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise not_json(p, e, number) from None
        if not isinstance(record, dict):
            raise not_a_record(p, f"line {number}", record, "one JSON object a line")
        records.append(Record(record, f"line {number}"))
    return records


def json_records(p: Path, text: str) -> list[Record]:
    """A JSON array of objects, decoded one element at a time so that each keeps the line it
    starts on; positions are the whole text's, so a syntax error names the file's line."""
    decoder = json.JSONDecoder()
    at = _SKIP_SPACE(text, 0).end()
    try:
        if not text.startswith("[", at):
            json.loads(text)  # a syntax error where it is; else valid JSON that is no array
            raise DataError(f"data.path: {p} must hold a list of records (objects)")
        records: list[Record] = []
        line, counted = 1, 0
        at = _SKIP_SPACE(text, at + 1).end()
        more = not text.startswith("]", at)  # [] holds no records
        while more:
            value, end = decoder.raw_decode(text, at)
            line, counted = line + text.count("\n", counted, at), at
            if not isinstance(value, dict):
                raise not_a_record(p, f"line {line}", value, "a list of JSON objects")
            records.append(Record(value, f"line {line}"))
            at = _SKIP_SPACE(text, end).end()
            more = text.startswith(",", at)
            if not more and not text.startswith("]", at):
                raise json.JSONDecodeError("Expecting ',' delimiter", text, at)
            at = _SKIP_SPACE(text, at + 1).end()
        if not records:
            at = _SKIP_SPACE(text, at + 1).end()
        if at < len(text):
            raise json.JSONDecodeError("Extra data", text, at)
    except json.JSONDecodeError as e:
        raise not_json(p, e) from None
    return records


def csv_records(p: Path) -> list[Record]:
    """A header row, then a record a row, named by the line the row starts on (a quoted field
    may span lines). A short row leaves its last columns out rather than filling them with
    None, so a missing value is said to be missing."""
    records = []
    with open(p, newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        header, start = None, 1
        try:
            for row in reader:
                line, start = start, reader.line_num + 1
                if not row:  # a blank line
                    continue
                if header is None:
                    header = row
                    continue
                records.append(Record(dict(zip(header, row, strict=False)), f"line {line}"))
        except csv.Error as e:
            raise DataError(f"data.path: cannot read {p} line {reader.line_num}: {e}") from None
    return records
