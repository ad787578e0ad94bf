"""Causal attention without transformers' host sync. transformers' sdpa path decides each
forward whether the mask can be left to SDPA's is_causal by reading the batch on the host: the
padding mask's all() (masking_utils._ignore_causal_mask_sdpa), or, without one, the position ids'
packed-sequence check (find_packed_sequence_indices). Either stops the host until the GPU has
finished the step before, so each step starts with the GPU's queue empty.

Here the host already knows (data/text/data.py's Collate: a batch without padding carries no mask,
packed rows carry position ids), so the decoder's attention runs under a name of its own,
registered with transformers' AttentionInterface and not with its mask functions: transformers
then builds no mask (its documented exit for custom attention), and a hook on the decoder hands
the layers the mask a batch needs, built on the device without reading it back: none (SDPA's
is_causal) for rows without padding or packing, else the boolean [batch, 1, q, k] mask
transformers' sdpa_mask builds (causal, and the key a real token of the same sequence)."""

from __future__ import annotations

import torch
from torch import nn

NAME = "paratrain_sdpa"


def use_own_masks(model: nn.Module, decoder: nn.Module) -> bool:
    """The model's sdpa attention under NAME, and the decoder's masks from mask_for, where its
    attention is plain causal over the whole row (mask_for builds no other); -> whether applied.
    Sliding-window or chunked layers keep transformers' own masks."""
    if not plain_causal(model.config):
        return False
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    AttentionInterface.register(NAME, sdpa_attention_forward)  # the same kernel as "sdpa"
    model.config._attn_implementation = NAME
    decoder.register_forward_pre_hook(_hand_mask, with_kwargs=True)
    return True


def plain_causal(config) -> bool:
    """Every layer attends to every earlier token: no sliding window (Mistral, Qwen2's option),
    no chunked attention (Llama 4), no layer types other than full attention (Gemma 2/3)."""
    if getattr(config, "sliding_window", None) is not None and getattr(
        config, "use_sliding_window", True
    ):
        return False
    if getattr(config, "attention_chunk_size", None) is not None:
        return False
    kinds = getattr(config, "layer_types", None) or []
    return all(kind == "full_attention" for kind in kinds)


def _hand_mask(module, args, kwargs):
    mask, positions = kwargs.get("attention_mask"), kwargs.get("position_ids")
    if mask is not None and mask.dim() == 4:  # a mask built already: used as it is
        return None
    ids = kwargs.get("input_ids")
    if ids is None and args and args[0] is not None:
        ids = args[0]
    if ids is None:
        ids = kwargs["inputs_embeds"][..., 0]
    kwargs["attention_mask"] = mask_for(mask, positions, ids.shape[1], ids.device)
    return args, kwargs


def mask_for(
    padding: torch.Tensor | None, positions: torch.Tensor | None, length: int, device
) -> torch.Tensor | None:
    """None (causal, SDPA's is_causal) without padding and packing; else [batch, 1, q, k] bool:
    key k <= query q, k a real token (padding 1), and q, k in the same packed sequence (a new one
    wherever the position ids do not step by exactly one, as transformers counts them)."""
    if padding is None and positions is None:
        return None
    q = torch.arange(length, device=device)
    allowed = (q[None, :] <= q[:, None])[None]  # [1, q, k]
    if padding is not None:
        allowed = allowed & padding.to(device=device, dtype=torch.bool)[:, None, :]
    if positions is not None:
        step = positions.to(device).diff(dim=-1) != 1
        seq = torch.nn.functional.pad(step.cumsum(-1), (1, 0))  # [batch, length]
        allowed = allowed & (seq[:, :, None] == seq[:, None, :])
    return allowed[:, None]
