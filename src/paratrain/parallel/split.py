"""The seeds' simplest model parallelism (strategy=split; seed 001 §4, seed 004): consecutive
units of one model on different GPUs of one process, a batch going through them in turn.

Each unit (the model spec's split_units: an image model's stem, blocks and head; a language
model's embedding, decoder layers, norm and lm_head) is moved to its device and gets a forward
pre-hook that moves its inputs there; the model's own forward is unchanged. There are no
micro-batches: while one GPU computes, the others wait, so with N GPUs each is idle about
(N-1)/N of the step. It lets a model that does not fit on one GPU train at one GPU's speed; a
pipeline (parallel.pp) overlaps the GPUs instead.
"""

from __future__ import annotations

import torch
from torch import nn

from paratrain.config.parallel import SplitConfig
from paratrain.errors import UserError


def split_devices(cfg: SplitConfig, device: torch.device) -> list[torch.device]:
    if device.type != "cuda":
        return [device] * (cfg.devices or 2)
    count = torch.cuda.device_count()
    n = cfg.devices or count
    if n > count:
        raise UserError(f"split.devices: {n} asked for, {count} GPUs visible")
    return [torch.device("cuda", i) for i in range(n)]


def _mover(device: torch.device):
    def move(value):
        if isinstance(value, torch.Tensor):
            return value.to(device, non_blocking=True)
        if isinstance(value, (tuple, list)):
            return type(value)(move(v) for v in value)
        if isinstance(value, dict):
            return {k: move(v) for k, v in value.items()}
        return value

    def hook(module, args, kwargs):
        return move(args), move(kwargs)

    return hook


def apply_split(model: nn.Module, spec, devices: list[torch.device], boundaries: list[int]) -> dict:
    """Places the model's units on `devices` in order; returns what result.json records."""
    from paratrain.parallel.pipeline import stage_ranges

    units = spec.split_units(model)
    parts = stage_ranges(
        len(units), len(devices), boundaries, ("split.devices", "split.boundaries")
    )
    for part, device in zip(parts, devices, strict=True):
        for i in part:
            units[i].to(device)
            units[i].register_forward_pre_hook(_mover(device), with_kwargs=True)
    n = len(devices)
    return {
        "devices": [str(d) for d in devices],
        "units_per_device": [len(p) for p in parts],
        # one batch at a time: each device computes its part while the others wait
        "idle_fraction_per_device": (n - 1) / n,
    }
