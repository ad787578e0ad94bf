"""Run: what trainer/setup.py builds before the first step, and what the trainer's components
read: the plan, the mesh, the task's workload, the model as trained (stage, parallelized,
compiled, wrapped), its optimizer(s), scaler and the loop's counters."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from paratrain.checkpoint import LoopState
from paratrain.distributed import process_group as pg
from paratrain.distributed.parallel_dims import ParallelDims
from paratrain.parallel.ddp import average_buffers
from paratrain.protocols import Workload


@dataclass
class Run:
    plan: Any
    """runplan.RunPlan: what was decided before any process started."""
    cfg: Any
    env: pg.DistEnv
    dims: ParallelDims
    work: Workload
    model: nn.Module
    """What the loop trains: this rank's stage, parallelized, compiled and wrapped."""
    eval_model: nn.Module
    """The same without DDP's wrapper (whose forward is a collective)."""
    pipe: Any
    """parallel.pipeline.Pipeline when the model is cut into stages, else None."""
    optimizer: Any
    """The optimizer; a list of them, one per part, for a task of several models."""
    scaler: Any
    policy: Any
    state: LoopState
    out_dir: Path
    ckpt_dir: Path
    loader_batch: int
    k: int
    """Micro-batches per optimizer step (train.grad_accum_steps)."""
    steps_per_epoch: int
    total_steps: int
    wrapper: str | None
    split: dict | None
    step_context: Callable[[], contextlib.AbstractContextManager]
    params: list
    """The trainable parameters (the optimizer's)."""
    dtensor_params: list
    """Trainable DTensor weights under tensor parallelism (their gradients are summed over the
    tp ranks before each optimizer step), else empty."""
    parts: dict[str, nn.Module] = field(default_factory=dict)
    """Workload.parts as trained: each wrapped (DDP / FSDP / compiled) on its own; empty for a
    task of one model."""
    sync: Any = None
    """How the data-parallel replicas agree (parallel/sync.py): every step, local SGD, DiLoCo,
    stale-1; it also counts the bytes this rank hands to the gradient collectives."""
    grad_norm: Any = None
    """The last step's gradient norm (a device tensor) where this rank holds whole gradients
    (one process, DDP), for the step log; None elsewhere."""
    built: dict = field(default_factory=dict)
    """Counts known once the model and data exist (parameters, rows): the plan's last lines."""

    @property
    def redundant(self) -> bool:
        """ddp-full: every data-parallel rank reads every sample."""
        return self.plan.redundant

    @property
    def partition(self) -> int:
        """How many ways an epoch's samples are divided: the data-parallel ranks, unless each
        reads them all."""
        return 1 if self.plan.layout.sampler == "full" else self.dims.dp_size

    @property
    def unique_per_step(self) -> int:
        return self.loader_batch * self.k * self.partition

    @property
    def processed_per_step(self) -> int:
        return self.loader_batch * self.k * self.dims.dp_size

    @property
    def layout(self) -> dict[str, Any]:
        return {"degrees": self.dims.describe(), "label": self.dims.label()}

    def sync_buffers(self) -> None:
        """ddp.broadcast_buffers=false: each rank's BatchNorm statistics drift apart during
        training; they are averaged over the data-parallel ranks whenever the model is
        evaluated or saved."""
        if isinstance(self.model, DistributedDataParallel) and not self.cfg.ddp.broadcast_buffers:
            average_buffers(self.model, self.model.process_group)
