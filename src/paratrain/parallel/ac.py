"""Activation checkpointing over a model's blocks (torch.utils.checkpoint).

Each block keeps only its input during forward and recomputes its activations in backward:
memory for activations drops from all blocks to about one block, for roughly one more forward
pass of compute (seed 000 §4.2). The blocks come from the model's spec (decoder layers, trunk
blocks); under tensor parallelism the recomputation repeats the block's collectives too.
"""

from __future__ import annotations

import functools

from torch import nn
from torch.utils.checkpoint import checkpoint


def _checkpointed_forward(forward, module: nn.Module, *args, **kwargs):
    if not module.training:
        return forward(*args, **kwargs)
    # use_reentrant=False: works with DDP, FSDP, torch.compile, keyword arguments and inputs
    # that need no grad (LoRA's frozen embedding).
    return checkpoint(forward, *args, use_reentrant=False, **kwargs)


def apply_activation_checkpointing(blocks: list[nn.Module]) -> None:
    # Each block's forward is replaced on the instance rather than wrapped in a new module, so
    # parameter names (and so checkpoints) are the same with and without checkpointing.
    for block in blocks:
        if not getattr(block, "_paratrain_checkpointed", False):
            block.forward = functools.partial(_checkpointed_forward, block.forward, block)
            block._paratrain_checkpointed = True
