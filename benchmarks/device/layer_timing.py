"""How the per-layer benchmarks (depthwise_layers.py, batchnorm_layers.py) time one layer's
forward + backward on a GPU, two ways:

- the wall time of a loop of calls between two CUDA events: for small layers this is the host
  launching kernels (2026-12-03, call 17: every Triton BatchNorm layer at 1.6-2.2 ms, however
  small), which the training step does not pay under CUDA graphs;
- the GPU's kernel time (CUPTI's kernel durations summed, as the run profile's "GPU kernel time"):
  what the layer costs inside a CUDA-graphed step.
"""

from __future__ import annotations

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile


def time_ms(fn, *args, iters: int = 20) -> tuple[float, float]:
    """-> (wall ms a call, kernel ms a call) of fn(*args), after 3 warm-up calls."""
    for _ in range(3):
        fn(*args)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn(*args)
    end.record()
    torch.cuda.synchronize()
    wall = start.elapsed_time(end) / iters
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn(*args)
        torch.cuda.synchronize()
    kernels_us = sum(
        e.self_device_time_total
        for e in prof.key_averages()
        # a record_function range shows on the GPU timeline as an annotation over its kernels
        if e.device_type == DeviceType.CUDA and not getattr(e, "is_user_annotation", False)
    )
    return wall, kernels_us / 1000.0 / iters


def fwd_bwd(module):
    """One training pass of a layer under bf16 autocast: forward, then backward from the given
    output gradient (grad None: ones)."""

    def run(x, grad=None):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = module(x)
        out.backward(torch.ones_like(out) if grad is None else grad)

    return run
