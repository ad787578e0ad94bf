"""data.*: where the samples come from and how the ranks read them (DataConfig); the source
names each task reads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

TEXT_FORMATS = ("alpaca", "grammar", "samsum", "slimorca")

# plain text, every token trained: a .txt file / folder of them, or the Python documentation that
# ships with the standard library (pydoc_data: 79 topics, 465 KB of real English)
PLAIN_TEXT = ("text", "python-docs")

TEXT_SOURCES = (*TEXT_FORMATS, *PLAIN_TEXT, "synthetic-text")

# text with a class per row (sequence classification, tasks/text_classification.py): docstrings
# of the standard library labelled by package (data/text/encoder.py), or the user's CSV / JSONL file
LABELLED_TEXT = ("python-docstrings", "text-labels")

IMAGE_SOURCES = ("mnist", "mnist-sample", "imagefolder", "synthetic")
# sources whose data are files at data.path
READS_FILES = ("mnist", "imagefolder", "text", "text-labels", *TEXT_FORMATS)


@dataclass(kw_only=True)
class DataConfig:
    source: Literal[
        "mnist",
        "mnist-sample",
        "imagefolder",
        "synthetic",
        "alpaca",
        "grammar",
        "samsum",
        "slimorca",
        "text",
        "python-docs",
        "synthetic-text",
        "python-docstrings",
        "text-labels",
    ] = "mnist-sample"
    """Images: mnist (IDX files), mnist-sample (5,000 real digits in a wheel), imagefolder, synthetic.
    Text (train or fine-tune a language model): alpaca, grammar, samsum, slimorca (instruction
    records); text (plain UTF-8: a .txt file or a folder of them, every token trained);
    python-docs (the Python reference documentation shipped with the standard library: real
    text without a download); synthetic-text. Labelled text (text_classification):
    python-docstrings (about 1,700 docstrings of eight standard-library packages, labelled by
    package: no download); text-labels (a CSV or JSONL file at path with text and label
    columns)."""
    path: str | None = None
    """MNIST IDX folder, ImageFolder root, or a text data set: JSON / JSONL / CSV / Parquet file or hub name."""
    val_path: str | None = None
    """ImageFolder root of held-out images; without it val_fraction of path is held out."""
    val_fraction: float = 0.1
    """Share of an ImageFolder held out when there is no val_path."""
    bad_images: Literal["error", "skip"] = "error"
    """ImageFolder files that PIL cannot read (each file's header checked before training):
    error refuses the run naming them; skip trains without them, their count said once."""
    image_size: int | None = None
    """Side of the square images the model sees (the seed upscales MNIST to 500); null keeps the native size."""
    resize_on: Literal["cpu", "gpu"] = "cpu"
    """cpu: resize in the loader workers (the seed's way); gpu: copy uint8 and resize on the GPU."""
    channels: int | None = None
    """Image channels; default 1 for MNIST and synthetic, 3 for ImageFolder."""
    batch_size: int = 64
    """Samples per device per micro-step (dp: per GPU, the loader batch is this times the GPUs)."""
    shuffle: bool = True
    """Reshuffle the training set every epoch (seeded, identical on every rank)."""
    num_workers: int = 4
    """Loader processes per rank; 0 loads in the training process."""
    pin_memory: bool = True
    """Page-locked host buffers so host-to-device copies can run asynchronously (CUDA only)."""
    persistent_workers: bool = False
    """Keep loader workers alive between epochs instead of restarting them."""
    prefetch_factor: int | None = None
    """Batches each worker loads ahead (torch's default, 2, when null)."""
    non_blocking: bool = True
    """Asynchronous host-to-device copies (effective from pinned memory)."""
    prefetch_to_device: bool = False
    """Copy the next batch on a side CUDA stream while the current one computes."""
    limit_samples: int | None = None
    """Use only the first N training samples (quick runs and tests)."""
    synthetic_samples: int = 8192
    """Images in the synthetic set (a tenth is held out)."""
    synthetic_size: int = 28
    """Native side of synthetic images (resized to image_size like real ones)."""
    num_classes: int = 10
    """Classes of the synthetic set (other sources know their own)."""
    max_length: int = 2048
    """Text: longest sequence in tokens (with packing, the length of every row)."""
    truncation: bool = True
    """Text: cut longer examples to max_length; false makes them an error."""
    packing: bool = False
    """Text: pack examples into max_length rows (position ids restart; no cross-example attention)."""
    split: str = "train"
    """Text: split of a hub data set."""
    sampler: Literal["auto", "distributed", "round-robin", "full"] = "auto"
    """How the data-parallel ranks share the training set: distributed (torch's
    DistributedSampler, the seed's DDP-DS), round-robin (DDP-RR), full (every rank reads
    everything, the seed's 'DDP': redundant work). auto: what the strategy names, else
    distributed."""

    def __post_init__(self) -> None:
        self._check_loader()
        self._check_sizes()
        self._check_source()

    def _check_loader(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"batch_size: must be >= 1, got {self.batch_size}")
        if self.num_workers < 0:
            raise ValueError(f"num_workers: must be >= 0, got {self.num_workers}")
        if self.prefetch_factor is not None and (self.prefetch_factor < 1 or self.num_workers == 0):
            raise ValueError(
                f"prefetch_factor: needs num_workers > 0 and a value >= 1, got {self.prefetch_factor}"
                f" with num_workers={self.num_workers}"
            )
        if self.persistent_workers and self.num_workers == 0:
            raise ValueError("persistent_workers: needs num_workers > 0")

    def _check_sizes(self) -> None:
        if self.image_size is not None and not 8 <= self.image_size <= 4096:
            raise ValueError(f"image_size: must be in [8, 4096] or null, got {self.image_size}")
        if self.channels is not None and self.channels not in (1, 3):
            raise ValueError(f"channels: must be 1 or 3, got {self.channels}")
        if not 0 <= self.val_fraction < 1:
            raise ValueError(f"val_fraction: must be in [0, 1), got {self.val_fraction}")
        if self.limit_samples is not None and self.limit_samples < 1:
            raise ValueError(f"limit_samples: must be >= 1 or null, got {self.limit_samples}")
        if self.max_length < 8:
            raise ValueError(f"max_length: must be >= 8, got {self.max_length}")
        if self.synthetic_samples < 2 or self.num_classes < 2 or self.synthetic_size < 1:
            raise ValueError(
                "synthetic_samples: the synthetic set needs >= 2 samples and >= 2 classes"
            )

    def _check_source(self) -> None:
        if self.source in READS_FILES and not self.path:
            raise ValueError(
                f"path: source {self.source} reads files; set data.path to their folder"
            )
        if self.source == "imagefolder" and self.resize_on == "gpu":
            raise ValueError(
                "resize_on: imagefolder images differ in size; they are resized on the cpu"
            )
        if self.source == "imagefolder" and self.image_size is None:
            raise ValueError(
                "image_size: imagefolder needs a size to batch its images (for example 224)"
            )
        if self.source in ("mnist", "mnist-sample") and self.channels == 3:
            raise ValueError("channels: MNIST is grayscale (1 channel)")


# Keys that mean something to one kind of data only (result.json leaves the other's out).
IMAGE_ONLY = ("val_path", "image_size", "resize_on", "channels", "synthetic_samples", "bad_images")
IMAGE_ONLY += ("synthetic_size", "num_classes")

TEXT_ONLY = ("max_length", "truncation", "packing", "split")
