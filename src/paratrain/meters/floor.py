"""The floor under a training step: the matmuls and the attention one step must do (the
model's own shapes at the run's batch, Workload.floor), each timed alone on this device in the
run's compute dtype. A step cannot run faster than its matmuls at the rate the math library
gives them here, so step / floor says how much of the step is everything else (memory-bound
kernels, the loss, the optimizer, launch gaps, syncs). `train.floor` asks for it at the end of a
run; benchmarks/device/matmul_bound.py measured the same by hand for issue 34.

Each distinct shape is timed once and counted as often as the step runs it: CUDA events around
a few repeats after a warm-up on a GPU, the wall clock on the CPU. Attention is sdpa's forward
and backward, causal, with the run's sdpa kernel order; key-value heads shared by enable_gqa.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import replace

import torch
import torch.nn.functional as F

from paratrain.protocols import Attention, Matmul

REPEATS = 5


def _seconds(fn: Callable[[], object], device: torch.device, repeats: int = REPEATS) -> float:
    """The median of `repeats` timings of fn() after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            began = time.perf_counter()
            fn()
            times.append(time.perf_counter() - began)
    return statistics.median(times)


def matmul_s(w: Matmul, device: torch.device, dtype: torch.dtype) -> float:
    a = torch.randn(w.m, w.k, device=device, dtype=dtype)
    b = torch.randn(w.k, w.n, device=device, dtype=dtype)
    return _seconds(lambda: a @ b, device)


def attention_s(w: Attention, device: torch.device, dtype: torch.dtype) -> float:
    """Forward and backward of causal sdpa at this shape."""

    def tensor(heads: int) -> torch.Tensor:
        shape = (w.batch, heads, w.seq, w.head_dim)
        return torch.randn(shape, device=device, dtype=dtype, requires_grad=True)

    q, k, v = tensor(w.heads), tensor(w.kv_heads), tensor(w.kv_heads)
    grad = torch.randn(w.batch, w.heads, w.seq, w.head_dim, device=device, dtype=dtype)
    gqa = w.kv_heads != w.heads

    def step() -> None:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        out.backward(grad)

    return _seconds(step, device)


def floor(
    work: Iterable[Matmul | Attention], device: torch.device, dtype: torch.dtype
) -> dict[str, float]:
    """Seconds a step of its matmuls and of its attention, each timed alone here."""
    timed: dict[Matmul | Attention, float] = {}
    totals = {"matmul_s": 0.0, "attention_s": 0.0}
    for w in work:
        key = replace(w, count=1)  # a shape's time, whatever its count
        if key not in timed:
            run = matmul_s if isinstance(w, Matmul) else attention_s
            timed[key] = run(key, device, dtype)
        totals["matmul_s" if isinstance(w, Matmul) else "attention_s"] += timed[key] * w.count
    return {**totals, "floor_s": totals["matmul_s"] + totals["attention_s"]}


def words(found: dict) -> str:
    """The summary's line: the floor, its parts, and how far above it the step is (a
    summary.floor: floor_s, matmul_s, attention_s, dtype, step_s, above)."""
    step_s, above = found["step_s"], found["above"]
    above = float("nan") if above is None else above
    return (
        f"floor {found['floor_s'] * 1e3:,.1f} ms a step (matmuls {found['matmul_s'] * 1e3:,.1f} "
        f"+ attention {found['attention_s'] * 1e3:,.1f} ms, {found['dtype']}, timed alone here); "
        f"the step {step_s * 1e3:,.1f} ms, {above:+.1%} above it"
    )
