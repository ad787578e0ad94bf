"""`paratrain plan`: predict each strategy's speed and memory at N GPUs from a calibration here."""

from __future__ import annotations

import argparse
from pathlib import Path

from paratrain.errors import UserError


def add(sub) -> None:
    plan = sub.add_parser(
        "plan",
        help="predict step time, throughput and memory of each strategy at N GPUs from a "
        "calibration here",
        description="Calibrates the recipe on one device here (a short profiled run), measures "
        "the link where there are several devices (else --bus-gbps), and predicts DDP, FSDP, "
        "HSDP, local SGD, tensor and pipeline parallel at each scale: step time, samples/s, "
        "scaling efficiency, exposed communication, memory per GPU and whether it fits (on the "
        "CPU: per process, the scales this machine's processes). "
        "--measure runs the scales this machine has and prints each prediction beside its "
        "measurement. A calibration whose step spreads (a loaded machine) is stopped at its "
        "first noisy window and measured again, and the plan refused if it stays noisy (at "
        "once on a loaded machine; --allow-noisy plans anyway). Writes forecast.json.",
    )
    plan.add_argument("recipe", nargs="?", help="YAML recipe (none with --validate or --hardware)")
    plan.add_argument(
        "--gpus",
        help="scales to predict: GPUs, or on the CPU processes (default 1,2,4,8,64 on GPUs; on "
        "the CPU 1, 2, 4, ... up to the processes of this machine)",
    )
    plan.add_argument(
        "--gpus-per-node",
        type=int,
        help="GPUs of one node (default: this one's, or 8); on the CPU processes of one machine",
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
        "--tries",
        type=int,
        default=3,
        help="measure a calibration whose step spreads more than 25%% (a loaded or noisy "
        "machine) again, at most this many times; then refuse (default 3)",
    )
    plan.add_argument(
        "--allow-noisy",
        action="store_true",
        help="plan from the steadiest try instead of refusing a machine too noisy to calibrate on",
    )
    plan.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override a recipe key"
    )
    plan.add_argument(
        "--out", help="where forecast.json and the runs go (default runs/plan-<recipe>)"
    )
    # the analytic plan, from a hardware profile and a shape, no recipe and no GPU
    paper = plan.add_argument_group("without a GPU (from a hardware profile and a shape)")
    paper.add_argument(
        "--validate",
        metavar="SUITE",
        help="print a suite of published rows beside the analytic prediction: published (all "
        "sources), torchtitan-h100 (torchtitan's Dec 2024 H100 tables and the lent H100 rows)",
    )
    paper.add_argument(
        "--hardware",
        metavar="PROFILE",
        help="a hardware profile (h100-sxm, h100-hbm2e-500w, h200, a100-sxm, or a .toml path): "
        "the best layout at each --gpus scale for --shape",
    )
    paper.add_argument(
        "--shape",
        help="the model's shape (llama3.1-8b, llama3.1-70b, llama3.1-405b, ...) or the path "
        "of a Llama-, Mistral- or Qwen-style config.json",
    )
    paper.add_argument(
        "--layout",
        help="one layout to price at --gpus N, comma-separated: tp=T, pp=P, dp_replicate=R, "
        "async_tp, schedule={gpipe,1f1b,interleaved}, stages_per_rank=V, microbatches=M (FSDP "
        "takes the rest of the GPUs; fsdp alone: FSDP over all); without it, the best layout is "
        "searched",
    )
    paper.add_argument(
        "--ac",
        choices=("none", "selective", "full", "layer"),
        help="--layout: activation checkpointing (selective: torchtitan's op policy; layer: every "
        "second layer whole, torchtitan's selective layer)",
    )
    paper.add_argument(
        "--local-batch", type=int, help="--layout: sequences a data-parallel rank (default 1)"
    )
    paper.add_argument(
        "--json",
        action="store_true",
        help="--layout: one JSON object; --validate: the suite as one (sources, each row's "
        "numbers, terms and flags, the summary)",
    )
    paper.add_argument("--seq-len", type=int, help="tokens a sequence (default 8192)")
    paper.add_argument("--global-batch", type=int, help="sequences a step (default: one a GPU)")
    paper.add_argument("--float8", action="store_true", help="float8 linears (torchao's)")
    paper.add_argument(
        "--eager",
        action="store_true",
        help="priced without torch.compile (each op its own kernel; the loss eager too)",
    )
    paper.add_argument(
        "--attention",
        choices=("flash", "cudnn", "flash_gqa", "cudnn_gqa"),
        help="sdpa's attention kernel (default: the profile's; cudnn on h100-sxm and h200, what "
        "torch 2.11 picks there; flash for stacks before it); _gqa: k/v heads shared through "
        "enable_gqa, as paratrain's decoder runs them (the h100-sxm, h100-hbm2e-500w and h200 "
        "profiles' rates table has them)",
    )
    paper.add_argument(
        "--loss",
        choices=("eager", "compiled", "fused"),
        help="how the loss runs: eager over fp32 logits, compiled (torchtitan since 2025-04; "
        "the default with compile), fused (paratrain's Triton loss)",
    )
    paper.add_argument("--terms", action="store_true", help="--validate: each term's seconds")
    plan.set_defaults(func=command)


def _recipe_only(args):
    return (
        ("--measure", args.measure),
        ("--strategies", args.strategies),
        ("--bus-gbps", args.bus_gbps),
        ("--inter-node-gbps", args.inter_node_gbps),
        ("--gpus-per-node", args.gpus_per_node),
        ("--set", args.set),
        ("--out", args.out),
    )


def _offline_only(args):
    return (
        ("--shape", args.shape),
        ("--seq-len", args.seq_len),
        ("--global-batch", args.global_batch),
        ("--float8", args.float8),
        ("--eager", args.eager),
        ("--loss", args.loss),
        ("--attention", args.attention),
        ("--terms", args.terms),
        ("--layout", args.layout),
        ("--ac", args.ac),
        ("--local-batch", args.local_batch),
        ("--json", args.json),
    )


def offline(args: argparse.Namespace) -> int:
    """--validate / --hardware: the analytic plan, no recipe, no GPU."""
    from paratrain.forecast import command
    from paratrain.forecast.analytic import offline

    if args.recipe:
        raise UserError("plan: --validate / --hardware take no recipe")
    given = [flag for flag, value in _recipe_only(args) if value]
    if given:
        raise UserError(f"plan: {given[0]} needs a recipe; --validate / --hardware take none")
    if args.validate:
        return validate(args, offline)
    return paper(args, command, offline)


def validate(args: argparse.Namespace, offline) -> int:
    """--validate: a published table beside the prediction."""
    extra = [f for f, v in _offline_only(args) if v and f not in ("--terms", "--json")]
    if extra:
        raise UserError(f"plan --validate: {extra[0]} is the table's own; leave it out")
    return offline.run_validate(args.validate, args.hardware, args.terms, as_json=args.json)


def paper(args: argparse.Namespace, command, offline) -> int:
    """--hardware: the best layout at each scale, or with --layout the one named."""
    if args.terms:
        raise UserError("plan: --terms goes with --validate")
    if not args.shape:
        raise UserError("plan --hardware: give --shape (e.g. llama3.1-70b)")
    numbers = ("--seq-len", args.seq_len), ("--global-batch", args.global_batch)
    for flag, value in (*numbers, ("--local-batch", args.local_batch)):
        if value is not None and value < 1:
            raise UserError(f"{flag}: must be >= 1, got {value}")
    if args.layout:
        return one_layout(args, command, offline)
    for flag, value in (
        ("--ac", args.ac),
        ("--local-batch", args.local_batch),
        ("--json", args.json),
    ):
        if value:
            raise UserError(f"plan: {flag} goes with --layout (the search weighs every choice)")
    return offline.run_layouts(
        args.hardware,
        args.shape,
        command.parse_scales(args.gpus or ",".join(map(str, command.GPU_SCALES)), "--gpus"),
        seq_len=args.seq_len or 8192,
        global_batch=args.global_batch,
        float8=args.float8,
        compile=not args.eager,
        loss=args.loss,  # None: what the compile choice implies
        attention=args.attention,
    )


def one_layout(args: argparse.Namespace, command, offline) -> int:
    """--layout: the one layout the user names, at one --gpus count."""
    if args.global_batch is not None:
        raise UserError("plan --layout: give --local-batch (sequences a data-parallel rank)")
    gpus = command.parse_scales(args.gpus, "--gpus") if args.gpus else None
    if not gpus or len(gpus) > 1:
        raise UserError("plan --layout: give one --gpus count (e.g. --gpus 64)")
    return offline.run_layout(
        args.hardware,
        args.shape,
        gpus[0],
        args.layout,
        ac=args.ac or "selective",
        local_batch=args.local_batch or 1,
        seq_len=args.seq_len or 8192,
        float8=args.float8,
        compile=not args.eager,
        loss=args.loss,  # None: what the compile choice implies
        attention=args.attention,
        as_json=args.json,
    )


def check_numbers_and_strategies(args: argparse.Namespace, runs) -> list[str] | None:
    """The recipe mode's numeric flags in range (one line, exit 2 each) -> --strategies' list
    (None: every strategy)."""
    for flag, value in (("--steps", args.steps), ("--every", args.every), ("--tries", args.tries)):
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
    unknown = [x for x in chosen or [] if x not in runs]
    if unknown:
        raise UserError(f"--strategies: unknown {unknown[0]!r}; choose from {', '.join(runs)}")
    return chosen


def command(args: argparse.Namespace) -> int:
    from paratrain.forecast import command
    from paratrain.runplan import plan_of

    if args.validate or args.hardware:
        return offline(args)
    if not args.recipe:
        raise UserError("plan: give a recipe, or --validate / --hardware with --shape")
    given = [flag for flag, value in _offline_only(args) if value]
    if given:
        raise UserError(f"plan: {given[0]} goes with --hardware (no recipe)")
    if not Path(args.recipe).is_file():
        raise UserError(f"recipe: no such file {args.recipe}")
    from paratrain.runplan.levers import unsettled

    # each calibration and measured layout decides its own levers (bf16 weights in one
    # process would be refused under FSDP)
    cfg = unsettled(plan_of(args.recipe, args.set))
    # None: the plan's own scales (this machine's processes on the CPU); --measure's join them
    gpus = command.parse_scales(args.gpus, "--gpus") if args.gpus else None
    measure = command.parse_scales(args.measure, "--measure") if args.measure else None
    chosen = check_numbers_and_strategies(args, command.predict.RUNS)
    out = Path(args.out or f"runs/plan-{Path(args.recipe).stem}")
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
            out=out,
            strategies=chosen,
            window_s=args.window,
            tries=args.tries,
            allow_noisy=args.allow_noisy,
        ),
    )
    command.print_plan(found)
    print(f"paratrain plan: {out / 'forecast.json'}")
    return 0
