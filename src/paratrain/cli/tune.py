"""`paratrain tune`: search the levers for the fastest set-up of a recipe here."""

from __future__ import annotations

import argparse
from pathlib import Path

from paratrain.errors import UserError


def add(sub) -> None:
    tune = sub.add_parser(
        "tune",
        help="search precision, compile, loader and memory levers for the fastest set-up here",
        description="Coordinate descent over the levers (the recipe's own values first): each "
        "trial a short run in its own process, stored in the results DB, so a second tune of "
        "the same recipe resumes. A trial counts only if its loss stays within --loss-band of "
        "the reference's (the recipe's, or --reference-precision's) over the same batches. "
        "Prints a ranked table, writes tuned.yaml (each lever commented) and tune.json.",
    )
    tune.add_argument("recipe", help="YAML recipe")
    tune.add_argument(
        "--budget", default="20m", help="time for the whole search, e.g. 90s, 20m, 1h"
    )
    tune.add_argument(
        "--steps", type=int, default=30, help="measured steps per trial after warm-up"
    )
    tune.add_argument("--space", help="a YAML file of levers instead of the default space")
    tune.add_argument(
        "--keep",
        action="append",
        default=[],
        metavar="KEY",
        help="hold a lever at the recipe's value",
    )
    tune.add_argument("--loss-band", type=float, default=0.05, help="numerics guard (default 0.05)")
    tune.add_argument(
        "--reference-precision", help="the guard's reference precision (default: the recipe's)"
    )
    tune.add_argument(
        "--min-gain", type=float, default=0.02, help="a change must be this much faster"
    )
    tune.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override a recipe key"
    )
    tune.add_argument(
        "--trial-timeout",
        type=float,
        default=900,
        metavar="S",
        help="seconds one trial may take before it is stopped and stored as timeout (900)",
    )
    tune.add_argument("--db", default="paratrain-results.db", help="SQLite results file")
    tune.add_argument(
        "--out", help="where tuned.yaml, tune.json and the trials go (default runs/tune-<recipe>)"
    )
    tune.add_argument("--dry-run", action="store_true", help="list the levers and exit")
    tune.add_argument("--no-progress", action="store_true", help="no progress bar")
    tune.set_defaults(func=command)


def command(args: argparse.Namespace) -> int:
    import torch

    from paratrain.runplan import plan_of
    from paratrain.tune import output, search, space

    if not Path(args.recipe).is_file():
        raise UserError(f"recipe: no such file {args.recipe}")
    if args.space and not Path(args.space).is_file():
        raise UserError(f"--space: no such file {args.space}")
    budget = parse_duration(args.budget)
    if args.steps < 1:
        raise UserError(f"--steps: must be >= 1, got {args.steps}")
    if args.loss_band < 0:
        raise UserError(f"--loss-band: must be >= 0, got {args.loss_band}")
    if args.trial_timeout <= 0:
        raise UserError(f"--trial-timeout: must be > 0, got {args.trial_timeout:g}")
    cfg = plan_of(args.recipe, args.set).config
    gpus = torch.cuda.device_count() if torch.cuda.is_available() and cfg.device != "cpu" else 0
    levers = space.read_space(args.space, cfg) if args.space else space.default_space(cfg, gpus)
    levers = space.keep(levers, args.keep)
    if not levers.levers:
        raise UserError("tune: no lever left to search (each has only the recipe's value)")
    tune_args = search.TuneArgs(
        budget_s=budget,
        steps=args.steps,
        loss_band=args.loss_band,
        min_gain=args.min_gain,
        reference_precision=args.reference_precision,
        trial_timeout_s=args.trial_timeout,
        db=None if args.dry_run else Path(args.db),  # a dry run writes no results DB
        out=Path(args.out or f"runs/tune-{Path(args.recipe).stem}"),
        sets=list(args.set),
        progress=not args.no_progress,
    )
    s = search.Search(args.recipe, cfg, levers, tune_args)
    print(
        f"paratrain tune: {s.planned()} trials in the first pass (a later pass tries what a "
        f"changed set-up makes new), budget {budget:,.0f} s; levers:"
    )
    for lever in levers.levers:
        print(f"  {lever.key}: {', '.join(map(str, lever.values))}  ({lever.why})")
    if args.dry_run:
        return 0
    found = _tune_with_progress(s, tune_args.progress)
    written = output.write(s, found)
    output.print_table(s, found)
    best, base = found["best"], found["baseline"]
    print(
        f"paratrain tune: best {best.label}: {best.throughput:,.1f} vs {base.throughput:,.1f} "
        f"for the recipe as the plan runs it, its levers at auto "
        f"({best.throughput / base.throughput:.2f}x); recipe {written['recipe']}, all trials "
        f"{written['json']}"
    )
    return 0


def parse_duration(text: str) -> float:
    """'90s', '20m', '1.5h', '300' -> seconds."""
    units = {"s": 1, "m": 60, "h": 3600}
    t = text.strip().lower()
    try:
        value = float(t[:-1]) * units[t[-1]] if t and t[-1] in units else float(t)
    except ValueError:
        raise UserError(f"--budget: expected a time like 90s, 20m or 1h, got {text!r}") from None
    if value <= 0:
        raise UserError(f"--budget: must be > 0, got {text!r}")
    return value


def _tune_with_progress(s, progress: bool):
    def line(t):
        rate = f", {t.throughput:,.1f}/s" if t.throughput else ""
        note = f" ({t.note})" if t.note else ""
        return f"[{t.index}] {t.label}: {t.status}{' (stored)' if t.reused else ''}{rate}{note}"

    if not progress:
        return s.search(lambda t: print(line(t), flush=True))
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("[bold]tune"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()
    ) as bar:
        task = bar.add_task("tune", total=s.planned())

        def on_trial(t):
            bar.console.print(line(t), highlight=False)
            bar.advance(task)

        return s.search(on_trial)
