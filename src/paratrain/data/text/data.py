"""Instruction data for causal-LM fine-tuning: read records, apply the format's template,
tokenise with the prompt masked (-100), truncate, optionally pack, and batch.

Packing concatenates examples into rows of exactly max_length tokens. Each example's position ids
restart at 0 and no attention mask is passed: transformers then derives a block-diagonal causal
mask from the position-id resets (masking_utils.find_packed_sequence_indices; FlashAttention-2
uses the same resets as variable-length attention), so packed examples do not attend to each
other. Each example starts with BOS, whose label is -100, so no token is trained to follow the
previous example.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.data import Dataset

from paratrain.data.text.formats import FORMATS
from paratrain.data.text.records import place_of, read_file
from paratrain.errors import DataError

IGNORE = -100


def check_path(path: str) -> None:
    """A file on disk, or something shaped like a hub name (org/name); else a one-line error."""
    p = Path(path)
    if not p.is_file() and (p.exists() or path.startswith((".", "/")) or "/" not in path):
        raise DataError(
            f"data.path: no such file {path} (JSON, JSONL, CSV or Parquet), nor a hub name like org/name"
        )


_KINDS = {".jsonl": "jsonl", ".csv": "csv", ".parquet": "parquet"}


def read_records(path: str, split: str = "train") -> list[dict]:
    """JSON (a list of records), JSONL, CSV or Parquet on disk, each record knowing its line or
    row (data/text/records.py); otherwise a datasets hub name."""
    p = Path(path)
    if p.is_file():
        return read_file(p, _KINDS.get(p.suffix, "json"))
    check_path(path)
    try:
        import datasets
    except ImportError:
        raise DataError(
            f"data.path: {path} is not a file, and reading a hub data set needs `pip install datasets`"
        ) from None
    try:
        return list(datasets.load_dataset(path, split=split))
    except Exception as e:  # noqa: BLE001 - offline, unknown name, ...: all one line for the user
        raise DataError(
            f"data.path: cannot load hub data set {path} ({str(e).splitlines()[0][:200]})"
        ) from None


def text_documents(source: str, path: str | None) -> list[str]:
    """Plain text as documents: each .txt file's paragraphs (blank-line separated), or each
    topic of the Python documentation in the standard library (pydoc_data)."""
    if source == "python-docs":
        from pydoc_data.topics import topics

        return [topics[k] for k in sorted(topics)]
    p = Path(path or "")
    files = sorted(p.rglob("*.txt")) if p.is_dir() else [p] if p.is_file() else []
    if not files:
        raise DataError(f"data.path: {path} is no .txt file nor a folder holding any")
    docs = []
    for f in files:
        try:
            text = f.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise DataError(f"data.path: cannot read {f} as UTF-8 ({str(e)[:120]})") from None
        docs += [d.strip() for d in text.split("\n\n") if d.strip()]
    if not docs:
        raise DataError(f"data.path: {path} holds no text")
    return docs


def text_examples(docs: list[str], tokenizer, max_length: int):
    """-> (input_ids, labels) rows of at most max_length tokens, every token trained: each
    document BOS + its tokens + EOS, cut into consecutive pieces (nothing dropped)."""
    encoded = tokenizer(docs, add_special_tokens=False)["input_ids"] if docs else []
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    out = []
    ends = ([bos] if bos is not None else [], [eos] if eos is not None else [])
    for ids in encoded:
        ids = [*ends[0], *ids, *ends[1]]  # some tokenizers (Qwen) have no BOS
        for first in range(0, len(ids), max_length):
            piece = ids[first : first + max_length]
            if len(piece) > 1:  # one token predicts nothing
                out.append((piece, list(piece)))
    return out


def tokenize(
    records: list[dict], fmt: str, tokenizer, *, max_length: int, truncation: bool, where: str
):
    """-> list of (input_ids, labels): BOS + segments + EOS, untrained segments labelled -100."""
    places = [f"{where} {place_of(r, i)}" for i, r in enumerate(records)]
    segmented = [FORMATS[fmt](r, place) for r, place in zip(records, places, strict=True)]
    texts = [text for segs in segmented for text, _ in segs]
    encoded = iter(tokenizer(texts, add_special_tokens=False)["input_ids"]) if texts else iter([])
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    out = []
    for i, segs in enumerate(segmented):
        ids, labels = [bos], [IGNORE]
        for _, trained in segs:
            piece = next(encoded)
            ids += piece
            labels += piece if trained else [IGNORE] * len(piece)
        ids.append(eos)
        labels.append(eos)
        if len(ids) > max_length:
            if not truncation:
                raise DataError(
                    f"{places[i]}: {len(ids)} tokens exceed data.max_length={max_length}; "
                    "raise data.max_length or set data.truncation=true"
                )
            ids, labels = ids[:max_length], labels[:max_length]
        out.append((ids, labels))
    return out


def synthetic_examples(n: int, length: int, vocab: int, seed: int):
    """Random token rows of exactly `length`, every token trained: throughput runs without data."""
    g = torch.Generator().manual_seed(seed)
    rows = torch.randint(0, vocab, (n, length), generator=g).tolist()
    return [(r, list(r)) for r in rows]


def pack(examples, max_length: int, pad_id: int):
    """Greedy packing into rows of max_length: -> list of (ids, labels, position_ids, n_real)."""
    rows, ids, labels, pos = [], [], [], []

    def close():
        n_real = len(ids)
        pad = max_length - n_real
        # Padding is its own "document" (positions restart) so real tokens never attend to it.
        rows.append((ids + [pad_id] * pad, labels + [IGNORE] * pad, pos + list(range(pad)), n_real))

    for ex_ids, ex_labels in examples:
        if ids and len(ids) + len(ex_ids) > max_length:
            close()
            ids, labels, pos = [], [], []
        ids, labels, pos = ids + ex_ids, labels + ex_labels, pos + list(range(len(ex_ids)))
    if ids:
        close()
    return rows


class TokenRows(Dataset):
    def __init__(self, rows):
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int):
        return self.rows[i]


@dataclass
class Collate:
    """Pads unpacked examples to the longest in the batch (right, attention mask), rounded up to
    a multiple of `multiple`; packed rows are already max_length and carry position ids instead
    of a mask. A batch without padding carries no mask: the host knows so here, where the model
    would have to read the mask back from the GPU to find out."""

    pad_id: int
    packed: bool
    # float8 matmuls (torch._scaled_mm) need every dimension a multiple of 16, and the backward's
    # weight gradient contracts over the batch's tokens: model.fp8 pads the width to 16.
    multiple: int = 1
    # A pipeline's stages exchange activations of one fixed shape: every batch this wide.
    width: int | None = None

    def __call__(self, batch):
        if self.packed:
            ids, labels, pos, n_real = zip(*batch, strict=True)
            return {
                "input_ids": torch.tensor(ids),
                "labels": torch.tensor(labels),
                "position_ids": torch.tensor(pos),
                "num_tokens": torch.tensor(sum(n_real)),
            }
        width = max(len(ids) for ids, _ in batch)
        width = self.width or -(-width // self.multiple) * self.multiple
        input_ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
        labels = torch.full((len(batch), width), IGNORE, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, (ids, lab) in enumerate(batch):
            input_ids[row, : len(ids)] = torch.tensor(ids)
            labels[row, : len(lab)] = torch.tensor(lab)
            mask[row, : len(ids)] = 1
        batch = {"input_ids": input_ids, "labels": labels, "num_tokens": mask.sum()}
        if not mask.all():  # rows without padding need no mask (models/causal_lm/attention.py)
            batch["attention_mask"] = mask
        return batch
