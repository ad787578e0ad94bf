"""The Triton BatchNorm's column sums (models/batchnorm_triton.py, _col_sums: its statistics
in the forward, its two gradient sums in the backward) on each distinct MobileNetV2 BatchNorm
input (500x500, batch 64, bf16, channels_last), for several grids and loop unrollings: the
GPU's kernel time (layer_timing.py) and the bandwidth it implies. On 2026-12-03 (call 19's
profile) these kernels moved their bytes at about 1.7 TB/s against 3.8 for the elementwise
_affine pass; this says which (programs, blocks a turn) reads fastest, layer by layer and over
the whole step, for COL_SUMS_PROGRAMS / COL_SUMS_UNROLL.

    python benchmarks/device/colsums_sweep.py OUT.json   (on a GPU; prints a table too)
"""

from __future__ import annotations

import json
import sys

import torch
from batchnorm_layers import layer_inputs
from layer_timing import time_ms

from paratrain.models.batchnorm_triton import RELU6, _column_sums, _rows

# (programs per channel block, blocks a turn): the default first
CHOICES = [(1024, 1), (528, 1), (2048, 1), (1024, 2), (528, 2), (264, 4), (528, 4), (1024, 4)]


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
            for programs, unroll in CHOICES:
                args = (x2, g2, stats) if grad else (x2, None, None)
                _, kernels = time_ms(_column_sums, *args, RELU6, programs, unroll)
                row[f"{programs}x{unroll}_ms"] = kernels
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
