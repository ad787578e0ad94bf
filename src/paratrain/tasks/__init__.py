"""What is trained: a workload bundles the model, its data and how a batch becomes a loss.

train.py's loop is the same for every workload; the differences live here, one file each:
image classification (tasks/image.py) and causal-LM fine-tuning (tasks/lm.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from paratrain.data.samplers import EpochSampler


@dataclass
class Workload:
    model: nn.Module
    """The model with dtype, LoRA and the like applied; not yet compiled or wrapped."""
    train: Iterable
    """Yields batches already on the device; len() is micro-batches per epoch."""
    val: Iterable | None
    sampler: EpochSampler
    loss: Callable[[nn.Module, Any], tuple[torch.Tensor, torch.Tensor | None]]
    """(model, batch) -> (mean loss, tokens in the batch or None for images)."""
    evaluate: Callable[[nn.Module, Iterable], dict[str, float]]
    """Held-out metrics, already summed over ranks."""
    info: dict[str, Any] = field(default_factory=dict)
    """Facts for result.json (real data or not, classes, tokens, random init, ...)."""
    flops_per_token: float | None = None
    """For MFU (language models)."""
    finish: Callable[[nn.Module, Path], dict[str, str]] | None = None
    """Rank-collective; saves artifacts (a LoRA adapter) and returns their paths."""
    blocks: list[nn.Module] | None = None
    """Repeated blocks (decoder layers): torch.compile compiles each in place instead of the whole
    model, so one graph serves every layer and the wrapper code (peft, the loss) stays eager."""


def task_of(data_source: str) -> str:
    from paratrain.data.loader import TEXT_SOURCES

    return "lm" if data_source in TEXT_SOURCES else "image"
