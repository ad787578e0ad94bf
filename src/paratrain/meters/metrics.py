"""What a run measures and reports: timers, peak memory, hardware facts, the progress bar and the
result JSON that the benchmark harness reads."""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import json
import math
import os
import platform
import re
import resource
import subprocess
import time
from pathlib import Path
from typing import Any

import torch


def sync(device: torch.device) -> None:
    """Device work is asynchronous: wait for it before reading a host clock."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def now(device: torch.device) -> float:
    sync(device)
    return time.perf_counter()


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_bytes(device: torch.device, split: dict | None = None) -> tuple[int, str]:
    """Peak device memory allocated by tensors (the largest of the GPUs a split model spans), or
    on the CPU the process's peak resident set."""
    if device.type == "cuda":
        devices = split["devices"] if split else [device]
        return max(torch.cuda.max_memory_allocated(d) for d in devices), "cuda_max_allocated"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "host_peak_rss"


def peak_reserved_bytes(device: torch.device, split: dict | None = None) -> int | None:
    """Peak GPU memory the caching allocator held (tensors plus the blocks it keeps: what
    nvidia-smi and an out-of-memory error see; `paratrain plan` forecasts this); None on the
    CPU."""
    if device.type != "cuda":
        return None
    devices = split["devices"] if split else [device]
    return max(torch.cuda.max_memory_reserved(d) for d in devices)


def memory_capacity_bytes(cuda: bool) -> float:
    """What one device holds: GPU 0's memory, or on the CPU the machine's RAM."""
    if cuda:
        return float(torch.cuda.get_device_properties(0).total_memory)
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def git_commit() -> str | None:
    # A declared commit wins: a copied working tree (a lent GPU machine) can carry a .git that
    # lags behind the code actually run.
    if os.environ.get("PARATRAIN_COMMIT"):
        return os.environ["PARATRAIN_COMMIT"]
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            cwd=Path(__file__).resolve().parent,
        )
        commit = out.stdout.strip() if out.returncode == 0 else None
        if commit:
            dirty = subprocess.run(
                ["git", "status", "--porcelain", "--untracked-files=no"],
                capture_output=True,
                text=True,
                timeout=5,
                cwd=Path(__file__).resolve().parent,
            ).stdout.strip()
            return commit + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return None


def _affinity() -> str | None:
    """'0-15,32-47': the CPU list this process may run on, in taskset's short form."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return None
    spans: list[list[int]] = []
    for c in cpus:
        if spans and c == spans[-1][1] + 1:
            spans[-1][1] = c
        else:
            spans.append([c, c])
    spans_text = [f"{a}-{b}" if b > a else str(a) for a, b in spans]
    return ",".join(spans_text)


def torchvision_version() -> str | None:
    """torchvision.__version__ (with its build tag, e.g. +cu130, as torch's is recorded) read
    from its version.py without importing the package (~1.5 s of CPU a process)."""
    spec = importlib.util.find_spec("torchvision")
    if spec is None or not spec.origin:
        return None
    path = Path(spec.origin).with_name("version.py")
    text = path.read_text() if path.is_file() else ""
    found = re.search(r"^__version__ = ['\"]([^'\"]+)", text, re.M)
    return found.group(1) if found else importlib.metadata.version("torchvision")


def hardware(device: torch.device, world_size: int) -> dict[str, Any]:
    info: dict[str, Any] = {
        "device_type": device.type,
        "world_size": world_size,
        "cpu_count": os.cpu_count(),
        # the cores this rank may run on: fewer than cpu_count under NUMA binding or taskset
        "cpu_affinity": _affinity(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
    }
    version = torchvision_version()
    if version:
        info["torchvision"] = version
    if device.type == "cuda":
        info["gpu_name"] = torch.cuda.get_device_name(device)
        info["gpu_count_visible"] = torch.cuda.device_count()
        info["cuda"] = torch.version.cuda
        info["cudnn"] = torch.backends.cudnn.version()
        with contextlib.suppress(Exception):  # not every build has NCCL
            info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        try:
            import pynvml

            pynvml.nvmlInit()
            info["driver"] = pynvml.nvmlSystemGetDriverVersion()
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 - telemetry is optional
            pass
    return info


def write_json(path: Path, payload: dict[str, Any]) -> None:
    """Strict JSON (what every parser reads): a NaN or infinite number becomes null, and the
    dotted names of those values are listed under "nonfinite"."""
    bad: list[str] = []
    clean = _finite(payload, "", bad)
    if bad:
        clean["nonfinite"] = bad
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(clean, indent=2, default=str, allow_nan=False) + "\n")
    os.replace(tmp, path)


def _finite(value: Any, name: str, bad: list[str]) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        bad.append(name)
        return None
    if isinstance(value, dict):
        return {k: _finite(v, f"{name}.{k}" if name else str(k), bad) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v, f"{name}[{i}]", bad) for i, v in enumerate(value)]
    return value


WIDE = 10_000
"""A console's width when its output is no terminal: rich would wrap lines at 80 columns."""


def console(**kwargs):
    """A rich Console for paratrain's printed lines and tables: a terminal's own width, else
    (a log file, a pipe, `| tee`) lines left whole, each table as wide as its cells."""
    from rich.console import Console

    out = Console(**kwargs)
    if out.is_terminal:
        return out
    return Console(width=WIDE, soft_wrap=True, **kwargs)


class Progress:
    """Rank 0's bar: steps, unique samples/s, loss and ETA (rich). Others get a no-op."""

    def __init__(self, enabled: bool, total_steps: int, description: str):
        self._bar = None
        if not enabled:
            return
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )
        from rich.progress import (
            Progress as RichProgress,
        )

        self._bar = RichProgress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]}"),
            TextColumn("loss {task.fields[loss]}"),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=console(),  # its lines above it (the epochs') whole in a log file
        )
        self._task = self._bar.add_task(description, total=total_steps, rate="", loss="-")
        self._bar.start()

    def update(
        self, completed: int, samples_per_s: float | None = None, loss: float | None = None
    ) -> None:
        if self._bar is None:
            return
        fields = {}
        if samples_per_s is not None:
            fields["rate"] = f"{samples_per_s:,.0f} samples/s"
        if loss is not None:
            fields["loss"] = f"{loss:.4f}"
        self._bar.update(self._task, completed=completed, **fields)

    def print(self, message: str) -> None:
        """A line above the bar (or plain output when there is no bar)."""
        if self._bar is not None:
            self._bar.console.print(message, highlight=False)
        else:
            print(message, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


# Dense bf16/fp16 tensor-core peaks (vendor datasheets, without sparsity), in FLOP/s.
PEAK_FLOPS = {
    "H200": 989e12,
    "H100": 989e12,
    "A100": 312e12,
    "L40S": 362e12,
    "A10G": 125e12,
    "RTX 4090": 165e12,
}


# Dense FP8 tensor-core peak over the bf16 one: 2x on Hopper and Ada; none before.
FP8_PEAK_FACTOR = {"H200": 2, "H100": 2, "L40S": 2, "RTX 4090": 2}


def peak_fp8_flops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    factor = next((v for k, v in FP8_PEAK_FACTOR.items() if k in name), None)
    bf16 = peak_flops(device)
    return bf16 * factor if bf16 and factor else None


def peak_flops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, value in PEAK_FLOPS.items():
        if key in name:
            return value
    return None
