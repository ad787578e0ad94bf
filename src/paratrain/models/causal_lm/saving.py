"""Saving what a LoRA run produced: the adapter in peft's format (PeftModel.from_pretrained loads
it), the tokenizer beside it, and optionally the merged full model."""

from __future__ import annotations

from pathlib import Path

import torch.distributed as dist
from torch import nn


def full_state_dict(model: nn.Module, pipelined: bool = False) -> dict:
    """Every rank calls this; rank 0 gets the whole (unsharded) state on the CPU. A pipeline's
    stages each hold part of the model: every rank gathers its stage's whole trainable tensors
    (an adapter's are small; the frozen base is not moved) and rank 0 merges the stages'
    disjoint parts."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    if not pipelined:
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_model_state_dict(model, options=options)
    options = StateDictOptions(full_state_dict=True, ignore_frozen_params=True)
    local = {k: v.cpu() for k, v in get_model_state_dict(model, options=options).items()}
    parts: list = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(local, parts, dst=0)
    return {k: v for part in parts or [] for k, v in part.items()}


def save_adapter(
    model: nn.Module,
    out_dir: Path,
    tokenizer,
    *,
    merged: bool,
    is_main: bool,
    pipelined: bool = False,
) -> dict[str, str]:
    from paratrain.protocols import unwrap

    peft_model = unwrap(model)  # under DDP, compile and the loss wrapper
    # Gathered from every rank (FSDP and TP shards, pipeline stages), written by rank 0 only.
    state = full_state_dict(peft_model, pipelined) if dist.is_initialized() else None
    paths: dict[str, str] = {}
    if is_main:
        adapter_dir = out_dir / "adapter"
        peft_model.save_pretrained(adapter_dir, state_dict=state)
        tokenizer.save_pretrained(adapter_dir)
        paths["adapter"] = str(adapter_dir)
        if merged:
            merged_dir = out_dir / "merged"
            # Merging needs whole weights on this rank: DDP and single runs (config refuses fsdp).
            peft_model.merge_and_unload().save_pretrained(merged_dir)
            tokenizer.save_pretrained(merged_dir)
            paths["merged"] = str(merged_dir)
    if dist.is_initialized():
        dist.barrier()
    return paths
