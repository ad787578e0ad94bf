"""Issue 52: calibrate the analytic plan's hardware profile on a lent GPU, then compare it with
paratrain's 1-GPU runs made in the same call.

  measure OUT   one training step's kinds of work at the Llama 3.1 8B shape, each alone, held long
                enough to reach the power limit: the 8B layer's bf16 matmuls (forward, input and
                weight gradients at 2 x 8,192 tokens), the same in float8 (torch._scaled_mm,
                tensorwise scales), flash attention forward + backward (head dim 128 at 2 x 8,192;
                head dim 64 at 8 x 2,048), and a device copy. Writes OUT/measured.toml (this GPU's
                datasheet from the shipped profile it matches, the measured derates with their
                numbers) and OUT/measured-500w.toml (the same derates on torchtitan's 500 W
                HBM2e H100, for `paratrain plan --validate torchtitan-h100 --hardware ...`).
  compare OUT RUN...   each run's result.json (a 1-GPU paratrain run of a recipe whose shape the
                plan knows) beside the analytic prediction from OUT/measured.toml: rows_1gpu.md.

    python3 benchmarks/device/work_kinds_calibrate.py measure $OUT      # on the GPU
    python3 benchmarks/device/work_kinds_calibrate.py measure /tmp/x --small   # CPU check of the code
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from paratrain.forecast import shapes
from paratrain.forecast.analytic import hardware
from paratrain.forecast.analytic.step import Cut, Training, predict  # noqa: E402

PEAKS = {"H200": "h200", "H100": "h100-sxm", "A100": "a100-sxm"}


def timed(fn, seconds: float, device: str) -> float:
    """Seconds of one call, from a run held for `seconds` (the clocks settle at the power
    limit): CUDA events over the last half."""
    fn()
    if device != "cuda":
        t = time.perf_counter()
        fn()
        return time.perf_counter() - t
    torch.cuda.synchronize()
    start, n = time.perf_counter(), 0
    while time.perf_counter() - start < seconds / 2:
        fn()
        n += 1
        torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(max(n, 1)):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / 1000 / max(n, 1)


def matmuls(shape, tokens: int, device: str, float8: bool):
    """One decoder layer's training matmuls: per linear (in, out): forward X W^T, the input's
    gradient dY W, the weight's gradient dY^T X. -> (callable, FLOPs)."""
    dt = torch.bfloat16
    jobs, flops = [], 0
    one = torch.ones((), device=device)  # tensorwise scales
    for i, o in shape.linears().values():
        x = torch.randn(tokens, i, device=device, dtype=dt)
        w = torch.randn(o, i, device=device, dtype=dt)
        dy = torch.randn(tokens, o, device=device, dtype=dt)
        flops += 3 * 2 * tokens * i * o
        if float8:
            f8 = torch.float8_e4m3fn
            x8, w8, dy8 = x.to(f8), w.to(f8), dy.to(f8)
            xt8 = x.t().contiguous().to(f8)
            dyt8 = dy.t().contiguous().to(f8)
            wt8 = w.t().contiguous().to(f8)
            jobs += [
                lambda a=x8, b=w8: torch._scaled_mm(a, b.t(), one, one, out_dtype=dt),
                lambda a=dy8, b=wt8: torch._scaled_mm(a, b.t(), one, one, out_dtype=dt),
                lambda a=dyt8, b=xt8: torch._scaled_mm(a, b.t(), one, one, out_dtype=dt),
            ]
        else:
            jobs += [
                lambda a=x, b=w: a @ b.t(),
                lambda a=dy, b=w: a @ b,
                lambda a=dy, b=x: a.t() @ b,
            ]

    def run():
        for j in jobs:
            j()

    return run, flops


def attention(batch: int, heads: int, seq: int, dim: int, device: str):
    """Flash attention's forward + backward (causal) -> (callable, FLOPs: 2 s^2 d a head forward
    for QK^T and PV, half of it under the mask, 2.5x that backward)."""
    q, k, v = (
        torch.randn(batch, heads, seq, dim, device=device, dtype=torch.bfloat16, requires_grad=True)
        for _ in range(3)
    )
    backend = None
    if device == "cuda":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backend = SDPBackend.FLASH_ATTENTION

    def run():
        ctx = sdpa_kernel(backend) if backend is not None else _null()
        with ctx:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out.sum().backward()

    forward = 2 * 2 * batch * heads * seq * seq * dim / 2
    return run, forward * 3.5


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def measure(out: Path, small: bool) -> None:
    device = "cuda" if torch.cuda.is_available() and not small else "cpu"
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    base = next((p for k, p in PEAKS.items() if k in name), "h100-sxm")
    hw = hardware.load(base)
    shape = shapes.shape("llama3.1-8b" if not small else "tiny")
    hold = 20.0 if not small else 0.0
    tokens = 2 * 8192 if not small else 256
    found, sources = {}, {}
    when = time.strftime("%Y-%m-%d")
    fn, flops = matmuls(shape, tokens, device, False)
    rate = flops / timed(fn, hold, device)
    found["matmul"] = rate / (hw.bf16_tflops * 1e12)
    sources["matmul"] = (
        f"measured on {name} {when} (analytic_plan_calibration.sh): {rate / 1e12:,.0f} TFLOP/s"
    )
    if device == "cuda" and hw.fp8_tflops:
        try:
            fn, flops = matmuls(shape, tokens, device, True)
            rate = flops / timed(fn, hold, device)
            found["matmul_fp8"] = rate / (hw.fp8_tflops * 1e12)
            sources["matmul_fp8"] = f"measured on {name} {when}: {rate / 1e12:,.0f} TFLOP/s"
        except (RuntimeError, TypeError) as e:  # the profile's figure stays; say why
            print(f"float8 matmuls not measured: {str(e).splitlines()[0]}", flush=True)
    for key, (b, h, s, d) in {
        "attention_hd128": (2, 32, 8192, 128) if not small else (1, 2, 64, 32),
        "attention_hd64": (8, 32, 2048, 64) if not small else (1, 2, 64, 16),
    }.items():
        fn, flops = attention(b, h, s, d, device)
        rate = flops / timed(fn, hold / 2, device)
        found[key] = rate / (hw.bf16_tflops * 1e12)
        sources[key] = f"measured on {name} {when}: flash, {rate / 1e12:,.0f} TFLOP/s"
    n = (4 << 30 if not small else 1 << 20) // 2
    src = torch.empty(n, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    bw = 2 * src.numel() * 2 / timed(lambda: dst.copy_(src), hold / 4, device)
    found["memory"] = bw / (hw.memory_tbps * 1e12)
    sources["memory"] = f"measured on {name} {when}: a copy at {bw / 1e9:,.0f} GB/s"
    out.mkdir(parents=True, exist_ok=True)
    text = (hardware.PROFILES / f"{base}.toml").read_text()
    (out / "measured.toml").write_text(_with(text, found, sources, f"measured-{base}"))
    slow = (hardware.PROFILES / "h100-hbm2e-500w.toml").read_text()
    if base not in ("h100-sxm", "h200"):  # the GH100 die's rates carry to the 500 W H100
        found = {k: v for k, v in found.items() if k in ("memory",)}
    (out / "measured-500w.toml").write_text(_with(slow, found, sources, "measured-500w"))
    (out / "measured.json").write_text(json.dumps({"gpu": name, "derates": found}, indent=1))
    print(json.dumps({"gpu": name, "profile": base, "derates": found}, indent=1))


def _with(text: str, found: dict, sources: dict, name: str) -> str:
    """A profile's text with its derates (and their sources) replaced by the measured ones."""
    lines = []
    for line in text.splitlines():
        key = line.split("=")[0].strip()
        if line.startswith("name ="):
            line = f'name = "{name}"'
        elif key in found and not line.startswith(f'{key} = "'):
            line = f"{key} = {found[key]:.6g}"
        elif key in sources and line.startswith(f'{key} = "'):
            line = f"{key} = {json.dumps(sources[key])}"
        lines.append(line)
    return "\n".join(lines) + "\n"


# a run's recipe -> the analytic step it is (shape, sequence, batch, AC, options)
RECIPES = {
    "llama3.2_1b_full_random": (
        "llama3.2-1b",
        Training(2048, 8, "none", compile=True, loss="fused", fused_optimizer=True),
    ),
    # its loss is WholeLoss, compiled in place with the decoder (models/causal_lm/loss.py)
    "llama3_8b_lora_random": (
        "llama3-8b",
        Training(2048, 2, "none", compile=True, lora=True, loss="compiled"),
    ),
}


def compare(out: Path, runs: list[str]) -> None:
    hw = hardware.load(str(out / "measured.toml"))
    rows = [
        "| recipe | measured tokens/s | predicted | error | measured GiB | predicted | error |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for run in runs:
        result = json.loads((Path(run) / "result.json").read_text())
        recipe = Path(run).name.split("-")[0]
        if recipe not in RECIPES:
            continue
        shape, train = RECIPES[recipe]
        p = predict(shapes.shape(shape), hw, Cut(1), train)
        s = result["summary"]
        tps, gib = s["tokens_per_s"], s["peak_memory_bytes"] / 2**30
        rows.append(
            f"| {recipe} | {tps:,.0f} | {p['tps_per_gpu']:,.0f} | {p['tps_per_gpu'] / tps - 1:+.1%} "
            f"| {gib:.1f} | {p['memory_gib']:.1f} | {p['memory_gib'] / gib - 1:+.1%} |"
        )
    (out / "rows_1gpu.md").write_text("\n".join(rows) + "\n")
    print("\n".join(rows))


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["measure", "compare"])
    ap.add_argument("out")
    ap.add_argument("runs", nargs="*")
    ap.add_argument("--small", action="store_true")
    a = ap.parse_args()
    if a.what == "measure":
        measure(Path(a.out), a.small)
    else:
        compare(Path(a.out), a.runs)
