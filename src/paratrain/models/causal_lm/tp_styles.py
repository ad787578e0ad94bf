"""Pieces of a tensor-parallel plan that every causal-LM family's plan shares (Llama's in
spec.py, GPT-2's in gpt2/tp.py): the embedding / lm_head / final-norm ends, the attention and
MLP blocks' inputs under sequence parallelism, LoRA adapters split like their base layer."""

from __future__ import annotations

from typing import Any

from torch import nn


def ends_plan(base: nn.Module, embedding: str, norm: str, sp: bool, loss_parallel: bool) -> dict:
    """The plan's two ends, any family: the token embedding split over the vocabulary (whole
    activations out); lm_head split over the vocabulary (logits left split for loss_parallel),
    fed by the final norm, itself sequence-split under sequence parallelism. Modules a pipeline
    stage replaced by nn.Identity are left out."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
    )

    plan: dict[str, Any] = {}
    if isinstance(base.get_submodule(embedding), nn.Embedding):
        plan[embedding] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())
    if isinstance(base.lm_head, nn.Linear):
        plan["lm_head"] = ColwiseParallel(
            input_layouts=Shard(1) if sp else Replicate(),
            output_layouts=Shard(-1) if loss_parallel else Replicate(),
            use_local_output=not loss_parallel,
        )
        if sp:
            plan[norm] = SequenceParallel()
    return plan


def block_io(takes: str | None, adapted: bool, local_inputs: bool, n_out: int):
    """Attention / MLP under sequence parallelism: whole activations in (all-gathered from the
    sequence shards); out, the block's sequence shard of whole activations when an adapter made
    its row-split layer all-reduce (else that layer's reduce-scatter already gave the shard)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import PrepareModuleInput, PrepareModuleInputOutput

    inputs: dict[str, Any] = (
        dict(
            input_kwarg_layouts={takes: Shard(1)},
            desired_input_kwarg_layouts={takes: Replicate()},
        )
        if takes
        else dict(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    )
    if not adapted:
        return PrepareModuleInput(**inputs, use_local_output=local_inputs)
    return PrepareModuleInputOutput(
        **inputs,
        use_local_input=local_inputs,
        output_layouts=(Replicate(),) + (None,) * (n_out - 1),
        desired_output_layouts=(Shard(1),) + (None,) * (n_out - 1),
        use_local_output=True,
    )


def adapter_plan(path: str, module: nn.Module, which: str, output) -> dict[str, Any]:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    style = (
        (lambda: ColwiseParallel())
        if output is None
        else (lambda: RowwiseParallel(output_layouts=output))
    )
    return {f"{path}.{which}.{name}": style() for name in getattr(module, which)}
