"""Collectives benchmark (`paratrain comm`): all_reduce, all_gather, reduce_scatter, broadcast and
all_to_all timed over message sizes on the job's backend (NCCL on GPUs, gloo on CPUs).

Reported as nccl-tests does (its PERFORMANCE.md): S = the largest buffer on a rank (all_gather's
output, reduce_scatter's input, the tensor otherwise), t = the slowest rank's mean time per call,
algorithm bandwidth = S / t, bus bandwidth = algbw x a factor that makes the figure comparable
with the links' speed whatever the rank count n: 2(n-1)/n for all_reduce, (n-1)/n for all_gather,
reduce_scatter and all_to_all, 1 for broadcast. Every size's result is checked once against the
values it must hold, so a broken link or a mis-set backend fails instead of timing garbage.

The comm command (worker.py) and `doctor` time them through measure_all.
"""

from __future__ import annotations

import re
import statistics
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from paratrain.errors import UserError

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all")


def bus_factor(op: str, n: int) -> float:
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op == "broadcast":
        return 1.0
    return (n - 1) / n


def parse_size(text: str | int) -> int:
    """'64M' -> 67108864; plain integers are bytes. K, M, G are powers of 1,024."""
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)i?B?\s*", str(text), re.IGNORECASE)
    if not m:
        raise ValueError(f"expected a size such as 4096, 64K, 256M or 1G, got {text!r}")
    return int(m.group(1)) * 1024 ** " KMG".index(m.group(2).upper() or " ")


def sizes(min_bytes: int, max_bytes: int) -> list[int]:
    """Powers of two from min to max (both included when they are powers of two)."""
    out, s = [], min_bytes
    while s <= max_bytes:
        out.append(s)
        s *= 2
    return out


@dataclass(kw_only=True)
class CommConfig:
    ops: list[str] = field(default_factory=lambda: list(OPS))
    """Collectives to time: all_reduce, all_gather, reduce_scatter, broadcast, all_to_all."""
    min_bytes: int = 1024
    """Smallest message, in bytes."""
    max_bytes: int | None = None
    """Largest message, in bytes (sizes double from min_bytes); default 256 MiB on GPUs, 4 MiB on CPUs."""
    dtype: str = "bf16"
    """Element type: fp32, bf16 or fp16."""
    iters: int = 20
    """Timed calls per size."""
    warmup: int = 5
    """Untimed calls per size first (connections, NCCL's channels)."""
    passes: int = 3
    """Timed passes of `iters` calls per size; the median pass is reported (min and max kept), so
    one slow pass (another job's traffic, a clock dip) does not become the size's figure."""
    device: str = "auto"
    """auto (GPUs when there are), cuda or cpu."""
    out_dir: str = "runs/comm"
    """Where config.json, result.json and busbw.png (bus bandwidth against size) go."""

    def __post_init__(self) -> None:
        unknown = [op for op in self.ops if op not in OPS]
        if unknown or not self.ops:
            raise ValueError(f"--ops: got {unknown or 'none'}; accepted: {', '.join(OPS)}")
        if self.dtype not in DTYPES:
            raise ValueError(f"--dtype: got {self.dtype!r}; accepted: {', '.join(DTYPES)}")
        if self.min_bytes < 16:
            raise ValueError(f"--min-bytes: must be >= 16, got {self.min_bytes}")
        if self.max_bytes is not None and self.max_bytes < self.min_bytes:
            raise ValueError(f"--max-bytes: {self.max_bytes} is below --min-bytes {self.min_bytes}")
        if self.iters < 1 or self.warmup < 0 or self.passes < 1:
            raise ValueError("--iters and --passes must be >= 1 and --warmup >= 0")
        if self.device not in ("auto", "cuda", "cpu"):
            raise ValueError(f"--device: got {self.device!r}; accepted: auto, cuda, cpu")


def _buffers(op: str, nbytes: int, dtype: torch.dtype, rank: int, n: int, device):
    """(input, output, expected output) for one call; the values make every op checkable."""
    item = torch.tensor([], dtype=dtype).element_size()
    count = max(nbytes // item // n, 1) * n  # divisible by the rank count
    chunk = count // n
    full = dict(dtype=dtype, device=device)
    if op == "all_reduce":
        x = torch.full((count,), float(rank + 1), **full)
        return x, x, torch.full((count,), float(n * (n + 1) // 2), **full)
    if op == "broadcast":
        x = torch.full((count,), float(rank + 1), **full)
        return x, x, torch.ones(count, **full)
    if op == "all_gather":
        x = torch.full((chunk,), float(rank), **full)
        expect = torch.arange(n, **full).repeat_interleave(chunk)
        return x, torch.empty(count, **full), expect
    if op == "reduce_scatter":
        x = torch.full((count,), float(rank + 1), **full)
        return x, torch.empty(chunk, **full), torch.full((chunk,), float(n * (n + 1) // 2), **full)
    # all_to_all: rank r sends chunk j, valued r * n + j (small integers: exact in bf16), to rank j
    x = (rank * n + torch.arange(n, **full)).repeat_interleave(chunk)
    expect = (torch.arange(n, **full) * n + rank).repeat_interleave(chunk)
    return x, torch.empty(count, **full), expect


def _call(op: str, x: torch.Tensor, out: torch.Tensor) -> None:
    if op == "all_reduce":
        dist.all_reduce(out)
    elif op == "broadcast":
        dist.broadcast(out, src=0)
    elif op == "all_gather":
        (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(out, x)
    elif op == "reduce_scatter":
        (getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor)(out, x)
    else:
        dist.all_to_all_single(out, x)


def measure(op: str, nbytes: int, cfg: CommConfig, device: torch.device) -> dict:
    rank, n = dist.get_rank(), dist.get_world_size()
    dtype = DTYPES[cfg.dtype]
    x, out, expect = _buffers(op, nbytes, dtype, rank, n, device)
    fresh = x.clone()
    # all_reduce and broadcast work in place: check the first call, then time on the same buffer
    _call(op, x, out)
    if not torch.equal(out, expect):
        raise UserError(f"{op}: rank {rank} received wrong values at {nbytes} bytes")
    if op in ("all_reduce", "broadcast"):
        out.copy_(fresh)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(cfg.warmup):
        _call(op, x, out)
    sync()
    per_call = []
    for _ in range(cfg.passes):
        dist.barrier()
        start = time.perf_counter()
        for _ in range(cfg.iters):
            _call(op, x, out)
        sync()
        per_call.append((time.perf_counter() - start) / cfg.iters)
    mine = torch.tensor(per_call, dtype=torch.float64, device=device)
    dist.all_reduce(mine, op=dist.ReduceOp.MAX)  # a collective ends when its slowest rank does
    passes = sorted(mine.tolist())
    seconds = statistics.median(passes)
    size = max(x.numel(), out.numel()) * x.element_size()
    algbw = size / seconds / 1e9
    return {
        "op": op,
        "bytes": size,
        "time_us": seconds * 1e6,
        "time_us_min": passes[0] * 1e6,
        "time_us_max": passes[-1] * 1e6,
        "algbw_gbps": algbw,
        "busbw_gbps": algbw * bus_factor(op, n),
    }


def measure_all(cfg: CommConfig, env) -> dict:
    """Every op over every size on this process group -> the rows and each op's peak bus
    bandwidth (the comm command adds the machine's facts and writes them: worker.py)."""
    max_bytes = cfg.max_bytes or (256 * 2**20 if env.device.type == "cuda" else 4 * 2**20)
    rows = [
        measure(op, nbytes, cfg, env.device)
        for op in cfg.ops
        for nbytes in sizes(cfg.min_bytes, max_bytes)
    ]
    return {
        "backend": env.backend,
        "world_size": env.world_size,
        "dtype": cfg.dtype,
        "iters": cfg.iters,
        "passes": cfg.passes,
        "rows": rows,
        "peak_busbw_gbps": {
            op: max(r["busbw_gbps"] for r in rows if r["op"] == op) for op in cfg.ops
        },
    }
