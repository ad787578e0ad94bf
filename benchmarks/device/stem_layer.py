"""MobileNetV2's stem on the seed's input (one-channel 500x500 digits, batch 64, bf16,
channels_last): a 3x3 stride-2 convolution from 1 channel to 32, timed alone in training
(forward + weight gradient; the input needs no gradient). The 2026-12-03 profile of the
fastest row has a cuDNN layout conversion (nchwToNhwcKernel, 0.67 ms a step) and a generic
float-accumulating NHWC kernel (0.47 ms) that look like this layer's: this says what it costs
as cuDNN runs it, compiled, and in the model's two forms of model.stem_conv=depthwise: 9
shifted multiply-adds that inductor fuses (models/depthwise.py) and paratrain's Triton kernels
(models/depthwise_triton.py).

    python benchmarks/device/stem_layer.py OUT.json   (on a GPU; prints a table too)
"""

from __future__ import annotations

import copy
import json
import sys

import torch
from layer_timing import fwd_bwd, time_ms
from torch import nn

from paratrain.models.depthwise import ShiftAddDepthwise
from paratrain.models.depthwise_triton import TritonDepthwise

BATCH, SIDE, ITERS = 64, 500, 20


def main() -> None:
    torch.backends.cudnn.benchmark = True
    conv = nn.Conv2d(1, 32, 3, 2, 1, bias=False).cuda()
    x = torch.randn(BATCH, 1, SIDE, SIDE, device="cuda").contiguous(
        memory_format=torch.channels_last
    )
    nhwc = copy.deepcopy(conv).to(memory_format=torch.channels_last)
    forms = {
        "cudnn_nhwc": nhwc,
        "cudnn_nchw": copy.deepcopy(conv),
        "compiled": torch.compile(copy.deepcopy(nhwc), dynamic=False),
        # the model's own forms of a one-channel stem (model.stem_conv=depthwise)
        "shift_add_compiled": torch.compile(ShiftAddDepthwise(copy.deepcopy(conv)), dynamic=False),
        "triton": TritonDepthwise(copy.deepcopy(nhwc)),
    }
    with torch.autocast("cuda", dtype=torch.bfloat16):
        ref = conv(x)
    grad = torch.randn_like(ref).contiguous(memory_format=torch.channels_last)
    row, outs = {}, {}
    for name, module in forms.items():
        inp = x if name != "cudnn_nchw" else x.contiguous()
        row[f"{name}_ms"], row[f"{name}_kernel_ms"] = time_ms(
            fwd_bwd(module), inp, grad, iters=ITERS
        )
        with torch.autocast("cuda", dtype=torch.bfloat16):
            outs[name] = module(inp).float()
    # the forms compute the same layer: their outputs agree to bf16 rounding
    worst = max((o - outs["cudnn_nhwc"]).abs().max().item() for o in outs.values())
    row["max_output_difference"] = worst
    for name in forms:
        print(
            f"{name:20s} kernels {row[name + '_kernel_ms']:7.3f} ms  wall {row[name + '_ms']:7.3f} ms"
        )
    print(f"largest output difference between forms: {worst:.4f}")
    env = {"torch": torch.__version__, "cudnn": torch.backends.cudnn.version()}
    env["gpu"] = torch.cuda.get_device_name()
    with open(sys.argv[1], "w") as f:
        json.dump(
            {"batch": BATCH, "side": SIDE, "iters": ITERS, "env": env, "row": row}, f, indent=1
        )


if __name__ == "__main__":
    main()
