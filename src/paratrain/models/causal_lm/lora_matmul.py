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
non-Linear or float8 base, a trained base, DoRA, several adapters, merged or
disabled adapters) keep peft's forward; `fuse_adapters` patches the layers that fit and says how many.
"""

from __future__ import annotations

import types

import torch
from torch import nn


# Two custom ops, so that inductor calls them as they are: its functional addmm writes into a
# new buffer, and torch's out-of-place addmm first copies C there (a full-size memcpy per call:
# 2.7 ms a step of the 8B LoRA step on one H200, as much as the fusion saved); in place on a
# tensor made here, cuBLAS reads C and writes the sum in one kernel.
@torch.library.custom_op("paratrain::lora_forward", mutates_args=())
def lora_forward(
    rows: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    a: torch.Tensor,
    b: torch.Tensor,
    scaling: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """rows (T, K), weight (N, K), bias (N,) or None, a (r, K), b (N, r), all in one dtype ->
    (rows W^T + bias + s (rows A^T) B^T, the adapter's rank-r activations rows A^T)."""
    low = rows @ a.t()
    scaled = low * scaling  # s on the small side
    # a bias rides in the adapter matmul's epilogue (broadcast C, no copy)
    out = scaled @ b.t() if bias is None else torch.addmm(bias, scaled, b.t())
    out.addmm_(rows, weight.t())
    return out, low


@lora_forward.register_fake
def _(rows, weight, bias, a, b, scaling):
    return rows.new_empty(rows.shape[0], weight.shape[0]), rows.new_empty(rows.shape[0], a.shape[0])


@torch.library.custom_op("paratrain::lora_backward", mutates_args=())
def lora_backward(
    grad: torch.Tensor,
    rows: torch.Tensor,
    low: torch.Tensor,
    weight: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    scaling: float,
    need_rows: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> (the rows' gradient dy W + s (dy B) A, or an empty tensor where it is not needed (the
    first layer's input); A's gradient s (dy B)^T rows; B's s dy^T low), in the rows' dtype."""
    dlow = (grad @ b) * scaling  # (T, r): the gradient reaching the rank-r activations
    if need_rows:
        drows = dlow @ a
        drows.addmm_(grad, weight)
    else:
        drows = rows.new_empty(0)
    return drows, dlow.t() @ rows, (grad.t() @ low) * scaling


@lora_backward.register_fake
def _(grad, rows, low, weight, a, b, scaling, need_rows):
    drows = rows.new_empty(rows.shape) if need_rows else rows.new_empty(0)
    return drows, a.new_empty(a.shape), b.new_empty(b.shape)


def _setup(ctx, inputs, output):
    rows, weight, _, a, b, scaling = inputs
    ctx.save_for_backward(rows, output[1], weight, a, b)
    ctx.scaling = scaling
    ctx.mark_non_differentiable(output[1])


def _backward(ctx, grad, _low):
    rows, low, weight, a, b = ctx.saved_tensors
    need = ctx.needs_input_grad[0]
    drows, da, db = lora_backward(grad.contiguous(), rows, low, weight, a, b, ctx.scaling, need)
    return drows if need else None, None, None, da, db, None


lora_forward.register_autograd(_backward, setup_context=_setup)


def adapter_in_matmul(x, weight, bias, lora_a, lora_b, scaling: float) -> torch.Tensor:
    """x (..., K) -> x W^T + bias + s (x A^T) B^T, every matmul in autocast's dtype where it is
    on (else the base weight's), as autocast runs peft's: the fp32 adapters (and an fp32 base)
    are cast to it, the adapters' gradients back (autograd's casts). The ops run with autocast
    off: their operands are cast already, and one dtype is what addmm_ in place needs."""
    device = x.device.type
    on = torch.is_autocast_enabled(device)
    dtype = torch.get_autocast_dtype(device) if on else weight.dtype
    rows = x.reshape(-1, x.shape[-1]).to(dtype)
    bias = None if bias is None else bias.to(dtype)
    with torch.autocast(device, enabled=False):
        out, _ = lora_forward(
            rows, weight.to(dtype), bias, lora_a.to(dtype), lora_b.to(dtype), scaling
        )
    return out.view(*x.shape[:-1], weight.shape[0])


def fits(layer: nn.Module) -> str | None:
    """Why this peft LoRA layer keeps peft's forward (None: it fits the fused one)."""
    base = getattr(layer, "base_layer", None)
    if type(base) is not nn.Linear:  # float8, Conv1D (GPT-2), quantized bases
        return f"its base layer is {type(base).__name__}, not nn.Linear"
    if base.weight.requires_grad or (base.bias is not None and base.bias.requires_grad):
        return "its base layer is trained"
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
    return adapter_in_matmul(
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
