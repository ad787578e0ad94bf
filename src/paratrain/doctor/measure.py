"""What doctor times. Each row: name, value, unit, expected (what it should be, where known),
note. A row that cannot run here has value None and says why."""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from paratrain.meters import metrics


def _timed(fn, device: torch.device, reps: int) -> float:
    """Seconds per call, after one warm-up call."""
    fn()
    metrics.sync(device)
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    metrics.sync(device)
    return (time.perf_counter() - t0) / reps


def row(name: str, value: float | None, unit: str, expected: float | None = None, **more) -> dict:
    return {"name": name, "value": value, "unit": unit, "expected": expected, **more}


def copies(gpu: dict, mib: int) -> list[dict]:
    """Host <-> device, pinned and pageable: the seed's pin_memory question for this machine."""
    dev = torch.device("cuda", gpu["index"])
    n = mib * 2**20
    on_dev = torch.empty(n, dtype=torch.uint8, device=dev)
    out = []
    for pinned in (True, False):
        host = torch.empty(n, dtype=torch.uint8, pin_memory=pinned)
        kind = "pinned" if pinned else "pageable"
        h2d = _timed(lambda h=host: on_dev.copy_(h, non_blocking=True), dev, 5)
        d2h = _timed(lambda h=host: h.copy_(on_dev, non_blocking=True), dev, 5)
        for direction, s in (("host->device", h2d), ("device->host", d2h)):
            out.append(
                row(
                    f"GPU {gpu['index']} {direction}, {kind}",
                    n / s / 1e9,
                    "GB/s",
                    gpu.get("pcie_gbps_nominal"),
                    gpu=gpu["index"],
                    kind=f"{direction} {kind}",
                )
            )
    return out


def peer_copies(gpus: list[dict], mib: int) -> list[dict]:
    """Device-to-device copy rate of every ordered pair of GPUs (NVLink, PCIe peer-to-peer, or
    through the host where the pair has no peer access)."""
    out = []
    n = mib * 2**20
    for a in gpus:
        for b in gpus:
            if a["index"] == b["index"]:
                continue
            src = torch.empty(n, dtype=torch.uint8, device=torch.device("cuda", a["index"]))
            dst = torch.empty(n, dtype=torch.uint8, device=torch.device("cuda", b["index"]))

            def copy(src=src, dst=dst) -> None:
                dst.copy_(src, non_blocking=True)
                torch.cuda.synchronize(src.device)  # the copy runs on the source's stream

            seconds = _timed(copy, dst.device, 5)
            peer = torch.cuda.can_device_access_peer(a["index"], b["index"])
            out.append(
                row(
                    f"GPU {a['index']} -> GPU {b['index']} copy",
                    n / seconds / 1e9,
                    "GB/s",
                    kind="p2p",
                    gpu=a["index"],
                    peer=b["index"],
                    peer_access=peer,
                    note=None if peer else "no peer access: through the host",
                )
            )
    return out


def all_reduce(nproc: int, device: str, quick: bool) -> list[dict]:
    """All-reduce bus bandwidth at a few sizes through `paratrain comm`'s own code, on `nproc`
    processes under torchrun's agent (NCCL on GPUs, gloo on CPUs)."""
    import json

    from paratrain.comm import collectives
    from paratrain.comm import worker as comm

    big = (64 if quick else 256) * 2**20 if device == "cuda" else 4 * 2**20
    with tempfile.TemporaryDirectory(prefix="paratrain-doctor-comm-") as out:
        cfg = collectives.CommConfig(
            ops=["all_reduce"],
            min_bytes=2**20,
            max_bytes=big,
            dtype="bf16" if device == "cuda" else "fp32",
            iters=5 if quick else 10,
            warmup=2,
            passes=1 if quick else 3,
            device=device,
            out_dir=out,
        )
        comm.launch_workers(cfg, nproc)
        result = json.loads((Path(out) / "result.json").read_text())
    wanted = {2**20, 16 * 2**20, big}  # a small, a middle and the largest message
    return [
        row(
            f"all_reduce {r['bytes'] // 2**20} MiB x{nproc} ({result['backend']})",
            r["busbw_gbps"],
            "GB/s",
            kind="all_reduce",
            bytes=r["bytes"],
            note="bus bandwidth, nccl-tests' convention",
        )
        for r in result["rows"]
        if r["bytes"] in wanted
    ]


def device_memory(device: torch.device, mib: int, expected: float | None) -> dict:
    n = mib * 2**20 // 4
    a = torch.empty(n, dtype=torch.float32, device=device)
    b = torch.empty_like(a)
    s = _timed(lambda: b.copy_(a), device, 10)
    where = f"GPU {device.index}" if device.type == "cuda" else "CPU"
    return row(
        f"{where} memory copy",
        2 * a.numel() * 4 / s / 1e9,
        "GB/s",
        expected,
        kind="memory",
        gpu=device.index,
    )


def matmul(device: torch.device, size: int) -> dict:
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    s = _timed(lambda: a @ b, device, 10 if device.type == "cuda" else 3)
    peak = metrics.peak_flops(device)
    where = f"GPU {device.index} bf16" if device.type == "cuda" else "CPU fp32"
    return row(
        f"{where} matmul {size}^3",
        2 * size**3 / s / 1e12,
        "TFLOP/s",
        peak / 1e12 if peak else None,
        kind="matmul",
        gpu=device.index,
    )


SMALL_READ = 16 * 2**20


def disk(path: str | None, mib: int) -> dict:
    """The read rate of the data folder's files (first read: the page cache may already hold
    them, so this is an upper bound), or of a file written here for the purpose."""
    files: list[Path] = []
    if path and Path(path).exists():
        root = Path(path)
        files = [root] if root.is_file() else [p for p in root.rglob("*") if p.is_file()]
    if not files:
        return row("disk read", None, "MB/s", note="no data.path to read (doctor --data-path)")
    budget, read, opened, t0 = mib * 2**20, 0, 0, time.perf_counter()
    for p in files:
        opened += 1
        with open(p, "rb") as f:
            # ask the kernel to forget the file first, where it listens
            with contextlib.suppress(AttributeError, OSError):
                os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
            while chunk := f.read(8 * 2**20):
                read += len(chunk)
                if read >= budget:
                    break
        if read >= budget:
            break
    seconds = max(time.perf_counter() - t0, 1e-9)
    note = [f"{opened} files, {opened / seconds:,.0f} files/s"] if opened > 1 else []
    if read < SMALL_READ:  # a few small files: opening them is the time, not the disk
        note.append(f"only {read / 1e6:.2g} MB: a per-file rate, not the disk's")
    return row(
        f"disk read ({path})",
        read / seconds / 1e6,
        "MB/s",
        kind="disk",
        bytes=read,
        files=opened,
        note="; ".join(note) or None,
    )


def loader_vs_step(recipe: str, quick: bool) -> list[dict]:
    """The recipe's data loader alone (its batches, no model) against a few training steps of
    the recipe in this process: is the loader the bottleneck?"""
    from paratrain.data.loader import build_data
    from paratrain.runplan import plan_of
    from paratrain.trainer.loop import train

    steps = 8 if quick else 30
    with tempfile.TemporaryDirectory(prefix="paratrain-doctor-") as scratch:
        plan = plan_of(
            recipe,
            [
                "strategy=single",
                f"train.max_steps={steps}",
                "train.warmup_steps=3",
                "log.progress=false",
                "checkpoint.at_end=false",
                "train.eval=false",
                "log.steps=false",
                "log.tensorboard=false",
                f"output_dir={scratch}/run",
            ],
        )
        cfg = plan.config
        if not plan.task_spec.image_levers:
            return [row("loader alone", None, "samples/s", note="image recipes only")]
        device = torch.device(
            "cuda" if torch.cuda.is_available() and cfg.device != "cpu" else "cpu"
        )
        data = build_data(
            cfg.data,
            sampler_mode=cfg.data.sampler,
            rank=0,
            world=1,
            seed=cfg.seed,
            device=device,
            loader_batch=cfg.data.batch_size,
        )
        it, seen, t0 = iter(data.train), 0, None
        for i, (x, _) in enumerate(it):
            if i == 2:  # workers started and warm
                t0, seen = time.perf_counter(), 0
            seen += len(x)
            if i >= 2 + steps:
                break
        loader = seen / max(time.perf_counter() - t0, 1e-9)
        result = train(plan)
    summary = result["summary"]
    step = summary["unique_samples_per_s"]
    workers = cfg.data.num_workers
    gpu = (summary.get("gpu_telemetry") or [None])[0] or {}
    energy = summary.get("energy") or {}
    return [
        row(
            "loader alone",
            loader,
            "samples/s",
            kind="loader",
            workers=workers,
            recipe=recipe,
            resize_on=cfg.data.resize_on,
        ),
        row(
            "training steps (loader + model)",
            step,
            "samples/s",
            kind="step",
            recipe=recipe,
            utilization_pct=gpu.get("utilization_pct_mean"),  # NVML, over the measured steps
            joules_per_sample=energy.get("joules_per_sample"),
            note=(
                f"GPU busy {gpu['utilization_pct_mean']:.0f}%"
                + (f", {energy['joules_per_sample']:.3g} J/sample" if energy else "")
                if gpu.get("utilization_pct_mean") is not None
                else None
            ),
        ),
    ]


def all_of(facts: dict, recipe: str | None, data_path: str | None, quick: bool) -> dict[str, Any]:
    rows: list[dict] = []
    mib = 64 if quick else 256
    for gpu in facts["gpus"]:
        dev = torch.device("cuda", gpu["index"])
        rows += copies(gpu, mib)
        rows.append(device_memory(dev, 4 * mib, gpu.get("memory_gbps_datasheet")))
        rows.append(matmul(dev, 4096 if quick else 8192))
    if not facts["gpus"]:
        rows.append(row("host <-> device copies", None, "GB/s", note="no GPU: skipped"))
    if len(facts["gpus"]) > 1:
        rows += peer_copies(facts["gpus"], mib)
        rows += all_reduce(len(facts["gpus"]), "cuda", quick)
    else:
        rows.append(row("GPU <-> GPU copies, all-reduce", None, "GB/s", note="fewer than 2 GPUs"))
    cpu = torch.device("cpu")
    rows.append(device_memory(cpu, mib, None))
    rows.append(matmul(cpu, 512 if quick else 1024))
    rows.append(disk(data_path, mib))
    if recipe:
        rows += loader_vs_step(recipe, quick)
    return {"rows": rows}
