"""Each depthwise layer of MobileNetV2 (500x500 input, batch 64, bf16 autocast) timed alone,
forward + backward: cuDNN channels_last, cuDNN NCHW, paratrain's shift-add compiled and its Triton
kernels (model.depthwise_conv=triton).

    python benchmarks/device/depthwise_layers.py OUT.json   (on a GPU; prints a table too)
"""

from __future__ import annotations

import json
import sys

import torch
from layer_timing import fwd_bwd, time_ms  # this folder's (the script's dir is on sys.path)
from torch import nn

from paratrain.models.depthwise import ShiftAddDepthwise, is_depthwise
from paratrain.models.depthwise_triton import TritonDepthwise
from paratrain.models.vision import build_mobilenet_v2

BATCH, SIDE, ITERS = 64, 500, 20


def layer_inputs() -> list[tuple[nn.Conv2d, tuple[int, ...]]]:
    """(conv, input shape) of every depthwise layer, found with forward hooks at full size."""
    model = build_mobilenet_v2(10, in_channels=1).eval()
    found = []
    hooks = [
        m.register_forward_hook(lambda m, i, o: found.append((m, tuple(i[0].shape))))
        for m in model.modules()
        if is_depthwise(m)
    ]
    with torch.no_grad():
        model(torch.zeros(1, 1, SIDE, SIDE))
    for h in hooks:
        h.remove()
    return [(m, (BATCH, *shape[1:])) for m, shape in found]


def main() -> None:
    # one compiled module a layer: past dynamo's default 8 recompiles of one frame, the later
    # layers would silently run eagerly
    torch._dynamo.config.recompile_limit = 64
    torch.backends.cudnn.benchmark = True
    rows = []
    for conv, shape in layer_inputs():
        conv = conv.cuda()
        x_nhwc = torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        x_nhwc = x_nhwc.detach().contiguous(memory_format=torch.channels_last).requires_grad_()
        x_nchw = x_nhwc.detach().contiguous().requires_grad_()
        nhwc = conv.to(memory_format=torch.channels_last)
        compiled = torch.compile(ShiftAddDepthwise(conv), dynamic=False)  # one shape each
        row = {"channels": conv.in_channels, "stride": conv.stride[0], "input_side": shape[-1]}
        forms = [
            ("cudnn_nhwc", nhwc, x_nhwc),
            ("cudnn_nchw", conv.to(memory_format=torch.contiguous_format), x_nchw),
            ("shift_add_compiled", compiled, x_nhwc),
            ("triton", TritonDepthwise(nhwc), x_nhwc),
        ]
        for name, module, x in forms:
            row[f"{name}_ms"], row[f"{name}_kernel_ms"] = time_ms(fwd_bwd(module), x, iters=ITERS)
        rows.append(row)
        write(sys.argv[1], rows)  # after every layer: a call cut short keeps what it measured
        print(
            f"{row['channels']:5d} ch s{row['stride']} {row['input_side']:4d}px  kernels"
            + "".join(f"  {n} {row[n + '_kernel_ms']:6.3f}" for n, _, _ in forms)
            + " ms; wall"
            + "".join(f" {row[n + '_ms']:.3f}" for n, _, _ in forms),
            flush=True,
        )
    total = {k: round(sum(r[k] for r in rows), 3) for k in rows[0] if k.endswith("_ms")}
    print(f"all {len(rows)} layers, ms per step:", total)


def write(path: str, rows: list[dict]) -> None:
    env = {"torch": torch.__version__, "cudnn": torch.backends.cudnn.version()}
    env["gpu"] = torch.cuda.get_device_name()
    payload = {"batch": BATCH, "side": SIDE, "iters": ITERS, "env": env, "layers": rows}
    with open(path, "w") as f:
        json.dump(payload, f, indent=1)


if __name__ == "__main__":
    main()
