"""Strategies, applied from outside the model: name -> (apply function, sampler, traits).

Order of application (train.py): precision dtype and channels_last, activation checkpointing,
torch.compile, then the strategy's wrapper last, so DDP sees the final module and registers its
gradient hooks on the parameters that really train.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

from paratrain.parallel.data_parallel import apply_ddp, apply_dp, apply_single
from paratrain.parallel.fsdp import apply_fsdp

Strategy = Literal["single", "dp", "ddp-full", "ddp-rr", "ddp-ds", "fsdp", "pipeline"]
SamplerMode = Literal["full", "round-robin", "distributed"]


@dataclass(frozen=True)
class StrategySpec:
    apply: Callable[..., torch.nn.Module]
    """(model, device, precision policy, run config) -> the wrapped or sharded model."""
    sampler: SamplerMode
    multiprocess: bool
    """Runs one process per device (launched through torchrun)."""
    redundant: bool = False
    """Every rank sees the whole data set: only 1/world of the samples processed are unique."""
    pipelined: bool = False
    """The ranks are stages of one model: every rank reads the same batches, each sample is
    processed once (by all stages together)."""
    doc: str = ""


STRATEGIES: dict[str, StrategySpec] = {
    "single": StrategySpec(apply_single, "full", False, doc="one device, one process"),
    "dp": StrategySpec(
        apply_dp,
        "full",
        False,
        doc="torch.nn.DataParallel: one process scatters each batch over all visible GPUs",
    ),
    "ddp-full": StrategySpec(
        apply_ddp,
        "full",
        True,
        redundant=True,
        doc="DDP, every rank iterates the WHOLE data set (seed's 'DDP'): redundant work",
    ),
    "ddp-rr": StrategySpec(
        apply_ddp,
        "round-robin",
        True,
        doc="DDP, rank r takes samples r, r+W, r+2W, ... of the whole data set (seed's DDP-RR)",
    ),
    "ddp-ds": StrategySpec(
        apply_ddp,
        "distributed",
        True,
        doc="DDP with torch's DistributedSampler, set_epoch every epoch (seed's DDP-DS)",
    ),
    "fsdp": StrategySpec(
        apply_fsdp,
        "distributed",
        True,
        doc="FSDP2: fully_shard per block; weights, gradients and optimizer state sharded over ranks",
    ),
    "pipeline": StrategySpec(
        apply_single,  # the cut into stages and the schedule: parallel/pipeline.py, in train.py
        "full",
        True,
        pipelined=True,
        doc="pipeline parallelism: the model cut into one stage per rank, micro-batches on a "
        "GPipe or 1F1B schedule",
    ),
}
