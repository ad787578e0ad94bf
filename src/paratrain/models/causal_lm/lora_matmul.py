"""lora.fused: a LoRA layer's adapter product added inside its base layer's matmul.

peft computes `base(x) + lora_B(lora_A(x)) * scaling` as three full-size tensors: the base
output, the adapter's (rank r, written by a matmul of K = r that does nothing but write it) and
their sum; backward again writes the adapter's input gradient beside the base's and adds them.
Those passes are memory-bound work between the matmuls. Here the adapter's product goes in as
cuBLAS's C operand (addmm, beta = 1): the base matmul, compute-bound, reads it in its epilogue and
writes the sum once, forward (y = x W^T + s (x A^T) B^T) and backward (dx = dy W + s (dy B) A).
The adapter's own gradients are peft's: dB = s dy^T (x A^T), dA = s (dy B)^T x.

The arithmetic is peft's under autocast (every matmul in the compute dtype, the fp32 adapters
cast to it, their gradients cast back), with one rounding fewer: the sum is made in the matmul's
fp32 accumulator instead of adding two rounded tensors. Layers it does not fit (dropout, a
non-Linear or float8 base, a trained base, DTensor weights, DoRA, several adapters, merged or
disabled adapters) keep peft's forward; `fuse_adapters` patches the layers that fit and says how many.
"""

from __future__ import annotations

import types

import torch
from torch import nn


class AdapterInMatmul(torch.autograd.Function):
    """y = x W^T + bias + s (x A^T) B^T with the adapter's product as the base matmul's C
    operand.

    x: (..., K) activations; weight: (N, K) and bias: (N,) or None, frozen, in the compute
    dtype; lora_a: (r, K) and lora_b: (N, r) trained (fp32); scaling: a Python float."""

    @staticmethod
    def forward(ctx, x, weight, bias, lora_a, lora_b, scaling):
        dtype = weight.dtype
        rows = x.reshape(-1, x.shape[-1]).to(dtype)
        a, b = lora_a.to(dtype), lora_b.to(dtype)
        low = rows @ a.t()  # (T, r): the adapter's rank-r activations, small
        # s on the small side; a bias rides in the adapter matmul's epilogue (broadcast C)
        adapter = (
            (low * scaling) @ b.t() if bias is None else torch.addmm(bias, low * scaling, b.t())
        )
        out = torch.addmm(adapter, rows, weight.t())
        ctx.save_for_backward(rows, low, weight, a, b)
        ctx.scaling, ctx.x_shape, ctx.x_dtype = scaling, x.shape, x.dtype
        ctx.param_dtypes = (lora_a.dtype, lora_b.dtype)
        return out.view(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, grad):
        rows, low, weight, a, b = ctx.saved_tensors
        s = ctx.scaling
        dy = grad.reshape(-1, weight.shape[0]).to(weight.dtype)
        dlow = (dy @ b) * s  # (T, r): the gradient reaching the adapter's rank-r activations
        grad_x = grad_a = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = torch.addmm(dlow @ a, dy, weight).view(ctx.x_shape).to(ctx.x_dtype)
        if ctx.needs_input_grad[3]:
            grad_a = (dlow.t() @ rows).to(ctx.param_dtypes[0])
        if ctx.needs_input_grad[4]:
            grad_b = (dy.t() @ low * s).to(ctx.param_dtypes[1])
        return grad_x, None, None, grad_a, grad_b, None


def fits(layer: nn.Module) -> str | None:
    """Why this peft LoRA layer keeps peft's forward (None: it fits the fused one)."""
    base = getattr(layer, "base_layer", None)
    if type(base) is not nn.Linear:  # float8, Conv1D (GPT-2), quantized bases
        return f"its base layer is {type(base).__name__}, not nn.Linear"
    if base.weight.requires_grad or (base.bias is not None and base.bias.requires_grad):
        return "its base layer is trained"
    if hasattr(base.weight, "device_mesh"):
        return "its weights are DTensors (tensor parallel or FSDP)"
    adapters = list(layer.lora_A.keys())
    if len(adapters) != 1:
        return f"{len(adapters)} adapters"
    name = adapters[0]
    if name in getattr(layer, "lora_variant", {}) or getattr(layer, "use_dora", {}).get(name):
        return "a LoRA variant (DoRA)"
    if not isinstance(layer.lora_dropout[name], nn.Identity):
        return "adapter dropout"
    a, b = layer.lora_A[name], layer.lora_B[name]
    if (
        type(a) is not nn.Linear
        or type(b) is not nn.Linear
        or a.bias is not None
        or b.bias is not None
    ):
        return "its adapters are not bias-free linear layers"
    return None


def _fused_forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """A patched peft lora.Linear's forward: the fused product while its one adapter is active
    and unmerged, peft's own forward otherwise (merging, disabling, other adapters, extra args)."""
    (name,) = self.lora_A.keys()
    if args or kwargs or self.disable_adapters or self.merged or name not in self.active_adapters:
        return self._peft_forward(x, *args, **kwargs)
    return AdapterInMatmul.apply(
        x, self.base_layer.weight, self.base_layer.bias, self.lora_A[name].weight,
        self.lora_B[name].weight, float(self.scaling[name]),
    )  # fmt: skip


def fuse_adapters(model: nn.Module) -> tuple[int, list[str]]:
    """Patch every peft LoRA layer that fits -> (how many were patched, why others were not)."""
    from peft.tuners.lora import Linear as LoraLinear

    patched, kept = 0, []
    for qualified, layer in model.named_modules():
        if not isinstance(layer, LoraLinear) or hasattr(layer, "_peft_forward"):
            continue
        why = fits(layer)
        if why:
            kept.append(f"{qualified}: {why}")
            continue
        layer._peft_forward = layer.forward
        layer.forward = types.MethodType(_fused_forward, layer)
        patched += 1
    return patched, kept
