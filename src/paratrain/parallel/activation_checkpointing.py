"""Activation checkpointing over a model's sequential trunk (torch.utils.checkpoint).

Each block of the trunk keeps only its input during forward and recomputes its activations in
backward: memory for activations drops from all blocks to about one block, for roughly one more
forward pass of compute (seed 000 §4.2).
"""

from __future__ import annotations

import functools

from torch import nn
from torch.utils.checkpoint import checkpoint

from paratrain.errors import UserError


def trunk_blocks(model: nn.Module) -> list[nn.Module]:
    """The blocks to checkpoint: children of `features` (MobileNetV2, our CNNs) or ResNet stages."""
    trunk = getattr(model, "features", None)
    if isinstance(trunk, nn.Sequential):
        return list(trunk)
    stages = [getattr(model, f"layer{i}", None) for i in range(1, 5)]
    if all(isinstance(s, nn.Sequential) for s in stages):
        return stages
    raise UserError(
        "train.activation_checkpointing: the model has no sequential trunk; give it a "
        "`features` nn.Sequential (torchvision's MobileNetV2 and paratrain's models have one)"
    )


def _checkpointed_forward(forward, module: nn.Module, *args):
    if not module.training:
        return forward(*args)
    # use_reentrant=False: works with DDP, torch.compile and inputs that need no grad.
    return checkpoint(forward, *args, use_reentrant=False)


def apply_activation_checkpointing(model: nn.Module) -> nn.Module:
    if hasattr(model, "gradient_checkpointing_enable"):  # HF transformers (also under peft)
        # Non-reentrant: works with frozen inputs (LoRA), DDP and FSDP. transformers 5.2x renamed
        # the method; older releases (the GPU machine's 5.17) only have the first name.
        kwargs = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        if hasattr(model, "enable_input_require_grads"):
            model.enable_input_require_grads()
        return model
    # The blocks' forward is replaced on the instance rather than wrapped in a new module, so
    # parameter names (and so checkpoints) are the same with and without checkpointing.
    for block in trunk_blocks(model):
        if not getattr(block, "_paratrain_checkpointed", False):
            block.forward = functools.partial(_checkpointed_forward, block.forward, block)
            block._paratrain_checkpointed = True
    return model
