"""Tensor parallelism: the model spec's plan applied with torch.distributed.tensor.parallel.

parallelize_module swaps each planned module's parameters for DTensors sharded over the mesh's
tp axis and hooks its inputs and outputs into the layouts the plan names. Two things it does not
keep, restored here: parameters it re-creates come back trainable (SequenceParallel's norms would
start training under LoRA), and parameters shared by two modules (tied embeddings) come back as
two.
"""

from __future__ import annotations

from typing import Any

from torch import nn


def apply_tp(model: nn.Module, plan: dict[str, Any], mesh) -> nn.Module:
    from torch.distributed.tensor.parallel import parallelize_module

    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    tied: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        tied.setdefault(id(p), []).append(name)
    parallelize_module(model, mesh, plan)
    for names in tied.values():
        first = model.get_parameter(names[0])
        for other in names[1:]:
            owner, _, attr = other.rpartition(".")
            setattr(model.get_submodule(owner), attr, first)
    for name, p in model.named_parameters():
        if name in frozen:
            p.requires_grad_(False)
    return model
