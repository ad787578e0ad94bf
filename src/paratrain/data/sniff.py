"""Which data source a path holds, read from the path itself: MNIST's IDX files, a folder of
class folders, plain text, or the records of one of the instruction formats. The run's plan
asks this when a user gives data.path over a recipe whose source reads no files."""

from __future__ import annotations

import json
from pathlib import Path

from paratrain.errors import DataError

# The fields that tell the instruction formats apart (data/text/formats.py reads them).
RECORD_FIELDS = {
    "alpaca": ("instruction", "output"),
    "grammar": ("input", "output"),
    "samsum": ("dialogue", "summary"),
    "slimorca": ("conversations",),
    "text-labels": ("text", "label"),
}
RECORD_FILES = (".json", ".jsonl", ".parquet", ".csv")


def source_of(path: str, candidates: tuple[str, ...]) -> str | None:
    """The first of `candidates` (data.source values) whose reader fits what is at path."""
    return next((s for s in candidates if fits(s, Path(path))), None)


def fits(source: str, p: Path) -> bool:
    if source == "mnist":
        return p.is_dir() and _has_mnist(p)
    if source == "imagefolder":
        return p.is_dir() and any(c.is_dir() for c in p.iterdir()) and not _has_mnist(p)
    if source == "text":
        return (p.is_file() and p.suffix == ".txt") or (p.is_dir() and any(p.rglob("*.txt")))
    if source in RECORD_FIELDS:
        record = first_record(p)
        return record is not None and all(k in record for k in RECORD_FIELDS[source])
    return False


def _has_mnist(p: Path) -> bool:
    from paratrain.data.sources import find_mnist_files

    try:
        find_mnist_files(p, True)
    except DataError:
        return False
    return True


def first_record(p: Path) -> dict | None:
    """The first record of a JSON / JSONL / Parquet / CSV file, or None if it holds none."""
    if not p.is_file() or p.suffix not in RECORD_FILES:
        return None
    try:
        if p.suffix == ".parquet":
            import pyarrow.parquet as pq

            rows = pq.ParquetFile(p).read_row_group(0).slice(0, 1).to_pylist()
            return rows[0] if rows else None
        if p.suffix == ".csv":
            import csv

            with p.open(newline="") as f:
                return next(csv.DictReader(f), None)
        if p.suffix == ".jsonl":
            with p.open() as f:
                line = next((x for x in f if x.strip()), None)
            return json.loads(line) if line else None
        data = json.loads(p.read_text())
    except (OSError, ValueError, StopIteration):
        return None
    return data[0] if isinstance(data, list) and data and isinstance(data[0], dict) else None
