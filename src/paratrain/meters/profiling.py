"""Where a training step's time goes: torch.profiler over a few steps right after warm-up.

The profiled steps are left out of the throughput measurement (profiling slows them), which
starts after them. Rank 0 writes to <output_dir>:
- profile.txt: the wall time per step; on GPUs the kernel time per step, how busy that kept the
  GPU, and the kernel time by kind (matmuls, attention, the loss, the optimizer, cuDNN
  convolutions, Triton kernels inductor generated, eager ATen kernels, copies) and where the host waited for the GPU in those
  steps (syncs.py: torch's sync debug mode, by the line that synced); then the operator table
  (by self device time on GPUs, self CPU time on the CPU);
- trace.json.gz: the timeline, for chrome://tracing or ui.perfetto.dev.
result.json keeps the top operators per step.
"""

from __future__ import annotations

import bisect
import contextlib
import gzip
import shutil
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from paratrain.meters.syncs import SyncSites

TOP = 15

# (kind, name fragments): the first kind whose fragment a kernel's name holds (lower case).
KINDS = (
    # before Triton's: inductor names a compiled loss's kernels triton_..._log_softmax_...;
    # paratrain's Triton loss is _loss_and_gradient, Liger's liger_cross_entropy_kernel
    (
        "loss (cross-entropy)",
        ("_loss_and_gradient", "log_softmax", "logsoftmax", "nll_loss", "cross_entropy"),
    ),
    ("Triton, inductor-generated", ("triton_",)),
    # _adamw_master: paratrain's master-weight AdamW (optim/master_adamw_triton.py)
    ("optimizer (foreach / fused)", ("multi_tensor_apply", "fused_adam", "fused_sgd", "_adamw")),
    # before convolution: cuDNN's attention kernels hold "cudnn" and "fprop" in their names
    # (cudnn_generated_fort_native_sdpa_sm90_flash_fprop..., cudnn::fusion::fmha_reduce_head)
    ("attention", ("flash", "fmha", "attention", "sdpa", "cudnn::fusion")),
    (
        "convolution (cuDNN / ATen conv)",
        ("fprop", "dgrad", "wgrad", "conv", "cudnn", "depthwise", "nhwc", "nchw"),
    ),
    ("matmul (cuBLAS / CUTLASS)", ("gemm", "cutlass", "cublas", "sm90_xmma", "nvjet")),
    ("NCCL collectives", ("nccl",)),
    ("copies and fills", ("memcpy", "memset", "copy_kernel", "fill_kernel")),
    ("eager ATen kernels", ("at::native", "elementwise", "reduce_kernel", "vectorized")),
)


PREFIX = "paratrain."
# The step's phases, in order: each a torch.profiler range (and an NVTX range on GPUs, so
# `nsys profile` shows them too): the loader's wait, forward + loss, backward (DDP's all-reduce
# and FSDP's reduce-scatter overlap it), the finite-gradient check, the optimizer step.
PHASES = ("data", "forward", "backward", "checks", "optimizer")


@contextlib.contextmanager
def phase(name: str, cuda: bool) -> Iterator[None]:
    """One phase of the step; costs a few microseconds when nothing profiles."""
    with torch.profiler.record_function(PREFIX + name):
        if cuda:
            torch.cuda.nvtx.range_push(PREFIX + name)
        try:
            yield
        finally:
            if cuda:
                torch.cuda.nvtx.range_pop()


def phase_times(events, steps: int, wall_ms: float, gpu: bool) -> dict:
    """ms per step of each phase: its CPU span, and on GPUs the time of the kernels it launched.

    `events` are the profiler's events (prof.events()). A kernel belongs to the phase whose CPU
    range was open when the operator that launched it started: the backward's kernels come
    from autograd's own thread, still inside the main thread's backward range. (The ranges' own
    annotations on the GPU timeline are not used: on torch 2.11 forward and backward read as
    ~0 ms there, their kernels credited to inner annotations such as DDP's.) "other" is the
    wall time no phase covers."""
    ranges: list[tuple[float, float, str]] = []
    for e in events:
        if e.name.startswith(PREFIX) and e.device_type == DeviceType.CPU:
            ranges.append((e.time_range.start, e.time_range.end, e.name[len(PREFIX) :]))
    ranges.sort()
    starts = [r[0] for r in ranges]
    cpu_us: dict[str, float] = defaultdict(float)
    gpu_us: dict[str, float] = defaultdict(float)
    for lo, hi, name in ranges:
        cpu_us[name] += hi - lo
    if gpu:
        for e in events:
            if not e.kernels or e.name.startswith(PREFIX):
                continue
            i = bisect.bisect_right(starts, e.time_range.start) - 1
            if i < 0 or e.time_range.start > ranges[i][1]:
                continue  # launched outside every phase (the loop between steps)
            # a range's own annotation is listed as a "kernel" of its name: not work
            gpu_us[ranges[i][2]] += sum(k.duration for k in e.kernels if k.name != e.name)
    ordered: dict = {}
    for name in PHASES:
        if name in cpu_us:
            ordered[name] = {"cpu_ms": cpu_us[name] / 1000.0 / steps}
            if gpu:
                ordered[name]["gpu_ms"] = gpu_us[name] / 1000.0 / steps
    covered = sum(v["cpu_ms"] for v in ordered.values())
    out = {"wall_ms": wall_ms, "phases": ordered, "other_ms": max(wall_ms - covered, 0.0)}
    comm = communication(events, steps) if gpu else None
    if comm:
        out["communication"] = comm
    return out


def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for lo, hi in sorted(spans):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _overlap(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Length of the intersection of two sorted unions of intervals."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(hi - lo, 0.0)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def communication(events, steps: int) -> dict | None:
    """ms per step the GPU spent in NCCL kernels, split into the part other kernels ran beside
    (overlapped: DDP's bucketed all-reduce during the backward, FSDP's prefetched all-gathers)
    and the part nothing else ran (exposed: the step waits for the network). None without NCCL
    kernels (one GPU, a CPU run over gloo)."""
    comm, compute = [], []
    for e in events:
        if e.device_type != DeviceType.CUDA or getattr(e, "is_user_annotation", False):
            continue
        if e.name.startswith(PREFIX):
            continue  # a phase's annotation on the GPU timeline (older torch: not flagged)
        span = (e.time_range.start, e.time_range.end)
        (comm if "nccl" in e.name.lower() else compute).append(span)
    if not comm:
        return None
    comm_u, compute_u = _union(comm), _union(compute)
    busy = sum(hi - lo for lo, hi in comm_u)
    overlapped = _overlap(comm_u, compute_u)
    return {
        "nccl_ms": busy / 1000.0 / steps,
        "overlapped_ms": overlapped / 1000.0 / steps,
        "exposed_ms": (busy - overlapped) / 1000.0 / steps,
    }


def with_ranks(times: dict) -> dict:
    """Every rank's phases beside rank 0's, and the slowest rank: the one whose own work
    (data wait + forward; backward holds the wait for the others' gradients) takes longest.
    Collective: every rank profiles the same steps."""
    import torch.distributed as dist

    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return times
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, times)

    def own(t: dict) -> float:
        return sum(
            t["phases"].get(n, {}).get("gpu_ms", t["phases"].get(n, {}).get("cpu_ms", 0.0))
            for n in ("data", "forward")
        )

    work = [own(t) for t in everyone]
    slowest = max(range(len(work)), key=work.__getitem__)
    return {**times, "ranks": everyone, "slowest_rank": slowest, "own_work_ms": work}


def phases_text(times: dict) -> str:
    lines = [
        "phases of the step (ms per step): the host's span of each, and on GPUs the time of the "
        "kernels it launched (a phase that synchronises, the checks reading the loss, holds the "
        "host's wait for kernels queued before it):"
    ]
    for name, v in times["phases"].items():
        gpu = f"   GPU {v['gpu_ms']:8.2f}" if "gpu_ms" in v else ""
        lines.append(f"  {name:10s} CPU {v.get('cpu_ms', 0.0):8.2f}{gpu}")
    lines.append(f"  {'other':10s} CPU {times['other_ms']:8.2f}  (the loop, logging, progress)")
    if times.get("communication"):
        c = times["communication"]
        lines.append(
            f"NCCL kernels {c['nccl_ms']:.2f} ms per step: {c['overlapped_ms']:.2f} overlapped "
            f"with other kernels, {c['exposed_ms']:.2f} exposed (nothing else on the GPU)"
        )
    if "slowest_rank" in times:
        work = times["own_work_ms"]
        median = sorted(work)[len(work) // 2]
        lines.append(
            f"slowest rank: {times['slowest_rank']} (data + forward "
            f"{work[times['slowest_rank']]:.2f} ms per step; the ranks' median {median:.2f})"
        )
    return "\n".join(lines) + "\n"


def phases_plot(times: dict, out: Path) -> Path:
    """Stacked bars of a step by phase: the host's wall time and, on GPUs, the kernel time each
    phase launched (the host bar alone misleads there: a phase that synchronises, the checks
    reading the loss, holds the wait for kernels the other phases queued)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [*times["phases"], "other"]
    colours = {n: f"C{i}" for i, n in enumerate(names)}
    host = [(n, v.get("cpu_ms", 0.0)) for n, v in times["phases"].items()]
    host.append(("other", times["other_ms"]))
    bars = [("host (wall)", host)]
    if any("gpu_ms" in v for v in times["phases"].values()):
        bars.append(
            ("GPU kernels", [(n, v.get("gpu_ms", 0.0)) for n, v in times["phases"].items()])
        )
    fig, ax = plt.subplots(figsize=(8, 1.4 + 0.5 * len(bars)))
    for y, (_, parts) in enumerate(reversed(bars)):
        left = 0.0
        for name, ms in parts:
            ax.barh([y], [ms], left=left, color=colours[name])
            if ms > 0.04 * max(times["wall_ms"], 1e-9):
                ax.text(left + ms / 2, y, f"{ms:.1f}", ha="center", va="center", fontsize=7)
            left += ms
    ax.set_yticks(range(len(bars)), [b[0] for b in reversed(bars)], fontsize=8)
    ax.set_xlabel("ms per step (rank 0)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=colours[n]) for n in names]
    ax.legend(
        handles, names, ncol=len(names), fontsize=7, loc="lower center", bbox_to_anchor=(0.5, 1.0)
    )
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def kernel_kind(name: str) -> str:
    low = name.lower()
    for kind, fragments in KINDS:
        if any(f in low for f in fragments):
            return kind
    return "other"


class StepProfiler:
    def __init__(self, device: torch.device, steps: int, out_dir: Path, is_main: bool):
        self.device, self.steps, self.out_dir, self.is_main = device, steps, out_dir, is_main
        self._prof: profile | None = None
        self.summary: list[dict] | None = None
        self.phases: dict | None = None
        self.syncs = SyncSites(device.type == "cuda")  # where the host waited, in those steps

    def start(self) -> None:
        if self.steps <= 0 or self._prof is not None:
            return
        activities = [ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
        self._prof = profile(activities=activities)
        self._prof.__enter__()
        self._sync()
        self.syncs.start()
        self._t0 = time.perf_counter()

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def stop(self) -> None:
        if self._prof is None:
            return
        self.syncs.stop()  # before the profiler's own sync
        self._sync()
        wall_ms = (time.perf_counter() - self._t0) * 1000.0 / self.steps
        self._prof.__exit__(None, None, None)
        gpu = self.device.type == "cuda"
        key = "self_device_time_total" if gpu else "self_cpu_time_total"
        averages = self._prof.key_averages()
        events = sorted(averages, key=lambda e: getattr(e, key), reverse=True)
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
        self.phases = with_ranks(phase_times(self._prof.events(), self.steps, wall_ms, gpu))
        if self.is_main:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            head = f"torch.profiler over {self.steps} steps after warm-up\n\n"
            head += f"wall time per step: {wall_ms:.2f} ms (profiler running)\n"
            head += phases_text(self.phases)
            phases_plot(self.phases, self.out_dir / "phases.png")
            if gpu:
                head += kernel_breakdown(averages, wall_ms, self.steps)
            head += self.syncs.text(self.steps)
            clock = "self device (GPU) time" if gpu else "self CPU time"
            table = averages.table(sort_by=key, row_limit=40)
            (self.out_dir / "profile.txt").write_text(f"{head}\noperators by {clock}:\n{table}")
            self._save_trace()
        self._prof = None

    def discard(self) -> None:
        """A run that failed inside its profiled steps: the profiler closed and the sync
        recorder's switches (torch's sync debug mode, torch.cuda.synchronize) put back, so a
        process that goes on (paratrain.train in a notebook) is left as it was; nothing
        written."""
        self.syncs.stop()
        if self._prof is not None:
            prof, self._prof = self._prof, None
            prof.__exit__(None, None, None)

    def _save_trace(self) -> None:
        plain = self.out_dir / "trace.json"
        self._prof.export_chrome_trace(str(plain))
        with plain.open("rb") as src, gzip.open(self.out_dir / "trace.json.gz", "wb") as dst:
            shutil.copyfileobj(src, dst)
        plain.unlink()


def kernel_breakdown(averages, wall_ms: float, steps: int) -> str:
    """GPU kernel time per step, by kind, and its share of the wall time (kernels summed over
    streams, so overlapping ones, e.g. NCCL beside compute, can add up past 100%)."""
    by_kind: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    for e in averages:
        # A record_function range (DistributedDataParallel.forward, Optimizer.step) also shows up
        # on the GPU timeline as a user annotation spanning its kernels: not a kernel itself.
        if e.device_type == DeviceType.CUDA and not getattr(e, "is_user_annotation", False):
            by_kind[kernel_kind(e.key)] += e.self_device_time_total / 1000.0 / steps
            calls[kernel_kind(e.key)] += e.count
    busy = sum(by_kind.values())
    lines = [
        f"GPU kernel time per step: {busy:.2f} ms ({busy / max(wall_ms, 1e-9):.0%} of the wall time)",
        "by kind (ms per step, share of kernel time, launches per step):",
    ]
    for kind, ms in sorted(by_kind.items(), key=lambda kv: -kv[1]):
        share = ms / busy if busy else 0.0
        lines.append(f"  {kind:34s} {ms:8.2f}  {share:6.1%}  {calls[kind] / steps:7.0f}")
    return "\n".join(lines) + "\n"
