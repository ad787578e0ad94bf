"""Faster kernels swapped into a transformers model instance: Liger-Kernel's Triton kernels
(model.kernels) and torchao's float8 linear layers (model.fp8)."""

from __future__ import annotations

import torch
from torch import nn

from paratrain.errors import UserError


def check_kernels(kernels: str, device_type: str) -> None:
    """model.kernels needs a CUDA device and the liger-kernel package (checked before launch)."""
    if kernels == "none":
        return
    if kernels == "triton-loss":  # paratrain's own kernel (ce_triton.py): Triton, on CUDA
        if device_type != "cuda":
            raise UserError(
                f"model.kernels: triton-loss runs a Triton kernel on CUDA GPUs; this run is on "
                f"{device_type}"
            )
        return
    if device_type != "cuda":
        raise UserError(
            f"model.kernels: {kernels} runs Triton kernels on CUDA GPUs; this run is on {device_type}"
        )
    try:
        import liger_kernel  # noqa: F401
    except ImportError:
        raise UserError(
            f"model.kernels: {kernels} needs the liger-kernel package (pip install liger-kernel)"
        ) from None


def apply_kernels(model: nn.Module, kernels: str, device: torch.device) -> nn.Module:
    """Swap fused Triton kernels into a transformers model instance (before LoRA wraps it).

    liger: Liger-Kernel's RMSNorm, rotary embedding and SwiGLU MLP, found by the config's
    model_type. Its fused linear cross-entropy (also the whole of liger-loss) is applied by the
    loss wrapper (models/causal_lm/loss.py), not by patching the model's forward, so the same loss path serves
    every strategy.
    """
    if kernels == "none":
        return model
    check_kernels(kernels, device.type)
    if kernels in ("liger-loss", "triton-loss"):
        return model  # the loss wrapper does it all (triton-loss needs no liger-kernel)
    from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN

    model_type = model.config.model_type
    patch = MODEL_TYPE_TO_APPLY_LIGER_FN.get(model_type)
    if patch is None:
        raise UserError(f"model.kernels: liger-kernel has no kernels for model type {model_type!r}")
    patch(
        rope=True,
        rms_norm=True,
        swiglu=True,
        cross_entropy=False,
        fused_linear_cross_entropy=False,
        model=model,
    )
    return model


def check_fp8(recipe: str, device: torch.device | str) -> None:
    """model.fp8 needs torchao and float8 matmuls (compute capability 8.9+, or the CPU)."""
    if recipe == "none":
        return
    try:
        import torchao.float8  # noqa: F401
    except ImportError:
        raise UserError(
            f"model.fp8: {recipe} needs the torchao package (pip install torchao)"
        ) from None
    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 9):
        name = torch.cuda.get_device_name(device)
        raise UserError(
            f"model.fp8: float8 matmuls need compute capability 8.9+ (H100, H200); {name} has less"
        )


def apply_fp8(
    model: nn.Module, recipe: str, device: torch.device, lm_head: bool = False
) -> nn.Module:
    """Swap the decoder's nn.Linear layers for torchao's Float8Linear (before LoRA wraps them:
    peft then adds its adapters around the float8 base layers). lm_head stays in high precision,
    as torchao and torchtitan advise for the output layer, unless `lm_head` (model.fp8_lm_head);
    layers whose sizes are not multiples of 16, which float8 matmuls cannot take, always do."""
    if recipe == "none":
        return model
    check_fp8(recipe, device)
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    def eligible(module: nn.Module, name: str) -> bool:
        return (
            isinstance(module, nn.Linear)
            and (lm_head or "lm_head" not in name)
            and module.in_features % 16 == 0
            and module.out_features % 16 == 0
        )

    # delayed: torchao's tensorwise layers, whose trained ones fp8_delayed.py swaps later
    name = "tensorwise" if recipe == "delayed" else recipe
    model = convert_to_float8_training(
        model, config=Float8LinearConfig.from_recipe_name(name), module_filter_fn=eligible
    )
    head = getattr(model, "lm_head", None)
    if lm_head and head is not None and not hasattr(head, "linear_mm_config"):
        shape = f"{getattr(head, 'in_features', '?')} x {getattr(head, 'out_features', '?')}"
        raise UserError(
            f"model.fp8_lm_head: lm_head ({shape}) cannot multiply in float8, which needs both "
            "sizes multiples of 16; set model.fp8_lm_head=false"
        )
    return model
