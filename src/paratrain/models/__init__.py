"""Models by name, or the user's own as ``module.path:builder``.

A builder is ``builder(num_classes: int, in_channels: int) -> nn.Module``. Models never branch
on the strategy: parallelism is applied from outside (paratrain.parallel).
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from torch import nn

from paratrain.errors import UserError
from paratrain.models.vision import build_mobilenet_v2, build_resnet50, build_tiny_cnn

MODELS: dict[str, Callable[..., nn.Module]] = {
    "mobilenet_v2": build_mobilenet_v2,
    "resnet50": build_resnet50,
    "tiny_cnn": build_tiny_cnn,
}

# Keys that mean something to one task only: a run's result.json leaves the other task's out.
IMAGE_ONLY = ("name", "kwargs", "depthwise_conv", "shift_add_min_side")
LM_ONLY = ("path", "init", "shape", "layers", "attn_implementation", "loss_chunk_tokens")
LM_ONLY += ("kernels", "fp8")

_USER = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")


@dataclass(kw_only=True)
class ModelConfig:
    name: str = "mobilenet_v2"
    """Image model: mobilenet_v2, resnet50, tiny_cnn, or your own builder as module.path:function."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Image model: keyword arguments for the builder beside num_classes and in_channels
    (`--set model.kwargs.width=64` calls build(num_classes=.., in_channels=.., width=64))."""
    path: str | None = None
    """Language model: a Hugging Face checkpoint directory (any AutoModelForCausalLM)."""
    init: Literal["pretrained", "random"] = "pretrained"
    """Language model: load the weights at path, or build the architecture with random weights."""
    shape: (
        Literal["llama3-8b", "llama3.2-1b", "tiny", "gpt2", "tiny-gpt2", "bert-base", "tiny-bert"]
        | None
    ) = None
    """Language model with init=random and no path: a named shape (Llama: llama3-8b,
    llama3.2-1b, tiny; GPT-2: gpt2 (124M), tiny-gpt2; BERT: bert-base, tiny-bert)."""
    layers: int | None = None
    """Language model with init=random: this many decoder layers instead of the shape's (a
    shallow 8B for a quick try of its width, a deeper tiny model for pipeline stages)."""
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2", "flex_attention"] = "sdpa"
    """Language model attention kernel (transformers' attn_implementation)."""
    loss_chunk_tokens: int = 0
    """Language model: lm_head + cross-entropy over this many trained tokens at a time, never the
    whole [tokens, vocab] logits (models/causal_lm/loss.py); 0 uses transformers' own loss."""
    depthwise_conv: Literal["native", "shift-add"] = "native"
    """Image model: depthwise convolutions through PyTorch (cuDNN on GPUs), or, on inputs of at
    least shift_add_min_side pixels, as shifted multiply-adds that torch.compile fuses
    (models/depthwise.py; needs train.compile). cuDNN runs MobileNetV2's 250x250 depthwise layers
    with a slow generic kernel on H200."""
    shift_add_min_side: int = 200
    """With depthwise_conv=shift-add: the smallest input side (pixels) that takes shift-add; below
    it, cuDNN. On H200, shift-add wins at 250 px and loses at 125 px and below."""
    kernels: Literal["none", "liger", "liger-loss"] = "none"
    """Language model on CUDA (pip install liger-kernel): liger swaps in Liger-Kernel's Triton
    kernels (RMSNorm, RoPE, SwiGLU) and its fused linear cross-entropy; liger-loss only the fused
    cross-entropy (with train.compile, which fuses the rest itself). loss_chunk_tokens, when set,
    replaces Liger's loss with paratrain's chunked one."""
    fp8: Literal["none", "tensorwise", "rowwise"] = "none"
    """Language model: the frozen base's linear layers (not lm_head) multiply in float8 through
    torchao's Float8Linear, scaled per tensor or per row; adapters and the rest keep the autocast
    dtype. Pair with train.compile: eagerly, torchao's backward also computes the frozen weights'
    gradients (3 matmuls per layer instead of 2); compiled, they are dropped (tested). pip install
    torchao; needs a GPU of compute capability 8.9+ (H100, H200) or the CPU."""

    def __post_init__(self) -> None:
        if self.init == "random" and self.path is None and self.shape is None:
            raise ValueError(
                "shape: init=random needs a shape (llama3-8b, llama3.2-1b, tiny, gpt2, tiny-gpt2) "
                "or a path"
            )
        if self.shift_add_min_side < 0:
            raise ValueError(f"shift_add_min_side: must be >= 0, got {self.shift_add_min_side}")
        if self.loss_chunk_tokens < 0:
            raise ValueError(f"loss_chunk_tokens: must be >= 0, got {self.loss_chunk_tokens}")
        if self.layers is not None and (self.layers < 1 or self.init != "random"):
            raise ValueError(f"layers: needs init=random and a count >= 1, got {self.layers}")
        if self.init == "pretrained" and self.shape is not None:
            raise ValueError("init: a shape builds random weights; set model.init=random")
        if self.name not in MODELS and not _USER.fullmatch(self.name):
            raise ValueError(
                f"name: got {self.name!r}; accepted: {', '.join(MODELS)}, or module.path:builder"
            )


def resolve_builder(name: str) -> Callable[..., nn.Module]:
    if name in MODELS:
        return MODELS[name]
    module_name, fn_name = name.split(":")
    # the user's module beside them, as `python -m paratrain` finds it (the paratrain command's
    # path starts at its own script): the working directory is searched last
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise UserError(f"model.name: cannot import {module_name!r} ({e})") from None
    except Exception as e:  # the user's module itself fails: a syntax error, a raise at import
        raise UserError(
            f"model.name: importing {module_name!r} failed: {type(e).__name__}: {e}"
        ) from None
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        raise UserError(f"model.name: {module_name} has no function {fn_name!r}")
    return fn


def build_model(cfg: ModelConfig, num_classes: int, in_channels: int) -> nn.Module:
    builder = resolve_builder(cfg.name)
    try:
        model = builder(num_classes=num_classes, in_channels=in_channels, **cfg.kwargs)
    except TypeError as e:
        if cfg.kwargs and "argument" in str(e):  # a keyword the builder does not take
            raise UserError(f"model.kwargs: {cfg.name} does not take them: {e}") from None
        if cfg.name in MODELS:
            raise
        raise UserError(f"model.name: {cfg.name} raised TypeError: {e}") from None
    except Exception as e:
        if cfg.name in MODELS:  # paratrain's own builders: a bug, with its traceback
            raise
        raise UserError(f"model.name: {cfg.name} raised {type(e).__name__}: {e}") from None
    if not isinstance(model, nn.Module):
        raise UserError(f"model.name: {cfg.name} returned {type(model).__name__}, not an nn.Module")
    apply_depthwise_conv(model, cfg)
    return model


def apply_depthwise_conv(model: nn.Module, cfg: ModelConfig) -> None:
    """model.depthwise_conv=shift-add: swap the depthwise layers (models/depthwise.py)."""
    if cfg.depthwise_conv == "shift-add":
        from paratrain.models.depthwise import shift_add_depthwise

        if shift_add_depthwise(model, cfg.shift_add_min_side) == 0:
            raise UserError(f"model.depthwise_conv: {cfg.name} has no depthwise convolution")
