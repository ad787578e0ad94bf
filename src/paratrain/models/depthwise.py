"""Depthwise convolutions as shifted multiply-adds, for torch.compile to fuse.

A depthwise k x k convolution (groups = channels) is, per output pixel, k*k products of one input
pixel and one weight per channel: no reduction over channels, so no tensor-core work. On H200
(cuDNN 9, bf16, channels_last) the two 250x250 depthwise layers of MobileNetV2 at 500x500 input
run a generic direct kernel, 4.5 and 6.4 ms each, a quarter of the whole training step. Written
as k*k shifted slices times a per-channel weight, inductor fuses each layer into one kernel
forward and a few backward: forward + backward 6.1 -> 2.0 ms and 10.2 -> 5.5 ms on those two
layers, but slower than cuDNN's specialised kernels on every layer of 125 pixels and less
(benchmarks/results/2026-11-30-h200x2/issue3_depthwise/). Hence `min_side`: the swap applies
from that input size up. Eagerly it is slower than cuDNN (each product is its own tensor): use
it with train.compile.

The module keeps nn.Conv2d's parameters (weight [C, 1, k, k], bias [C]) under the same names, so
state dicts, checkpoints and optimizers do not see the swap.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from paratrain.models.swap import swap_modules


class Depthwise(nn.Module):
    """A depthwise nn.Conv2d's function in another form for inputs at least `min_side` pixels on
    their shorter side, the native convolution below (decided per shape, so once per compiled
    graph). It keeps the convolution's Parameters: nothing copied."""

    def __init__(self, conv: nn.Conv2d, min_side: int = 0):
        super().__init__()
        self.weight, self.bias = conv.weight, conv.bias
        self.stride, self.padding, self.dilation = conv.stride, conv.padding, conv.dilation
        self.min_side = min_side

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if min(x.shape[-2:]) < self.min_side:
            groups = x.shape[1]  # the channels, or 1 for a one-channel input (is_one_channel)
            return F.conv2d(
                x, self.weight, self.bias, self.stride, self.padding, self.dilation, groups
            )
        return self.swapped(x)

    def swapped(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def extra_repr(self) -> str:
        c, _, kh, kw = self.weight.shape
        return (
            f"{c}, kernel_size={(kh, kw)}, stride={self.stride}, padding={self.padding}, "
            f"from {self.min_side} px"
        )


class ShiftAddDepthwise(Depthwise):
    """Shifted multiply-adds, for torch.compile to fuse."""

    def swapped(self, x: torch.Tensor) -> torch.Tensor:
        # Under autocast a convolution computes in the autocast dtype; so does this (products and
        # sum in fp32 inside the fused kernel, the result rounded once, as cuDNN does).
        out_dtype = x.dtype
        if torch.is_autocast_enabled(x.device.type):
            out_dtype = torch.get_autocast_dtype(x.device.type)
        (kh, kw), (sh, sw), (dh, dw) = self.weight.shape[2:], self.stride, self.dilation
        ph, pw = self.padding
        n, _, h, w = x.shape
        c = self.weight.shape[0]  # x's channels, or one broadcast over them (is_one_channel)
        ho = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
        wo = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
        xp = F.pad(x.to(out_dtype), (pw, pw, ph, ph))
        acc = torch.promote_types(out_dtype, torch.float32)  # fp32 sums for bf16 / fp16
        weight = self.weight.to(out_dtype).to(acc)  # the rounding a bf16 convolution applies
        out = None
        for i in range(kh):
            for j in range(kw):
                top, left = i * dh, j * dw
                tap = xp[
                    :, :, top : top + sh * (ho - 1) + 1 : sh, left : left + sw * (wo - 1) + 1 : sw
                ]
                term = tap.to(acc) * weight[:, 0, i, j].view(1, c, 1, 1)
                out = term if out is None else out + term
        if self.bias is not None:
            out = out + self.bias.to(acc).view(1, c, 1, 1)
        return out.to(out_dtype)


def is_depthwise(module: nn.Module) -> bool:
    return (
        type(module) is nn.Conv2d
        and module.groups > 1
        and module.groups == module.in_channels == module.out_channels
        and module.padding_mode == "zeros"
        and isinstance(module.padding, tuple)  # not "same" / "valid" strings
    )


def is_one_channel(module: nn.Module) -> bool:
    """A convolution from one input channel to several (a stem on grayscale images: MobileNetV2's
    first layer on MNIST). Each output channel convolves that one channel with its own k x k
    weight: a depthwise convolution of the input broadcast over the output channels, which the
    Depthwise forms compute without the broadcast copy (model.stem_conv=depthwise)."""
    return (
        type(module) is nn.Conv2d
        and module.in_channels == module.groups == 1
        and module.out_channels > 1
        and module.padding_mode == "zeros"
        and isinstance(module.padding, tuple)
    )


def shift_add_depthwise(model: nn.Module, min_side: int = 0) -> int:
    """Swap every depthwise nn.Conv2d of `model` for a ShiftAddDepthwise holding its parameters
    (shift-add from inputs of `min_side` pixels up); returns how many were swapped."""
    return swap_depthwise(model, ShiftAddDepthwise, min_side)


def swap_depthwise(
    model: nn.Module,
    form: type[Depthwise],
    min_side: int = 0,
    pick=is_depthwise,
    strided_min_side: int | None = None,
) -> int:
    """Swap every depthwise nn.Conv2d of `model` (or every one `pick` accepts: is_one_channel)
    for `form` (a Depthwise) from inputs of `min_side` pixels up (`strided_min_side`, when
    given, for the layers of stride 2 or more); returns how many."""

    def make(conv: nn.Conv2d) -> Depthwise:
        strided = strided_min_side is not None and max(conv.stride) > 1
        return form(conv, strided_min_side if strided else min_side)

    return swap_modules(model, pick, make)
