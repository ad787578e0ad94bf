"""Parallelism, applied from outside the model (apply.py), and the strategy names of earlier
releases as shorthands for degree settings.

A run's parallelism is four degrees (parallel.dp_replicate, dp_shard, tp, pp; see
distributed/parallel_dims.py) plus a sampler mode (data.sampler). `strategy` names a common
setting of them: ddp-ds is dp_replicate over every rank with torch's DistributedSampler, fsdp is
dp_shard over every rank, pipeline is pp over every rank, and so on. A shorthand fills in only
what the user left at its default, so `strategy=fsdp parallel.tp=2` on 8 ranks is FSDP over 4
and tensor parallel over 2.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Strategy = Literal[
    "single", "dp", "ddp-full", "ddp-rr", "ddp-ds", "fsdp", "tp", "pipeline", "split", "auto"
]
SamplerMode = Literal["distributed", "round-robin", "full"]


@dataclass(frozen=True)
class Shorthand:
    doc: str
    axis: str | None = None
    """The degree that takes the ranks the others leave (-1); None: none (one process, or for
    auto whatever the degrees say)."""
    sampler: SamplerMode = "distributed"
    wrapper: Literal["ddp", "fsdp", "data-parallel", None] = None
    """The data-parallel wrapper this name means, even on one rank (ddp-* runs DDP, fsdp runs
    fully_shard); None lets the degrees decide (parallel/apply.py data_parallel_wrapper)."""


STRATEGIES: dict[str, Shorthand] = {
    "auto": Shorthand(
        "the degrees decide; with none set, one process (or ddp-ds for launch.nproc > 1)"
    ),
    "single": Shorthand("one device, one process"),
    "dp": Shorthand(
        "torch.nn.DataParallel: one process scatters each batch over all visible GPUs",
        wrapper="data-parallel",
    ),
    "ddp-full": Shorthand(
        "DDP, every rank iterates the WHOLE data set (seed's 'DDP'): redundant work",
        axis="dp_replicate",
        sampler="full",
        wrapper="ddp",
    ),
    "ddp-rr": Shorthand(
        "DDP, rank r takes samples r, r+W, r+2W, ... of the whole data set (seed's DDP-RR)",
        axis="dp_replicate",
        sampler="round-robin",
        wrapper="ddp",
    ),
    "ddp-ds": Shorthand(
        "DDP with torch's DistributedSampler, set_epoch every epoch (seed's DDP-DS)",
        axis="dp_replicate",
        wrapper="ddp",
    ),
    "fsdp": Shorthand(
        "FSDP2: fully_shard per block; weights, gradients and optimizer state sharded over ranks",
        axis="dp_shard",
        wrapper="fsdp",
    ),
    "tp": Shorthand(
        "tensor parallel: each decoder layer's projections split over the ranks (language models)",
        axis="tp",
    ),
    "pipeline": Shorthand(
        "pipeline parallelism: the model cut into one stage per rank, micro-batches on a GPipe "
        "or 1F1B schedule",
        axis="pp",
    ),
    "split": Shorthand(
        "the seeds' model parallelism: consecutive blocks of one model on different GPUs of one "
        "process, one batch at a time (each GPU idle while the others compute)"
    ),
}

ONE_PROCESS = ("single", "dp", "split")
