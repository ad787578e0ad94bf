"""Each distinct BatchNorm layer of MobileNetV2 (500x500 input, batch 64, bf16, channels_last)
timed alone in training, forward + backward, with the ReLU6 after it where there is one:
PyTorch eager (cuDNN), torch.compile of the same (inductor's kernels, what the fastest recipe
runs today), and paratrain's Triton kernels (model.batchnorm=triton). Also the bytes each pass
must move at least (forward: x read twice, y written; backward: x and dy read twice, dx
written) and the bandwidth that implies.

    python benchmarks/device/batchnorm_layers.py OUT.json   (on a GPU; prints a table too)
"""

from __future__ import annotations

import copy
import json
import sys

import torch
from layer_timing import fwd_bwd, time_ms  # this folder's (the script's dir is on sys.path)
from torch import nn

from paratrain.models.batchnorm_triton import RELU6, TritonBatchNorm
from paratrain.models.vision import build_mobilenet_v2

BATCH, SIDE, ITERS = 64, 500, 20


def layer_inputs() -> list[tuple[int, bool, tuple[int, ...], int]]:
    """(channels, followed by ReLU6, input shape, how many layers) of each distinct layer."""
    model = build_mobilenet_v2(10, in_channels=1).eval()
    seen: dict[tuple, int] = {}
    hooks = []
    for seq in model.modules():
        if not isinstance(seq, nn.Sequential):
            continue
        kids = list(seq.children())
        for bn, nxt in zip(kids, [*kids[1:], None], strict=True):
            if isinstance(bn, nn.BatchNorm2d):
                relu6 = isinstance(nxt, nn.ReLU6)

                def hook(m, i, o, relu6=relu6):
                    key = (m.num_features, relu6, (BATCH, *i[0].shape[1:]))
                    seen[key] = seen.get(key, 0) + 1

                hooks.append(bn.register_forward_hook(hook))
    with torch.no_grad():
        model(torch.zeros(1, 1, SIDE, SIDE))
    for h in hooks:
        h.remove()
    return [(c, relu6, shape, count) for (c, relu6, shape), count in seen.items()]


def main() -> None:
    # one compiled module a layer: past dynamo's default 8 recompiles of one frame, the later
    # layers would silently run eagerly
    torch._dynamo.config.recompile_limit = 64
    rows = []
    for c, relu6, shape, count in layer_inputs():
        bn = nn.BatchNorm2d(c).cuda()
        native = nn.Sequential(copy.deepcopy(bn), nn.ReLU6() if relu6 else nn.Identity())
        compiled = torch.compile(copy.deepcopy(native), dynamic=False)
        mine = TritonBatchNorm(copy.deepcopy(bn), RELU6 if relu6 else 0)
        x = torch.randn(shape, device="cuda", dtype=torch.bfloat16) * 2 + 1
        x = x.contiguous(memory_format=torch.channels_last).requires_grad_()
        grad = torch.randn_like(x)
        nbytes = x.numel() * 2
        least = 3 * nbytes + 5 * nbytes  # forward 2 reads + 1 write; backward 4 reads + 1 write
        row = {"channels": c, "relu6": relu6, "side": shape[-1], "layers": count}
        for name, module in [("eager", native), ("compiled", compiled), ("triton", mine)]:
            wall, kernels = time_ms(fwd_bwd(module), x, grad, iters=ITERS)
            row[f"{name}_ms"], row[f"{name}_kernel_ms"] = wall, kernels
            # the bandwidth the GPU's kernel time implies (least bytes / kernel time)
            row[f"{name}_kernel_tb_per_s"] = round(least / kernels / 1e9, 2) if kernels else None
        row["least_bytes"] = least
        rows.append(row)
        write(sys.argv[1], rows)  # after every layer: a call cut short keeps what it measured
        print(
            f"{c:5d} ch {'relu6' if relu6 else 'none ':5s} {shape[-1]:4d}px x{count:2d}  kernels"
            + "".join(
                f"  {n} {row[n + '_kernel_ms']:6.3f} ({row[n + '_kernel_tb_per_s']} TB/s)"
                for n in ("eager", "compiled", "triton")
            )
            + f" ms; wall {row['eager_ms']:.3f} / {row['compiled_ms']:.3f} / {row['triton_ms']:.3f}",
            flush=True,
        )
    total = {
        k: round(sum(r[k] * r["layers"] for r in rows), 3) for k in rows[0] if k.endswith("_ms")
    }
    print(f"all {sum(r['layers'] for r in rows)} layers, ms per step:", total)


def write(path: str, rows: list[dict]) -> None:
    env = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name()}
    payload = {"batch": BATCH, "side": SIDE, "iters": ITERS, "env": env, "layers": rows}
    with open(path, "w") as f:
        json.dump(payload, f, indent=1)


if __name__ == "__main__":
    main()
