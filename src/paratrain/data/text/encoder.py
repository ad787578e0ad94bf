"""Text for encoder models (BERT): rows [CLS] tokens [SEP]; labelled text for sequence
classification without a download: the user's CSV / JSONL file (text-labels), or
python-docstrings, built here from the standard library's own source.

python-docstrings: every docstring of at least MIN_CHARS characters (modules, classes,
functions, methods) in eight packages of the standard library, labelled with the package it
belongs to: asyncio, email, http, importlib, logging, multiprocessing, unittest, xml. About
1,700 rows on Python 3.11 (the count moves a little between Python versions). It is a real
topic-classification task (which part of the library is this text about?) whose texts are
English prose with code words, and nothing outside Python is needed. No PyPI package was found
that ships a labelled sentence set inside its wheel (the sentiment packages ship lexicons:
vaderSentiment, textblob; nltk's corpora are a separate download).
"""

from __future__ import annotations

import ast
import sysconfig
from pathlib import Path

import torch

from paratrain.data.text.records import Record, read_file
from paratrain.errors import DataError

PACKAGES = (
    "asyncio",
    "email",
    "http",
    "importlib",
    "logging",
    "multiprocessing",
    "unittest",
    "xml",
)
MIN_CHARS = 40  # shorter docstrings ("Return self.") say nothing about their package
_DOCUMENTED = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def stdlib_docstrings() -> tuple[list[str], list[int], list[str]]:
    """-> (texts, label ids, label names), in a fixed order (sorted files, source order)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    texts, labels = [], []
    for label, package in enumerate(PACKAGES):
        for f in sorted((root / package).rglob("*.py")):
            if "test" in f.relative_to(root).parts or "tests" in f.relative_to(root).parts:
                continue
            try:
                tree = ast.parse(f.read_text(encoding="utf-8"))
            except (SyntaxError, UnicodeDecodeError, OSError):
                continue
            for node in ast.walk(tree):
                doc = ast.get_docstring(node) if isinstance(node, _DOCUMENTED) else None
                if doc and len(doc) >= MIN_CHARS:
                    texts.append(doc)
                    labels.append(label)
    return texts, labels, list(PACKAGES)


def read_labelled(path: str) -> tuple[list[str], list[int], list[str]]:
    """A CSV (with a header) or JSONL file with `text` and `label` columns -> (texts, label ids,
    label names). Labels are names or integers; ids follow their sorted order. A bad record is
    named by its line in the file (data/text/records.py)."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"data.path: no such file {path} (CSV or JSONL with text and label)")
    rows = read_file(p, "csv" if p.suffix == ".csv" else "jsonl")
    for row in rows:
        _labelled(p, row)
    raw = [row["label"] for row in rows]
    numeric = all(isinstance(v, int) or str(v).lstrip("-").isdigit() for v in raw)
    names = sorted({str(v) for v in raw}, key=int if numeric else str)
    if len(names) < 2:
        raise DataError(f"data.path: {p} has {len(names)} distinct label(s); classes need >= 2")
    ids = {name: i for i, name in enumerate(names)}
    return [row["text"] for row in rows], [ids[str(v)] for v in raw], names


def _labelled(p: Path, row: Record) -> None:
    """A row's text is text and its label a name or an integer; else one line naming the row."""
    for field, types in (("text", (str,)), ("label", (str, int))):
        if field not in row:
            has = ", ".join(sorted(map(str, row))) or "none"
            raise DataError(f"data.path: {p} {row.place}: missing field {field!r} (has: {has})")
        value = row[field]
        if not isinstance(value, types) or isinstance(value, bool):
            want = "text" if field == "text" else "a name or an integer"
            raise DataError(
                f"data.path: {p} {row.place}: field {field!r} must be {want}, "
                f"got {type(value).__name__}"
            )


def held_out_split(n: int, fraction: float) -> tuple[list[int], list[int]]:
    """A fixed shuffle (not the run's seed: every run holds out the same rows) -> (train, val)
    indices; rows of one source file sit together, so the held-out rows are drawn across all."""
    order = torch.randperm(n, generator=torch.Generator().manual_seed(0)).tolist()
    n_val = int(n * fraction)
    return order[n_val:], order[:n_val]


def encode(texts: list[str], tokenizer, max_length: int) -> list[list[int]]:
    """[CLS] text [SEP], the text cut to fit max_length."""
    body = max_length - 2
    encoded = tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    return [[cls, *ids[:body], sep] for ids in encoded]


def encode_documents(docs: list[str], tokenizer, max_length: int) -> list[list[int]]:
    """Documents cut into consecutive pieces, each [CLS] piece [SEP] (nothing dropped)."""
    body = max_length - 2
    encoded = tokenizer(docs, add_special_tokens=False)["input_ids"] if docs else []
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    return [
        [cls, *ids[first : first + body], sep]
        for ids in encoded
        for first in range(0, len(ids), body)
    ]


def encoder_tokenizer(path: str | None, choice: str = "auto"):
    """model.path's own tokenizer, else (no path, or model.tokenizer=bytes) the byte tokenizer
    with BERT's specials (no download)."""
    from paratrain.data.text.tokenizer import bert_byte_tokenizer, load_tokenizer

    if path is None or choice == "bytes":
        return bert_byte_tokenizer()
    tok = load_tokenizer(path)
    for role in ("cls_token", "sep_token", "mask_token"):
        if getattr(tok, role) is None:
            raise DataError(f"model.path: {path}'s tokenizer has no {role} (a BERT-style one has)")
    return tok


class Rows(torch.utils.data.Dataset):
    """(ids, tag) rows: tag is the class (text_classification; the masked LM reads its rows
    through tasks/masked_lm.py's MaskedRows)."""

    def __init__(self, ids: list[list[int]], tags: list[int] | None = None):
        self.ids, self.tags = ids, tags

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int):
        return self.ids[i], (self.tags[i] if self.tags is not None else i)


class Collate:
    """Pads to the batch's longest row (right, attention mask) -> input_ids, attention_mask, tag."""

    def __init__(self, pad_id: int):
        self.pad_id = pad_id

    def __call__(self, batch):
        width = max(len(ids) for ids, _ in batch)
        input_ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, (ids, _) in enumerate(batch):
            input_ids[row, : len(ids)] = torch.tensor(ids)
            mask[row, : len(ids)] = 1
        tags = torch.tensor([tag for _, tag in batch])
        return {"input_ids": input_ids, "attention_mask": mask, "tag": tags}
