"""What is trained: a task owns its data, its loss, its evaluation, its metrics and its checks.

The run names its task (`task:`; auto picks by data.source and is resolved once, in the config).
Each task is a module with three functions the rest of paratrain calls:

    check(cfg)                    config-time checks across owners (ValueError naming the field)
    preflight(cfg, cuda, dims)    checks that need this machine or its files (UserError), once,
                                  before any process starts
    build(cfg, env, dims, policy, loader_batch, collective_forward) -> Workload   every rank

The loop (trainer/) is the same for every task; the differences live in tasks/<name>.py.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import nn

from paratrain.data.samplers import EpochSampler

TASKS = {
    "image_classification": "paratrain.tasks.image_classification",
    "causal_lm": "paratrain.tasks.causal_lm",
    "masked_lm": "paratrain.tasks.masked_lm",
    "text_classification": "paratrain.tasks.text_classification",
    "gan": "paratrain.tasks.gan",
    "custom": "paratrain.tasks.custom",
}


def task_module(name: str) -> ModuleType:
    return importlib.import_module(TASKS[name])


# Tasks whose throughput is counted in tokens (Workload.loss returns the batch's trained
# tokens) and whose MFU comes from Workload.flops_per_token.
TOKEN_TASKS = ("causal_lm", "masked_lm")


def counts_tokens(task: str) -> bool:
    return task in TOKEN_TASKS


def task_sources() -> dict[str, tuple[str, ...]]:
    """The data sources each task reads (task custom reads none: its objects come from
    Python). `auto` takes the first task here that reads data.source."""
    from paratrain.data.loader import IMAGE_SOURCES, LABELLED_TEXT, PLAIN_TEXT, TEXT_SOURCES

    return {
        "image_classification": IMAGE_SOURCES,
        "causal_lm": TEXT_SOURCES,
        "text_classification": LABELLED_TEXT,
        "masked_lm": (*PLAIN_TEXT, "synthetic-text"),
        "gan": IMAGE_SOURCES,
    }


def resolve_task(task: str, data_source: str) -> str:
    """`auto` -> the task that reads data.source; an explicit task must read it."""
    if task == "custom":  # the objects given to paratrain.train: no data source is read
        return task
    reads = task_sources()
    if task == "auto":
        return next(t for t, sources in reads.items() if data_source in sources)
    if data_source not in reads[task]:
        readers = [t for t, sources in reads.items() if data_source in sources]
        raise ValueError(
            f"data.source: task {task} does not read {data_source} (it reads "
            f"{', '.join(reads[task])}); {data_source} is read by {', '.join(readers)}"
        )
    return task


@dataclass
class Workload:
    model: nn.Module
    """The model with dtype, LoRA and the like applied; not yet parallelized or compiled."""
    spec: Any
    """The model family's ModelSpec (models/spec.py): blocks, TP plan, pipeline cut, FLOPs."""
    train: Iterable
    """Yields batches already on the device; len() is micro-batches per epoch."""
    val: Iterable | None
    sampler: EpochSampler
    loss: Callable[[nn.Module, Any], tuple[torch.Tensor, torch.Tensor | None]]
    """(model, batch) -> (mean loss, tokens in the batch or None for images)."""
    evaluate: Callable[[nn.Module, Iterable], dict[str, float]]
    """Held-out metrics, already summed over ranks."""
    pipeline: Any = None
    """parallel.pipeline.PipelineHooks: how a pipeline's stages split a batch and score it."""
    info: dict[str, Any] = field(default_factory=dict)
    """Facts for result.json (real data or not, classes, tokens, random init, ...)."""
    flops_per_token: float | None = None
    """For MFU (language models), counted on the whole model before any cut or shard."""
    finish: Callable[[nn.Module, Path], dict[str, str]] | None = None
    """Rank-collective; saves artifacts (a LoRA adapter) and returns their paths."""
    parts: dict[str, nn.Module] | None = None
    """A task of several models trained apart (a GAN's generator and discriminator): the
    model's children by name. Each is parallelized on its own (its own DDP / FSDP wrapper) and
    gets its own optimizer (run.optimizer is then their list, in this order); `model` is their
    container, what checkpoints and evaluations see."""
    step: Callable[[Any, Any], tuple[torch.Tensor, torch.Tensor | None, bool]] | None = None
    """A task's own optimizer step, (run, batch) -> (loss, tokens or None, applied): for tasks
    whose step is not one forward, one loss, one backward and one optimizer step (a GAN's two
    alternating updates). It reads the wrapped parts from run.parts."""
    out_dir: Path | None = None
    """The run's folder (set by the trainer after build): where a task writes its own
    artifacts during training (a GAN's sample grids)."""
    compile_units: list[nn.Module] | None = None
    """Repeated units (decoder layers, the chunked loss): torch.compile compiles each in place
    instead of the whole model, so one graph serves every layer and the wrapper code (peft, the
    loss) stays eager."""
