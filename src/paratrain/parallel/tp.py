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


def replicate_partial_grads(params: list) -> None:
    """Gradients of replicated DTensor weights (the norms under sequence parallelism) can come
    back 'Partial' (unsummed over the tp ranks; torch 2.11 leaves them so). Every optimizer step
    still computes the right update, but state copied from a gradient (SGD's momentum buffer)
    stays Partial, which checkpoints cannot hold: sum them here, before the optimizer step."""
    for p in params:
        g = p.grad
        if g is not None and any(pl.is_partial() for pl in g.placements):
            p.grad = g.redistribute(placements=p.placements)


def split_by_kind(params: list) -> list[dict]:
    """Optimizer parameter groups with DTensor and plain tensors apart (LoRA under tensor
    parallelism has both): the foreach kernels of one group take one kind (torch 2.11 refuses
    a mix)."""
    from torch.distributed.tensor import DTensor

    groups = [
        [p for p in params if isinstance(p, DTensor)],
        [p for p in params if not isinstance(p, DTensor)],
    ]
    return [{"params": g} for g in groups if g]
