"""`paratrain doctor`: measure this machine and advise."""

from __future__ import annotations

import argparse

from paratrain.errors import UserError


def add(sub) -> None:
    doctor = sub.add_parser(
        "doctor",
        help="measure this machine (copies, memory, matmuls, disk, a recipe's loader) and advise",
        description="The install (torch, torchvision, triton, CUDA libraries against each "
        "other: one line per problem with the pip command that mends it; exit 1 if any); "
        "versions, devices, NUMA; host<->device copies pinned and pageable, memory "
        "bandwidth, matmul TFLOP/s, the disk's read rate; with --recipe, the recipe's loader "
        "alone against a few of its training steps. Each measurement beside what it should be, "
        "then advice lines. Writes doctor.json.",
    )
    doctor.add_argument("--recipe", help="also time this recipe's loader against its steps")
    doctor.add_argument("--data-path", help="a data folder or file whose read rate to measure")
    doctor.add_argument(
        "--out", default="runs/doctor", help="where doctor.json goes (default runs/doctor/)"
    )
    doctor.add_argument("--quick", action="store_true", help="smaller sizes, fewer steps")
    doctor.set_defaults(func=command)


def command(args: argparse.Namespace) -> int:
    from pathlib import Path

    from paratrain import doctor, install

    if args.recipe and not Path(args.recipe).is_file():
        raise UserError(f"--recipe: no such file {args.recipe}")
    if args.data_path and not Path(args.data_path).exists():
        raise UserError(f"--data-path: no such file or folder {args.data_path}")
    # the install first, before anything imports what it may break: one line per problem
    broken = install.probe()
    print("\n".join(broken) or f"install: sound ({install.summary()})", flush=True)
    if args.recipe:
        from paratrain.runplan import plan_of

        plan_of(args.recipe)  # a bad recipe: its one line now, before anything is timed
    found = doctor.run(args.recipe, Path(args.out), args.data_path, args.quick, broken)
    doctor.print_report(found)
    print(f"paratrain doctor: {Path(args.out) / 'doctor.json'}")
    return 1 if broken else 0
