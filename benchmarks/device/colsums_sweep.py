"""The Triton BatchNorm's column sums (models/batchnorm_triton.py, _col_sums: its statistics
in the forward, its two gradient sums in the backward) on each distinct MobileNetV2 BatchNorm
input (500x500, batch 64, bf16, channels_last), for several grids, loop unrollings, block
heights and warps: the GPU's kernel time (layer_timing.py) and the bandwidth it implies. On
2026-12-03 (call 25's profile) these kernels moved their bytes at about 2.7 TB/s against 4.1
for the elementwise _affine pass; this says which choice reads fastest, layer by layer and over
the whole step, for the COL_SUMS_* defaults. "default" is the code's own rule (programs by the
layer's size).

    python benchmarks/device/colsums_sweep.py OUT.json   (on a GPU; prints a table too)
"""

from __future__ import annotations

import json
import sys

import torch
from batchnorm_layers import layer_inputs
from layer_timing import time_ms

from paratrain.models.batchnorm_triton import RELU6, _column_sums, _rows

# (programs per lane block, blocks a turn, wide rows a block, warps a program, pipeline stages);
# 0: the default. Calls 21 and 26 timed grids and unrollings at 16 rows, 4 warps, no pipelining;
# these add taller blocks, 8 warps and Triton's software pipelining of the loop's loads (cp.async
# into shared memory on sm_90: one turn's bytes in flight while the previous turn's are summed)
CHOICES = [
    (0, 0, 0, 0, 0), (264, 4, 0, 0, 0), (1024, 2, 0, 0, 0), (0, 0, 0, 8, 0), (0, 0, 32, 8, 0),
    (0, 2, 32, 8, 0), (264, 2, 32, 8, 0), (132, 4, 32, 8, 0), (0, 0, 8, 4, 0), (0, 1, 0, 0, 3),
    (0, 2, 0, 0, 3), (0, 1, 0, 0, 4), (0, 1, 32, 8, 3),
]  # fmt: skip


def label(programs: int, unroll: int, rows: int, warps: int, stages: int) -> str:
    if not any((programs, unroll, rows, warps, stages)):
        return "default"
    parts = (programs or "d", unroll or "d", rows or "d", warps or "d", stages or "d")
    return "{}x{}r{}w{}s{}".format(*parts)


def main() -> None:
    rows = []
    for c, _, shape, count in layer_inputs():
        x = torch.randn(shape, device="cuda", dtype=torch.bfloat16) * 2 + 1
        x2 = _rows(x.contiguous(memory_format=torch.channels_last))
        g2 = torch.randn_like(x2)
        stats = (
            torch.rand(c, device="cuda") + 0.5,
            torch.randn(c, device="cuda"),
            x2.float().mean(0),
            torch.rand(c, device="cuda") + 0.5,
        )
        for grad in (False, True):
            nbytes = x2.numel() * x2.element_size() * (2 if grad else 1)
            row = {"channels": c, "side": shape[-1], "layers": count, "grad": grad}
            row["bytes"] = nbytes
            for choice in CHOICES:
                args = (x2, g2, stats) if grad else (x2, None, None)
                _, kernels = time_ms(_column_sums, *args, RELU6, *choice)
                row[f"{label(*choice)}_ms"] = kernels
            rows.append(row)
            write(sys.argv[1], rows)  # after every layer: a call cut short keeps what it measured
            best = min((k for k in row if k.endswith("_ms")), key=row.get)
            tbs = {
                k: round(nbytes / row[k] / 1e9, 2) if row[k] else None
                for k in row
                if k.endswith("_ms")
            }
            print(
                f"{c:5d} ch {shape[-1]:4d}px x{count:2d} {'grad ' if grad else 'stats'}  TB/s "
                + " ".join(f"{k[:-3]} {v}" for k, v in tbs.items())
                + f"  best {best[:-3]}",
                flush=True,
            )
    keys = [k for k in rows[0] if k.endswith("_ms")]
    total = {k: round(sum(r[k] * r["layers"] for r in rows), 3) for k in keys}
    print("all layers, kernel ms per step (forward + backward sums):", total)


def write(path: str, rows: list[dict]) -> None:
    env = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name()}
    with open(path, "w") as f:
        json.dump({"choices": CHOICES, "env": env, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
