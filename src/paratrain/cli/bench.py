"""`paratrain bench`: run a sweep of configurations and store every result."""

from __future__ import annotations

import argparse


def add(sub) -> None:
    bench = sub.add_parser("bench", help="run a sweep of configurations and store every result")
    bench.add_argument("sweep", help="sweep YAML (recipes/bench/*.yaml)")
    bench.add_argument("--db", default="paratrain-results.db", help="SQLite results file")
    bench.add_argument("--runs-dir", default="runs/bench", help="where each run's files go")
    bench.add_argument("--rerun", action="store_true", help="run again what already succeeded")
    bench.add_argument("--dry-run", action="store_true", help="list the runs and exit")
    bench.add_argument("--no-progress", action="store_true", help="no progress bar")
    bench.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key in every run (repeatable)",
    )
    bench.add_argument(
        "--grid",
        action="append",
        default=[],
        metavar="KEY=V1,V2",
        help="replace or add an axis of the sweep's grid, e.g. launch.nproc=1,2,4 (repeatable; a "
        "variant with a grid of its own keeps the axes it names and takes the others)",
    )
    bench.add_argument("--repeats", type=int, help="runs per configuration (replaces the sweep's)")
    bench.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="TEXT",
        help="only the variants whose label contains TEXT, or is exactly TEXT after a leading = (repeatable)",
    )
    bench.set_defaults(func=command)


def command(args: argparse.Namespace) -> int:
    from pathlib import Path

    from paratrain.bench.execute import run_sweep
    from paratrain.bench.store import Store
    from paratrain.bench.sweep import load_sweep

    # every run's config is validated before anything runs
    sweep = load_sweep(
        args.sweep, sets=args.set, axes=args.grid, repeats=args.repeats, only=args.only
    )
    if args.dry_run:
        for run in sweep.runs:
            print(f"{run.key} {run.label} [{run.program}] {run.params} #{run.repeat}")
        return 0
    counts = run_sweep(
        sweep, Store(args.db), Path(args.runs_dir), rerun=args.rerun, progress=not args.no_progress
    )
    print(
        f"paratrain bench: {sweep.name}: "
        + ", ".join(f"{v} {k}" for k, v in counts.items())
        + f"; results in {args.db}"
    )
    return 0
