"""What trainer/setup.py builds before the first step, in two parts, and the loop's state beside
them (checkpoint.LoopState, owned by the Trainer):

    Built      built once: the plan, the mesh, the task's workload, the model as trained
               (stage, parallelized, compiled, wrapped), its optimizer(s), scaler, policy
    Schedule   the lengths decided once: loader batch, micro-batches per step, steps per
               epoch, steps of the run
    Held       of Built, what a checkpoint saves and loads

The trainer's components take only the fields they read (trainer.py wires them); none takes
these whole, except the step (trainer/step.py), which is the model's use itself."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from paratrain.distributed import process_group as pg
from paratrain.distributed.parallel_dims import ParallelDims
from paratrain.parallel.ddp import average_buffers
from paratrain.protocols import Workload


@dataclass(frozen=True)
class Schedule:
    """The run's lengths, decided once (setup.lengths) from the config and the data."""

    loader_batch: int
    """Samples one loader batch holds on this rank (dp: one batch scattered over its GPUs)."""
    k: int
    """Micro-batches per optimizer step (train.grad_accum_steps)."""
    steps_per_epoch: int
    total_steps: int
    partition: int
    """How many ways an epoch's samples are divided: the data-parallel ranks, unless each
    reads them all (ddp-full)."""
    dp_size: int

    @property
    def unique_per_step(self) -> int:
        return self.loader_batch * self.k * self.partition

    @property
    def processed_per_step(self) -> int:
        return self.loader_batch * self.k * self.dp_size

    def skip(self, step_in_epoch: int) -> int:
        """The samples of this rank's share of the epoch that `step_in_epoch` steps took."""
        return step_in_epoch * self.k * self.loader_batch


@dataclass(frozen=True)
class Held:
    """What a checkpoint saves and loads: the model as trained, its optimizer(s), the loss
    scaler, and how the replicas agree (sync.mode keeps each rank's own replica)."""

    model: nn.Module
    optimizer: Any
    scaler: Any
    sync: Any


@dataclass(frozen=True)
class Built:
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
    out_dir: Path
    ckpt_dir: Path
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
    counts: dict = field(default_factory=dict)
    """Counts known once the model and data exist (parameters, rows): the plan's last lines."""

    @property
    def redundant(self) -> bool:
        """ddp-full: every data-parallel rank reads every sample."""
        return self.plan.redundant

    @property
    def held(self) -> Held:
        return Held(self.model, self.optimizer, self.scaler, self.sync)

    def sync_buffers(self) -> None:
        """ddp.broadcast_buffers=false: each rank's BatchNorm statistics drift apart during
        training; they are averaged over the data-parallel ranks whenever the model is
        evaluated or saved."""
        if isinstance(self.model, DistributedDataParallel) and not self.cfg.ddp.broadcast_buffers:
            average_buffers(self.model, self.model.process_group)
