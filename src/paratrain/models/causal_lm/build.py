"""Building a causal LM through HF transformers: from a checkpoint directory, or a named Llama
shape with random weights (throughput work, tests; no weights needed)."""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch
from torch import nn

from paratrain.errors import UserError

# Llama shapes for random-init throughput work (no weights needed). From the models' config.json.
SHAPES: dict[str, dict] = {
    "llama3-8b": dict(
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        rope_theta=500000.0,
        max_position_embeddings=8192,
        tie_word_embeddings=False,
    ),
    "llama3.2-1b": dict(
        vocab_size=128256,
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        rope_theta=500000.0,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
    ),
    # A few hundred thousand parameters: CPU tests. Its vocabulary holds the byte tokenizer's 259.
    "tiny": dict(
        vocab_size=320,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        rope_theta=500000.0,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
    ),
}


def build_causal_lm(
    path: str | None,
    init: str,
    shape: str | None,
    attn: str,
    dtype: torch.dtype,
    device: torch.device | str = "cpu",
    layers: int | None = None,
) -> nn.Module:
    """Random init builds straight on `device` in `dtype` (an 8B model in fp32 on the host would be
    32 GB and minutes of single-threaded init); pretrained weights load on the host."""
    from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    if init == "random":
        if path is not None:
            config = AutoConfig.from_pretrained(path)
            config._attn_implementation = attn
            if layers:
                config.num_hidden_layers = layers
            with building(dtype, device):
                return AutoModelForCausalLM.from_config(config, dtype=dtype)
        config = LlamaConfig(**shape_of(shape, layers), attn_implementation=attn)
        with building(dtype, device):
            return LlamaForCausalLM(config)
    if not Path(path).is_dir():
        raise UserError(f"model.path: no such directory {path} (a Hugging Face checkpoint)")
    try:
        return AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation=attn)
    except (OSError, ValueError) as e:
        raise UserError(
            f"model.path: cannot load {path} ({str(e).splitlines()[0][:200]})"
        ) from None


def shape_of(shape: str, layers: int | None = None) -> dict:
    """A named shape's config fields, with its decoder layer count replaced when given."""
    return {**SHAPES[shape], **({"num_hidden_layers": layers} if layers else {})}


@contextlib.contextmanager
def building(dtype: torch.dtype, device: torch.device | str):
    """New tensors in `dtype` on `device` (torch's default-dtype and device context)."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            yield
    finally:
        torch.set_default_dtype(old)


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks (under a peft wrapper too): the unit of FSDP sharding."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    layers = getattr(getattr(inner, "model", None), "layers", None)
    if layers is None:
        raise UserError(
            "model.path: paratrain parallelizes causal LMs of the Llama layout (model.layers); "
            "this model has none"
        )
    return list(layers)
