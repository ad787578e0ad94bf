"""The paratrain command: parse, then call one function per subcommand.

User mistakes (paratrain.errors.UserError) print one line and exit with 2; nothing is written
before a config has been validated.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from paratrain.errors import UserError, one_line


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except UserError as e:
        print(f"paratrain: error: {one_line(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("paratrain: interrupted", file=sys.stderr)
        return 130


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="paratrain",
        description="Train PyTorch models on one GPU, many GPUs and many nodes; measure which way is fastest.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser(
        "run",
        help="train a model from a recipe",
        description=_run_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument(
        "recipe", nargs="?", help="YAML recipe (recipes/*.yaml); omit to start from defaults"
    )
    _add_run_options(run)
    run.add_argument(
        "--print-config", action="store_true", help="print the resolved config and exit"
    )
    run.add_argument(
        "--list-keys",
        action="store_true",
        help="list every config key with its default and meaning",
    )
    run.set_defaults(func=cmd_run)

    demo = sub.add_parser("demo", help="a one-minute run on real MNIST digits, on whatever is here")
    demo.add_argument(
        "--nproc", type=int, help="processes (default: all GPUs, else 2 CPU processes)"
    )
    demo.add_argument(
        "--epochs", type=int, default=None, help="passes over the 4,000 training digits"
    )
    demo.add_argument("--max-steps", type=int, default=None, help="stop after this many steps")
    demo.add_argument("--output-dir", help="where the result goes (default runs/demo-<time>)")
    demo.add_argument("--no-progress", action="store_true", help="no progress bar")
    demo.set_defaults(func=cmd_demo)
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
        help="replace or add an axis of the sweep's grid, e.g. launch.nproc=1,2,4 (repeatable)",
    )
    bench.add_argument("--repeats", type=int, help="runs per configuration (replaces the sweep's)")
    bench.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="TEXT",
        help="only the variants whose label contains TEXT (repeatable)",
    )
    bench.set_defaults(func=cmd_bench)

    report = sub.add_parser(
        "report", help="tables (and plots) from stored results, beside the seed's"
    )
    report.add_argument("--db", default="paratrain-results.db", help="SQLite results file")
    report.add_argument("--sweep", action="append", help="only these sweeps (repeatable)")
    report.add_argument("--format", choices=("md", "csv", "html"), default="md")
    report.add_argument("--out", help="write the report here instead of printing it")
    report.add_argument(
        "--plot",
        nargs="?",
        const="",
        metavar="DIR",
        help="write PNG plots to DIR (default: plots/ beside the results file); an HTML report "
        "embeds them either way",
    )
    report.add_argument("--export-csv", metavar="FILE", help="also export every stored run as CSV")
    report.set_defaults(func=cmd_report)

    export = sub.add_parser(
        "export",
        help="one checkpoint as one consolidated model (a Hugging Face folder, or safetensors)",
        description="Gathers a checkpoint's shards (any layout) in one process on the CPU: a "
        "causal LM becomes a Hugging Face folder (from_pretrained; a LoRA run's adapter in "
        "peft's format), any other model one model.safetensors under its own names.",
    )
    export.add_argument("checkpoint", help="a checkpoint (step_*), or a run folder: its newest")
    export.add_argument("out", help="a new folder for the model")
    export.add_argument("--config", help="the run's config.yaml (default: the run folder's)")
    export.set_defaults(func=cmd_export)

    flight = sub.add_parser(
        "flight",
        help="read flight recorder dumps: the collective a hung job's ranks did not all reach",
    )
    flight.add_argument("folder", help="a run folder, or its flight_recorder/ folder")
    flight.set_defaults(func=cmd_flight)

    doctor = sub.add_parser(
        "doctor",
        help="measure this machine (copies, memory, matmuls, disk, a recipe's loader) and advise",
        description="Versions, devices, NUMA; host<->device copies pinned and pageable, memory "
        "bandwidth, matmul TFLOP/s, the disk's read rate; with --recipe, the recipe's loader "
        "alone against a few of its training steps. Each measurement beside what it should be, "
        "then advice lines. Writes doctor.json.",
    )
    doctor.add_argument("--recipe", help="also time this recipe's loader against its steps")
    doctor.add_argument("--data-path", help="a data folder or file whose read rate to measure")
    doctor.add_argument("--out", default="doctor", help="where doctor.json goes (default doctor/)")
    doctor.add_argument("--quick", action="store_true", help="smaller sizes, fewer steps")
    doctor.set_defaults(func=cmd_doctor)

    plan = sub.add_parser(
        "plan",
        help="predict step time, throughput and memory of each strategy at N GPUs from a "
        "calibration here",
        description="Calibrates the recipe on one device here (a short profiled run), measures "
        "the link where there are several devices (else --bus-gbps), and predicts DDP, FSDP, "
        "HSDP, local SGD, tensor and pipeline parallel at each scale: step time, samples/s, "
        "scaling efficiency, exposed communication, memory per GPU and whether it fits. "
        "--measure runs the scales this machine has and prints each prediction beside its "
        "measurement. Writes plan.json.",
    )
    plan.add_argument("recipe", help="YAML recipe")
    plan.add_argument("--gpus", default="1,2,4,8,64", help="scales to predict (default 1,2,4,8,64)")
    plan.add_argument(
        "--gpus-per-node", type=int, help="GPUs of one node (default: this one's, or 8)"
    )
    plan.add_argument(
        "--bus-gbps",
        type=float,
        help="all-reduce bus bandwidth within a node, GB/s (default: measured)",
    )
    plan.add_argument(
        "--inter-node-gbps", type=float, help="all-reduce bus bandwidth across nodes, GB/s"
    )
    plan.add_argument(
        "--strategies", help="only these, comma-separated: ddp, fsdp, hsdp, local_sgd, tp, pp"
    )
    plan.add_argument("--every", type=int, default=16, help="local SGD's steps between averagings")
    plan.add_argument(
        "--measure", help="also run these scales here (e.g. 1,2,4) and show the error"
    )
    plan.add_argument("--steps", type=int, default=20, help="measured steps per run (default 20)")
    plan.add_argument(
        "--window",
        type=float,
        default=10.0,
        help="CPU: seconds the calibration's copies run together (default 10)",
    )
    plan.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override a recipe key"
    )
    plan.add_argument(
        "--out", default="plan", help="where plan.json and the runs go (default plan/)"
    )
    plan.set_defaults(func=cmd_plan)

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
    tune.add_argument("--out", default="tune", help="where tuned.yaml, tune.json and the trials go")
    tune.add_argument("--dry-run", action="store_true", help="list the levers and exit")
    tune.add_argument("--no-progress", action="store_true", help="no progress bar")
    tune.set_defaults(func=cmd_tune)

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
    comm.set_defaults(func=cmd_comm)
    return parser


def _comm_ops() -> tuple[str, ...]:
    from paratrain.collectives import OPS

    return OPS


RUN_HELP = """\
Train a model from a recipe, with any key overridden:

  paratrain run recipes/mnist_mobilenetv2.yaml --nproc 4 \\
      --set strategy=ddp-ds --set precision=fp16 --set data.pin_memory=true

Strategies (shorthands for degrees on one device mesh): {strategies}.
Precisions: fp64, fp32, tf32, fp16, bf16.
`--list-keys` shows every key. Under an outside torchrun or inside a SLURM step, paratrain
joins the job it finds instead of starting processes.
"""


def _run_help() -> str:
    from paratrain.runplan.strategies import STRATEGIES

    return RUN_HELP.format(strategies=", ".join(STRATEGIES))


def _add_run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key, e.g. --set data.batch_size=128 (repeatable)",
    )
    p.add_argument("--nproc", type=int, help="processes per node (launch.nproc)")
    p.add_argument("--nnodes", type=int, help="nodes (launch.nnodes)")
    p.add_argument("--node-rank", type=int, help="this node's rank (launch.node_rank)")
    p.add_argument("--rdzv-endpoint", help="host:port of the rendezvous (launch.rdzv_endpoint)")
    p.add_argument("--resume", help="checkpoint folder (step_*) or run directory to continue from")
    p.add_argument("--output-dir", help="where results go (output_dir)")


def _flag_overrides(args: argparse.Namespace) -> list[str]:
    flags = {
        "nproc": "launch.nproc",
        "nnodes": "launch.nnodes",
        "node_rank": "launch.node_rank",
        "rdzv_endpoint": "launch.rdzv_endpoint",
        "resume": "checkpoint.resume",
        "output_dir": "output_dir",
    }
    return [
        f"{key}={getattr(args, name)}"
        for name, key in flags.items()
        if getattr(args, name, None) is not None
    ]


def cmd_run(args: argparse.Namespace) -> int:
    from paratrain.config import describe_keys, load_config, parse_override, to_yaml

    if args.list_keys:
        for key, default, doc in describe_keys():
            print(f"{key} = {default}\n    {doc}")
        return 0
    overrides = args.overrides + _flag_overrides(args)
    cfg = load_config(args.recipe, overrides)
    from paratrain.runplan import resolve

    plan = resolve(cfg, given=[parse_override(item)[0] for item in overrides])
    if args.print_config:
        print(to_yaml(plan.config), end="")
        return 0
    from paratrain.runner import execute

    return execute(plan)


def cmd_bench(args: argparse.Namespace) -> int:
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


def cmd_report(args: argparse.Namespace) -> int:
    import tempfile
    from pathlib import Path

    from paratrain.bench import render
    from paratrain.bench.report import build_report, group_rows
    from paratrain.bench.store import Store

    if not Path(args.db).is_file():
        raise UserError(f"--db: no results file at {args.db}; run `paratrain bench` first")
    store = Store(args.db)
    sweeps = store.sweeps()
    names = args.sweep or list(sweeps)
    missing = [n for n in names if n not in sweeps]
    if missing:
        raise UserError(
            f"--sweep: {missing[0]} is not in {args.db}; stored: {', '.join(sweeps) or 'none'}"
        )
    data = {n: (sweeps[n][0], sweeps[n][1], store.rows(n)) for n in names}
    tables, preamble = build_report(data)
    # An HTML report embeds its plots (one file that opens offline): made for it when --plot
    # names no folder of its own, in a temporary one.
    with tempfile.TemporaryDirectory(prefix="paratrain-plots-") as scratch:
        plot_dir = args.plot
        if plot_dir == "":
            plot_dir = str(Path(args.db).resolve().parent / "plots")
        if plot_dir is None and args.format == "html":
            plot_dir = scratch
        by_sweep: dict[str, list[Path]] = {}
        if plot_dir is not None:
            from paratrain.bench.plots import plots_for

            for table, (n, (kind, _, rows)) in zip(tables, data.items(), strict=False):
                by_sweep[table.title] = plots_for(kind, n, group_rows(rows), Path(plot_dir))
        made = [p for ps in by_sweep.values() for p in ps]
        if args.format == "md":
            text = render.to_markdown(tables, preamble)
            if made:
                # Links relative to where the report is written, so they work beside it.
                base = Path(args.out).resolve().parent if args.out else Path.cwd()
                links = [os.path.relpath(p.resolve(), base) for p in made]
                text += (
                    "\n## Plots\n\n"
                    + "\n".join(f"![{p.stem}]({link})" for p, link in zip(made, links, strict=True))
                    + "\n"
                )
        elif args.format == "csv":
            text = render.to_csv(tables)
        else:
            text = render.to_html(tables, preamble, by_sweep)
        if args.plot is not None:
            print(
                f"paratrain report: plots: {', '.join(map(str, made)) or 'none (nothing to plot)'}",
                flush=True,
            )
    if args.export_csv:
        store.export_csv(args.export_csv)
    if args.out:
        Path(args.out).write_text(text)
        print(f"paratrain report: written to {args.out}")
    else:
        print(text)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from paratrain.export import export

    written = export(args.checkpoint, args.out, args.config)
    print(
        f"paratrain: step {written['step']} of {written['source']} -> {args.out} "
        f"({written['format']}: {', '.join(written['files'])})"
    )
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from pathlib import Path

    from paratrain import doctor

    if args.recipe and not Path(args.recipe).is_file():
        raise UserError(f"--recipe: no such file {args.recipe}")
    if args.data_path and not Path(args.data_path).exists():
        raise UserError(f"--data-path: no such file or folder {args.data_path}")
    if args.recipe:
        from paratrain.runplan import plan_of

        plan_of(args.recipe)  # a bad recipe: its one line now, before anything is timed
    found = doctor.run(args.recipe, Path(args.out), args.data_path, args.quick)
    doctor.print_report(found)
    print(f"paratrain doctor: {Path(args.out) / 'doctor.json'}")
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from paratrain.plan import command
    from paratrain.runplan import plan_of

    if not Path(args.recipe).is_file():
        raise UserError(f"recipe: no such file {args.recipe}")
    cfg = plan_of(args.recipe, args.set).config
    gpus = command.parse_scales(args.gpus, "--gpus")
    measure = command.parse_scales(args.measure, "--measure") if args.measure else None
    for flag, value in (("--steps", args.steps), ("--every", args.every)):
        if value < 1:
            raise UserError(f"{flag}: must be >= 1, got {value}")
    for flag, value in (
        ("--bus-gbps", args.bus_gbps),
        ("--inter-node-gbps", args.inter_node_gbps),
        ("--window", args.window),
    ):
        if value is not None and value <= 0:
            raise UserError(f"{flag}: must be > 0, got {value}")
    chosen = [x.strip() for x in args.strategies.split(",")] if args.strategies else None
    unknown = [x for x in chosen or [] if x not in command.predict.RUNS]
    if unknown:
        raise UserError(
            f"--strategies: unknown {unknown[0]!r}; choose from {', '.join(command.predict.RUNS)}"
        )
    if measure and set(measure) - set(gpus):
        gpus = sorted(set(gpus) | set(measure))
    found = command.run_plan(
        cfg,
        command.PlanArgs(
            gpus=gpus,
            per_node=args.gpus_per_node,
            bus_gbps=args.bus_gbps,
            inter_node_gbps=args.inter_node_gbps,
            every=args.every,
            measure=measure,
            steps=args.steps,
            out=Path(args.out),
            strategies=chosen,
            window_s=args.window,
        ),
    )
    command.print_plan(found)
    print(f"paratrain plan: {Path(args.out) / 'plan.json'}")
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


def cmd_tune(args: argparse.Namespace) -> int:
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
        db=Path(args.db),
        out=Path(args.out),
        sets=list(args.set),
        progress=not args.no_progress,
    )
    s = search.Search(args.recipe, cfg, levers, tune_args)
    print(f"paratrain tune: {s.planned()} trials at most, budget {budget:,.0f} s; levers:")
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
        f"({best.throughput / base.throughput:.2f}x); recipe {written['recipe']}, all trials "
        f"{written['json']}"
    )
    return 0


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


def cmd_flight(args: argparse.Namespace) -> int:
    from paratrain.flight import analyze, dump_folder, read_dumps, read_job

    dumps = read_dumps(args.folder)
    job = read_job(dump_folder(args.folder))
    print(f"paratrain: flight recorder dumps of ranks {', '.join(map(str, sorted(dumps)))}")
    if job.get("incident"):
        print(f"watchdog: {job['incident']}")
    for line in analyze(dumps, job.get("world_size")):
        print(line)
    return 0


def _cuda_for(device: str) -> bool:
    import torch

    return device != "cpu" and torch.cuda.is_available()


def cmd_comm(args: argparse.Namespace) -> int:
    import time

    import torch

    from paratrain import collectives, launch

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
    if launch.launched_by_torchrun():
        collectives.run(cfg)
        return 0
    cuda = torch.cuda.is_available() and cfg.device != "cpu"
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device: cuda was asked for but no GPU is visible")
    nproc = args.nproc or launch.default_nproc(True)
    if nproc < 2:
        raise UserError(f"--nproc: a collective needs at least 2 processes, got {nproc}")
    if cuda and nproc > torch.cuda.device_count():
        raise UserError(
            f"--nproc: {nproc} processes but {torch.cuda.device_count()} GPUs visible; "
            "use at most one per GPU, or --device cpu"
        )
    path = collectives.write_config(cfg)
    argv = launch.torchrun_argv(launch.LaunchConfig(), nproc, path, module="paratrain.collectives")
    print(f"paratrain: torchrun {' '.join(argv)}", flush=True)
    try:
        launch.run_torchrun(argv)
    except Exception as e:  # torchrun's ChildFailedError: the workers printed their own errors
        print(
            f"paratrain: comm failed ({type(e).__name__}); the workers' errors are above",
            file=sys.stderr,
        )
        return 1
    print(f"paratrain: results in {Path(cfg.out_dir) / 'result.json'}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    import torch

    from paratrain.config import load_config
    from paratrain.runner import execute

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    overrides = [
        "name=demo",
        "strategy=ddp-ds",
        "data.source=mnist-sample",
        "train.lr=0.002",
        "checkpoint.at_end=false",
        "train.lr_schedule=cosine",
    ]
    if gpus:
        # On GPUs the seed's model at a moderate size; a minute is a few epochs of 4,000 digits.
        overrides += [
            "model.name=mobilenet_v2",
            "data.image_size=64",
            "precision=bf16",
            "data.batch_size=64",
            "train.epochs=10",
            "data.num_workers=4",
        ]
    else:
        # On the CPU a small CNN at MNIST's native 28x28: ~96% held out in 12 epochs, ~15 s on
        # 2 cores (MobileNetV2 at 28x28 is slower and, stride 32 on 28 pixels, less accurate).
        overrides += [
            "model.name=tiny_cnn",
            "device=cpu",
            "data.batch_size=32",
            "train.epochs=12",
            "data.num_workers=0",
        ]
    overrides.append(f"launch.nproc={args.nproc or gpus or 2}")
    if args.epochs:
        overrides.append(f"train.epochs={args.epochs}")
    if args.max_steps:
        overrides.append(f"train.max_steps={args.max_steps}")
    if args.output_dir:
        overrides.append(f"output_dir={args.output_dir}")
    if args.no_progress:
        overrides.append("log.progress=false")
    from paratrain.runplan import resolve

    plan = resolve(load_config(None, overrides))
    cfg = plan.config
    print(
        f"paratrain demo: {cfg.model.name} on 4,000 real MNIST digits (1,000 held out), "
        f"{plan.nproc} {'GPU' if gpus else 'CPU'} processes, {plan.strategy}, {cfg.precision}",
        flush=True,
    )
    return execute(plan)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
