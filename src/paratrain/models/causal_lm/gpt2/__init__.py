"""GPT-2, a decoder family whose parts differ from Llama's: Conv1D projections with q, k and v
fused (its tensor-parallel plan: tp.py) and learned positions added on the first pipeline
stage (stage_body). Its record, where its modules live, is family.py's GPT2."""

from __future__ import annotations

import torch

from paratrain.models.causal_lm.gpt2.tp import gpt2_tp_plan as tp_plan

__all__ = ["stage_body", "tp_plan"]


def stage_body(decoder, layers, first: bool, options: dict):
    """The stage's layers as one function: token and learned position embeddings on the first
    stage, then each block."""

    def body(x):
        if first:
            positions = torch.arange(x.shape[1], device=x.device).unsqueeze(0)
            x = decoder.drop(decoder.wte(x) + decoder.wpe(positions))
        for layer in layers:
            out = layer(x)
            x = out[0] if isinstance(out, tuple) else out
        return x

    return body
