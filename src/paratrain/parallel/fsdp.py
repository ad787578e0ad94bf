"""FSDP2: torch.distributed.fsdp.fully_shard per block (the model spec's blocks), then the root.

Each block's parameters are all-gathered just before its forward and backward and freed after,
and gradients are reduce-scattered: per-GPU memory for weights, gradients and optimizer state
falls to about 1/dp_shard of the model. On a 2-D mesh (dp_replicate x dp_shard) the same call is
HSDP: sharded within a replica group, gradients then all-reduced across the groups. Over
tensor-parallel weights (DTensors on the tp axis) it is FSDP x TP, "2D".
"""

from __future__ import annotations

import torch
from torch import nn


def apply_fsdp(
    model: nn.Module, blocks: list[nn.Module], mesh, policy=None, cpu_offload: bool = False
) -> nn.Module:
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    # Low-precision runs all-gather and compute in the autocast dtype (one dtype per group, as
    # FSDP2 requires when LoRA's fp32 adapters sit beside bf16 base weights) and reduce
    # gradients in fp32, which keeps the sum over ranks accurate.
    low = getattr(policy, "autocast_dtype", None)
    mp = (
        MixedPrecisionPolicy(param_dtype=low, reduce_dtype=torch.float32)
        if low
        else MixedPrecisionPolicy()
    )
    # Offloaded shards sit in pinned host memory where there is a GPU to copy them to.
    extra = (
        {"offload_policy": CPUOffloadPolicy(pin_memory=mesh.device_type == "cuda")}
        if cpu_offload
        else {}
    )
    for block in blocks:
        if any(True for _ in block.parameters()):  # a pipeline stage's other blocks: Identity
            fully_shard(block, mesh=mesh, mp_policy=mp, **extra)
    fully_shard(model, mesh=mesh, mp_policy=mp, **extra)
    return model
