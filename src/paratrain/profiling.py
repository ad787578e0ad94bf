"""Where a training step's time goes: torch.profiler over a few steps right after warm-up.

The profiled steps are left out of the throughput measurement (profiling slows them), which
starts after them. Rank 0 writes the operator table (by self device time on GPUs, self CPU time
on the CPU) to <output_dir>/profile.txt; result.json keeps the top operators per step.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

TOP = 15


class StepProfiler:
    def __init__(self, device: torch.device, steps: int, out_dir: Path, is_main: bool):
        self.device, self.steps, self.out_dir, self.is_main = device, steps, out_dir, is_main
        self._prof: profile | None = None
        self.summary: list[dict] | None = None

    def start(self) -> None:
        if self.steps <= 0 or self._prof is not None:
            return
        activities = [ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
        self._prof = profile(activities=activities)
        self._prof.__enter__()

    def stop(self) -> None:
        if self._prof is None:
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self._prof.__exit__(None, None, None)
        gpu = self.device.type == "cuda"
        key = "self_device_time_total" if gpu else "self_cpu_time_total"
        events = sorted(self._prof.key_averages(), key=lambda e: getattr(e, key), reverse=True)
        total = sum(getattr(e, key) for e in events) or 1.0
        self.summary = [
            {
                "name": e.key,
                "ms_per_step": getattr(e, key) / 1000.0 / self.steps,
                "share": getattr(e, key) / total,
                "calls_per_step": e.count / self.steps,
            }
            for e in events[:TOP]
        ]
        if self.is_main:
            table = self._prof.key_averages().table(sort_by=key, row_limit=40)
            clock = "self device (GPU) time" if gpu else "self CPU time"
            (self.out_dir / "profile.txt").write_text(
                f"torch.profiler over {self.steps} steps after warm-up, sorted by {clock}\n\n"
                + table
            )
        self._prof = None
