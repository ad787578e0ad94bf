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
from typing import Literal

import torch
from torch import nn

from paratrain.parallel.ac import apply_activation_checkpointing
from paratrain.parallel.ddp import apply_ddp, apply_dp
from paratrain.parallel.fsdp import apply_fsdp
from paratrain.parallel.tp import apply_tp

Wrapper = Literal["ddp", "fsdp", "data-parallel", None]


def parallelize(
    model: nn.Module,
    spec,
    dims,
    *,
    wrapper: Wrapper,
    device: torch.device,
    policy,
    train,
    ddp,
    parallel,
    lora: bool,
    compile_units: list[nn.Module] | None,
    stage_modules: list[nn.Module] | None = None,
    link=None,
    sync_batchnorm: bool = False,
) -> tuple[nn.Module, nn.Module]:
    """-> (the model the loop trains, the module it evaluates: the same without DDP's wrapper,
    whose forward is a collective). stage_modules: an interleaved pipeline's stages on this
    rank, which share `model`'s layers; FSDP wraps each of them (their forwards are what run)
    rather than `model`."""
    if sync_batchnorm and wrapper == "ddp":  # 0: statistics over every rank's batch
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)  # in place below the root
    if dims.tp_enabled:  # 1
        plan = spec.tp_plan(
            model,
            sequence_parallel=parallel.sequence_parallel,
            loss_parallel=uses_loss_parallel(dims, parallel),
            local_inputs=lora,  # peft's adapter layers take plain tensors
        )
        apply_tp(model, plan, dims.submesh("tp"))
    if train.activation_checkpointing:  # 2
        apply_activation_checkpointing(spec.blocks(model))
    inner = model
    if train.compile and compile_units:  # 3
        # Regional compilation (as torchtitan does): each decoder layer compiled in place; the
        # layers share one graph, so compile time does not grow with depth, and peft's wrappers
        # and the loss run eagerly around them. FSDP then shards the compiled layers.
        for unit in compile_units:
            # A unit whose forward runs again inside backward (the chunked loss, under
            # activation checkpointing) is compiled without CUDA graphs: replaying a graph then
            # starts a new generation of cudagraph trees, which overwrites the decoder layers'
            # graph outputs that backward still needs ("accessing tensor output of CUDAGraphs
            # that has been overwritten"; reduce-overhead with the chunked loss, H200, torch 2.11)
            graphs = not getattr(unit, "recomputed_in_backward", False)
            unit.compile(**train.compile_kwargs(cuda_graphs=graphs))
    elif train.compile:
        inner = torch.compile(model, **train.compile_kwargs())
    if wrapper == "fsdp":  # 4
        axes = ("dp_replicate", "dp_shard") if dims.dp_replicate > 1 else ("dp_shard",)
        mesh = dims.submesh(*axes)
        if stage_modules and len(stage_modules) > 1:
            for stage in stage_modules:
                held = {id(m) for m in stage.modules()}
                blocks = [b for b in spec.blocks(model) if id(b) in held]
                apply_fsdp(stage, blocks, mesh, policy, parallel.cpu_offload)
            return inner, inner
        return apply_fsdp(inner, spec.blocks(model), mesh, policy, parallel.cpu_offload), inner
    if wrapper == "ddp":  # only where the data-parallel ranks are all the ranks: the default group
        return apply_ddp(inner, device, ddp, link=link, fp32_sum=train.bf16_weights), inner
    if wrapper == "data-parallel":
        wrapped = apply_dp(inner, device)
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
