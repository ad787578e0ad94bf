"""FSDP2: torch.distributed.fsdp.fully_shard per block (decoder layer, or trunk block), then the
root. Each block's parameters are all-gathered just before its forward and backward and freed
after, and gradients are reduce-scattered: per-GPU memory for weights, gradients and optimizer
state falls to about 1/world of the model."""

from __future__ import annotations

import torch
from torch import nn

from paratrain import dist as pdist


def shard_units(model: nn.Module) -> list[nn.Module]:
    from paratrain.errors import UserError
    from paratrain.parallel.activation_checkpointing import trunk_blocks

    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    layers = getattr(getattr(inner, "model", None), "layers", None)
    if layers is not None:
        return list(layers)
    try:
        return trunk_blocks(model)
    except UserError:
        raise UserError(
            "strategy: fsdp shards per block; the model has neither model.layers nor a features trunk"
        ) from None


def apply_fsdp(model: nn.Module, device: torch.device, policy=None, cfg=None) -> nn.Module:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = pdist.data_parallel_mesh(device)
    # Low-precision runs all-gather and compute in the autocast dtype (one dtype per group, as
    # FSDP2 requires when LoRA's fp32 adapters sit beside bf16 base weights) and reduce
    # gradients in fp32, which keeps the sum over ranks accurate.
    low = getattr(policy, "autocast_dtype", None)
    mp = (
        MixedPrecisionPolicy(param_dtype=low, reduce_dtype=torch.float32)
        if low
        else MixedPrecisionPolicy()
    )
    for unit in shard_units(model):
        fully_shard(unit, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    return model
