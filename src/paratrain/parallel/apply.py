"""Parallelism applied from outside the model, in one fixed order (torchtitan's
parallelize_llama). Nothing here names a model class: the model's spec (models/spec.py) says
what its blocks are and how its layers split.

    0. pipeline cut (parallel/pipeline.py, before this): the rank keeps its stage's units
    1. tensor parallel: weights become DTensors on the tp axis before anything wraps them
    2. activation checkpointing around each block (recomputation repeats TP's collectives)
    3. torch.compile: each repeated block in place (regional), or the whole model
    4. data parallel last, so it sees the final module: FSDP2 (dp_shard, HSDP on
       dp_replicate x dp_shard, and beside tp or pp), DDP (dp_replicate alone), or
       nn.DataParallel (strategy=dp)
    (5. pipeline schedule over the wrapped stage, parallel/pipeline.py)
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from paratrain.parallel.ac import apply_activation_checkpointing
from paratrain.parallel.compile import apply_compile
from paratrain.parallel.ddp import apply_ddp, apply_dp
from paratrain.parallel.fsdp import apply_fsdp
from paratrain.parallel.tp import apply_tp

Wrapper = Literal["ddp", "fsdp", "data-parallel", None]


@dataclass(frozen=True)
class TensorParallel:
    """Step 1's options: the tp axis of `Decisions.dims` splits each block's projections."""

    sequence_parallel: bool
    loss_parallel: bool
    """Vocabulary-sharded logits and loss (uses_loss_parallel)."""
    local_inputs: bool
    """The layers take plain tensors, not DTensors (peft's adapter layers under LoRA)."""


@dataclass(frozen=True)
class Compile:
    """Step 3's options: `units` compiled each in place (regional), or with none the whole
    model; `kwargs(cuda_graphs=...)` torch.compile's keywords (TrainConfig.compile_kwargs)."""

    units: Sequence[nn.Module] | None
    kwargs: Callable[..., dict]


@dataclass(frozen=True)
class Sharding:
    """Step 4 under FSDP2: the mixed-precision policy and whether the shards live on the CPU."""

    policy: Any
    cpu_offload: bool = False


@dataclass(frozen=True)
class Replication:
    """Step 4 under DDP: its config (buckets, static graph ...), the simulated slow link and
    whether bf16 gradients are summed in fp32 (train.bf16_weights)."""

    config: Any
    link: Any = None
    fp32_sum: bool = False


@dataclass(frozen=True)
class Decisions:
    """Everything parallelize applies, decided before it runs (trainer/setup.py makes it from
    the run's plan): the model family's spec, the mesh, and one entry per step, None where the
    step does nothing. A new axis is a field here and a step below."""

    spec: Any
    """The model family's ModelSpec (protocols.py): its blocks and TP plan."""
    dims: Any
    """ParallelDims: the DeviceMesh and its degrees."""
    device: torch.device
    wrapper: Wrapper = None
    sync_batchnorm: bool = False
    tp: TensorParallel | None = None
    checkpoint: bool = False
    """Activation checkpointing around each of spec.blocks."""
    compile: Compile | None = None
    sharding: Sharding | None = None
    replication: Replication | None = None


def parallelize(
    model: nn.Module, decided: Decisions, stages: list[nn.Module] | None = None
) -> tuple[nn.Module, nn.Module]:
    """-> (the model the loop trains, the module it evaluates: the same without DDP's wrapper,
    whose forward is a collective). The steps in the fixed order above. stages: an
    interleaved pipeline's stages on this rank, which share `model`'s layers; FSDP wraps each
    of them (their forwards are what run) rather than `model`."""
    if decided.sync_batchnorm and decided.wrapper == "ddp":  # 0: statistics over every rank
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)  # in place below the root
    if decided.tp is not None:  # 1
        tp = decided.tp
        plan = decided.spec.tp_plan(
            model,
            sequence_parallel=tp.sequence_parallel,
            loss_parallel=tp.loss_parallel,
            local_inputs=tp.local_inputs,
        )
        apply_tp(model, plan, decided.dims.submesh("tp"))
    if decided.checkpoint:  # 2
        apply_activation_checkpointing(decided.spec.blocks(model))
    inner = model
    if decided.compile is not None:  # 3
        inner = apply_compile(model, decided.compile.units, decided.compile.kwargs)
    return wrap(model, inner, decided, stages)  # 4


def wrap(
    model: nn.Module, inner: nn.Module, decided: Decisions, stages: list[nn.Module] | None
) -> tuple[nn.Module, nn.Module]:
    """Step 4: data parallel last, so it sees the final module."""
    if decided.wrapper == "fsdp":
        dims, sharding = decided.dims, decided.sharding
        axes = ("dp_replicate", "dp_shard") if dims.dp_replicate > 1 else ("dp_shard",)
        mesh = dims.submesh(*axes)
        blocks = decided.spec.blocks(model)
        if stages and len(stages) > 1:
            for stage in stages:
                held = {id(m) for m in stage.modules()}
                mine = [b for b in blocks if id(b) in held]
                apply_fsdp(stage, mine, mesh, sharding.policy, sharding.cpu_offload)
            return inner, inner
        return apply_fsdp(inner, blocks, mesh, sharding.policy, sharding.cpu_offload), inner
    if decided.wrapper == "ddp":  # only where the data-parallel ranks are all the ranks
        rep = decided.replication
        return apply_ddp(
            inner, decided.device, rep.config, link=rep.link, fp32_sum=rep.fp32_sum
        ), inner
    if decided.wrapper == "data-parallel":
        wrapped = apply_dp(inner, decided.device)
        return wrapped, wrapped
    return inner, inner


def uses_loss_parallel(dims, parallel) -> bool:
    """Vocabulary-sharded logits and loss (a DTensor the pipeline's stage outputs cannot be)."""
    return dims.tp_enabled and parallel.loss_parallel and dims.pp == 1


def step_context(dims, parallel) -> contextlib.AbstractContextManager:
    """What forward and backward of a step run inside: torch's loss_parallel under TP."""
    if uses_loss_parallel(dims, parallel):
        from torch.distributed.tensor.parallel import loss_parallel

        return loss_parallel()
    return contextlib.nullcontext()


@contextlib.contextmanager
def gradient_sync(model: nn.Module, enabled: bool):
    """Skip the gradient all-reduce (DDP's no_sync) or reduce-scatter (FSDP2) on micro-batches
    that are not the last of a gradient-accumulation step."""
    if enabled:
        yield
    elif hasattr(model, "no_sync"):
        with model.no_sync():
            yield
    elif hasattr(model, "set_requires_gradient_sync"):
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
    else:
        yield
