"""`paratrain comm`: time collectives over message sizes."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from paratrain.errors import UserError


def add(sub) -> None:
    comm = sub.add_parser(
        "comm",
        help="time NCCL / gloo collectives over message sizes (algorithm and bus bandwidth)",
        description="Time all_reduce, all_gather, reduce_scatter, broadcast and all_to_all "
        "over doubling message sizes, as nccl-tests reports them. Under an outside torchrun "
        "(several nodes), it joins that job.",
    )
    comm.add_argument("--nproc", type=int, help="processes (default: one per GPU, or 2 on CPUs)")
    comm.add_argument("--device", default="auto", help="auto, cuda or cpu")
    comm.add_argument("--ops", default=",".join(_comm_ops()), help="comma-separated collectives")
    comm.add_argument("--min-bytes", default="1K", help="smallest message (e.g. 1K)")
    comm.add_argument("--max-bytes", help="largest message (default 256M on GPUs, 4M on CPUs)")
    comm.add_argument(
        "--dtype", default=None, help="fp32, bf16 or fp16 (default: bf16 on GPUs, fp32 on CPUs)"
    )
    comm.add_argument("--iters", type=int, default=20, help="timed calls per size")
    comm.add_argument("--warmup", type=int, default=5, help="untimed calls per size first")
    comm.add_argument(
        "--passes", type=int, default=3, help="timed passes per size; the median is reported"
    )
    comm.add_argument("--out", help="folder for config.json, result.json and busbw.png")
    comm.set_defaults(func=command)


def command(args: argparse.Namespace) -> int:
    import time

    from paratrain.comm import collectives, worker
    from paratrain.launch import torchrun as launch

    try:
        cfg = collectives.CommConfig(
            ops=[op.strip() for op in args.ops.split(",") if op.strip()],
            min_bytes=collectives.parse_size(args.min_bytes),
            max_bytes=collectives.parse_size(args.max_bytes) if args.max_bytes else None,
            dtype=args.dtype or ("bf16" if _cuda_for(args.device) else "fp32"),
            iters=args.iters,
            warmup=args.warmup,
            passes=args.passes,
            device=args.device,
            out_dir=args.out or f"runs/comm-{time.strftime('%Y%m%d-%H%M%S')}",
        )
    except ValueError as e:
        raise UserError(str(e)) from None
    if launch.launched_by_torchrun():  # a job started outside: join it
        worker.run(cfg)
        return 0
    nproc = worker.processes(cfg, args.nproc)
    print(f"paratrain: comm on {nproc} processes (torchrun)", flush=True)
    try:
        worker.launch_workers(cfg, nproc)
    except Exception as e:  # torchrun's ChildFailedError: the workers printed their own errors
        print(
            f"paratrain: comm failed ({type(e).__name__}); the workers' errors are above",
            file=sys.stderr,
        )
        return 1
    print(f"paratrain: results in {Path(cfg.out_dir) / 'result.json'}")
    return 0


def _comm_ops() -> tuple[str, ...]:
    from paratrain.comm.collectives import OPS

    return OPS


def _cuda_for(device: str) -> bool:
    import torch

    return device != "cpu" and torch.cuda.is_available()
