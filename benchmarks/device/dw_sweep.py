"""paratrain's Triton depthwise kernels (models/depthwise_triton.py) kernel by kernel, on
MobileNetV2's distinct depthwise layers and its one-channel stem (500x500, batch 64, bf16,
channels_last), for several block sizes and warps: the forward, the input gradient and the
weight gradient each as the GPU's kernel time (layer_timing.py), and cuDNN's forward + backward
beside them. Call 25's profile (2026-12-03) had the two 250 px layers' kernels at 1.2-2.3 TB/s
(3.05 ms a step with the stem, against ~1.3 at 3.5 TB/s), and cuDNN faster than these kernels
at stride 1 below 200 px but slower at stride 2: this says which (elements a program, weight
gradient's elements, warps) is fastest per kernel, and where Triton beats cuDNN.

    python benchmarks/device/dw_sweep.py OUT.json   (on a GPU; prints a table too)
"""

from __future__ import annotations

import json
import sys

import torch
import torch.nn.functional as F
from layer_timing import time_ms

from paratrain.models import depthwise_triton as dt

BATCH = 64
# (input channels, output channels, input side, stride): the stem (1 -> 32), then each distinct
# depthwise layer of MobileNetV2 at 500 px input, with how many the model has
LAYERS = [
    (1, 32, 500, 2, 1), (32, 32, 250, 1, 1), (96, 96, 250, 2, 1), (144, 144, 125, 1, 1),
    (144, 144, 125, 2, 1), (192, 192, 63, 1, 2), (192, 192, 63, 2, 1), (384, 384, 32, 1, 4),
    (576, 576, 32, 1, 2), (576, 576, 32, 2, 1), (960, 960, 16, 1, 3),
]  # fmt: skip
# (TILE, WGRAD_TILE, WARPS, WGRAD_STAGES, DIVIDING_BLOCK): the default first; stages > 1
# pipeline the weight gradient's loop (cp.async on sm_90); a dividing block of 16 runs 144
# channels as 9 x 16 (with more pixels a program) instead of 3 x 64 with a quarter masked
CHOICES = [
    (1024, 512, 4, 1, 32), (2048, 512, 8, 1, 32), (2048, 1024, 8, 1, 32), (1024, 512, 8, 1, 32),
    (512, 512, 4, 1, 32), (1024, 512, 4, 3, 32), (1024, 512, 4, 1, 16),
]  # fmt: skip
SETTINGS = ("TILE", "WGRAD_TILE", "WARPS", "WGRAD_STAGES", "DIVIDING_BLOCK")


def use(choice: tuple[int, ...]) -> None:
    for name, value in zip(SETTINGS, choice, strict=True):
        setattr(dt, name, value)


def kernels(cin: int, cout: int, side: int, stride: int) -> dict[str, float]:
    """-> kernel ms of the forward, the input gradient and the weight gradient (the stem's input
    needs none), at the module's current TILE / WGRAD_TILE / WARPS."""
    x = torch.randn(BATCH, cin, side, side, device="cuda", dtype=torch.bfloat16)
    x = x.contiguous(memory_format=torch.channels_last)
    w = torch.randn(cout, 1, 3, 3, device="cuda")
    geometry = ([stride, stride], [1, 1], [1, 1])
    y = dt.depthwise_conv2d(x, w, None, *geometry)
    g = torch.randn_like(y)
    out = {"forward": time_ms(dt.depthwise_conv2d, x, w, None, *geometry)[1]}
    wgrad = time_ms(dt.depthwise_conv2d_backward, g, x, w, *geometry, False)[1]
    if cin > 1:
        both = time_ms(dt.depthwise_conv2d_backward, g, x, w, *geometry, True)[1]
        out["input_grad"] = both - wgrad
    out["weight_grad"] = wgrad
    return out


def cudnn_ms(cin: int, cout: int, side: int, stride: int) -> float:
    """cuDNN's forward + backward kernel ms (channels_last; the stem without an input gradient)."""
    x = torch.randn(BATCH, cin, side, side, device="cuda", dtype=torch.bfloat16)
    x = x.contiguous(memory_format=torch.channels_last).requires_grad_(cin > 1)
    w = torch.randn(cout, 1, 3, 3, device="cuda", dtype=torch.bfloat16, requires_grad=True)

    def run():
        y = F.conv2d(x, w, None, stride, 1, 1, cin)
        y.backward(torch.ones_like(y))

    return time_ms(run)[1]


def main() -> None:
    torch.backends.cudnn.benchmark = True
    rows = []
    for cin, cout, side, stride, count in LAYERS:
        row = {"in": cin, "out": cout, "side": side, "stride": stride, "layers": count}
        row["cudnn_ms"] = cudnn_ms(cin, cout, side, stride)
        for choice in CHOICES:
            use(choice)
            tag = "{}_{}_w{}_s{}_b{}".format(*choice)
            for kernel, ms in kernels(cin, cout, side, stride).items():
                row[f"{kernel}_{tag}_ms"] = ms
        use(CHOICES[0])
        rows.append(row)
        write(sys.argv[1], rows)  # after every layer: a call cut short keeps what it measured
        best = {}
        for kernel in ("forward", "input_grad", "weight_grad"):
            keys = [k for k in row if k.startswith(kernel)]
            if keys:
                k = min(keys, key=row.get)
                best[kernel] = (
                    f"{row[k]:.3f} ({k[len(kernel) + 1 : -3]}; default {row[keys[0]]:.3f})"
                )
        print(
            f"{cin:4d}->{cout:4d} {side:3d}px s{stride}  cuDNN {row['cudnn_ms']:.3f}",
            best,
            flush=True,
        )


def write(path: str, rows: list[dict]) -> None:
    env = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name()}
    with open(path, "w") as f:
        json.dump({"batch": BATCH, "choices": CHOICES, "env": env, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
