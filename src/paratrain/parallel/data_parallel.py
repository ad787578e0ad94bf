"""The data-parallel wrappers: identity, nn.DataParallel and DistributedDataParallel."""

from __future__ import annotations

import contextlib

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def apply_single(model: nn.Module, device: torch.device, policy=None) -> nn.Module:
    return model


def apply_dp(model: nn.Module, device: torch.device, policy=None) -> nn.Module:
    # DataParallel replicates the module onto every visible GPU on each forward and gathers the
    # outputs on GPU 0: one Python process drives all GPUs, which is why DDP beats it.
    if device.type != "cuda":
        return model  # DataParallel without GPUs is the module itself; say so instead of wrapping
    return nn.DataParallel(model)


def apply_ddp(model: nn.Module, device: torch.device, policy=None) -> nn.Module:
    # DDP broadcasts rank 0's weights at construction, then all-reduces gradients in buckets
    # during backward, overlapping communication with the rest of the backward pass.
    ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids)


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


def unwrap(model: nn.Module) -> nn.Module:
    """The user's module under DP/DDP and torch.compile wrappers (for state_dict and saving)."""
    while True:
        if isinstance(model, (nn.DataParallel, DistributedDataParallel)):
            model = model.module
        elif hasattr(model, "_orig_mod"):
            model = model._orig_mod
        else:
            return model
