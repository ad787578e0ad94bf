"""`paratrain demo`: a one-minute run on real MNIST digits, on whatever is here."""

from __future__ import annotations

import argparse


def add(sub) -> None:
    demo = sub.add_parser("demo", help="a one-minute run on real MNIST digits, on whatever is here")
    demo.add_argument(
        "--nproc", type=int, help="processes (default: all GPUs, else 2 CPU processes)"
    )
    demo.add_argument(
        "--epochs", type=int, default=None, help="passes over the 4,000 training digits"
    )
    demo.add_argument("--max-steps", type=int, default=None, help="stop after this many steps")
    demo.add_argument("--output-dir", help="where the result goes (default runs/demo-<time>)")
    demo.add_argument(
        "--overwrite", action="store_true", help="replace an earlier run in --output-dir"
    )
    demo.add_argument("--no-progress", action="store_true", help="no progress bar")
    demo.set_defaults(func=command)


def command(args: argparse.Namespace) -> int:
    from importlib import resources

    import torch

    from paratrain.runner import execute
    from paratrain.runplan import plan_of

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    overrides = [f"launch.nproc={args.nproc or gpus or 2}"]
    flags = {
        "train.epochs": args.epochs,
        "train.max_steps": args.max_steps,
        "output_dir": args.output_dir,
        "log.progress": "false" if args.no_progress else None,
    }
    overrides += [f"{key}={value}" for key, value in flags.items() if value]
    recipe = resources.files("paratrain.recipes") / ("demo_gpu.yaml" if gpus else "demo_cpu.yaml")
    with resources.as_file(recipe) as path:
        plan = plan_of(path, overrides)
    cfg = plan.config
    print(
        f"paratrain demo: {cfg.model.name} on 4,000 real MNIST digits (1,000 held out), "
        f"{plan.nproc} {'GPU' if gpus else 'CPU'} processes, {plan.strategy}, {cfg.precision}",
        flush=True,
    )
    return execute(plan, overwrite=args.overwrite)
