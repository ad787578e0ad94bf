"""`paratrain run`: train a model from a recipe."""

from __future__ import annotations

import argparse
import os


def add(sub) -> None:
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
    run.set_defaults(func=command)


def command(args: argparse.Namespace) -> int:
    from pathlib import Path

    from paratrain.config import describe_keys, to_yaml
    from paratrain.runplan import levers, plan_of

    if args.list_keys:
        for key, default, doc in describe_keys():
            print(f"{key} = {default}\n    {doc}")
        return 0
    if args.verbose:
        os.environ["PARATRAIN_VERBOSE"] = "1"
    if args.trust_code:  # the workers inherit it; a config cannot set it
        from paratrain.trust import TRUST_ENV

        os.environ[TRUST_ENV] = "1"
    recipe, overrides = args.recipe, args.overrides + _flag_overrides(args)
    done = None if args.overrides or not args.resume else finished_run(args.resume, recipe)
    if done:  # nothing left to train: said, not an error
        print(done, flush=True)
        return 0
    before = ()
    if recipe is None and args.resume:  # the run's own config, the overrides on top
        recipe, overrides = resumed_run(args.resume, args.output_dir, overrides, args.overrides)
        # its config.yaml holds the levers its plan decided: shown as decided, not as set
        before = levers.decided_in(Path(recipe).parent / "plan.json")
        from paratrain.trust import config_from

        config_from(Path(recipe).parent)  # modules beside a handed run folder are not yours
    elif recipe is not None:  # a run folder's config.yaml named as the recipe: the same rule
        from paratrain.trust import config_from, run_folder_of

        config_from(run_folder_of(recipe))
    # the recipe, the --set overrides and the flags: what the user gives wins (runplan)
    plan = plan_of(recipe, overrides, before)
    if args.print_config:
        print(to_yaml(plan.config), end="")
        return 0
    from paratrain.runner import execute

    return execute(plan, overwrite=args.overwrite)


def finished_run(resume: str, recipe: str | None = None) -> str | None:
    """The line for `--resume` of a run that finished (its result.json is written only at the
    end, after its last checkpoint), or None: a checkpoint newer than result.json (the run
    resumed or branched since, and stopped) goes on, and so does an earlier checkpoint named
    (step_*: the user goes back to it); with a recipe, only where the recipe trains as long as
    the run did (a longer one goes on)."""
    import json
    import re
    from pathlib import Path

    from paratrain.checkpoint import list_checkpoints

    path = Path(resume)
    found = (p for p in (path, path.parent, path.parent.parent) if (p / "config.yaml").is_file())
    folder = next(found, None)
    if folder is None or not (folder / "result.json").is_file():
        return None
    result = folder / "result.json"
    if recipe is not None and _length(recipe) != _length(folder / "config.yaml"):
        return None
    try:
        steps = json.loads(result.read_text())["summary"]["optimizer_steps"]
    except (ValueError, KeyError, TypeError):
        return None
    named = re.fullmatch(r"step_(\d+)", path.name)
    if named and int(named.group(1)) < steps:
        return None  # an earlier checkpoint named: the user goes back to it
    ckpts = Path(_checkpoint_dir(folder) or folder / "checkpoints")
    written = [(c / "manifest.json") for c in list_checkpoints(ckpts)]
    finished_at = result.stat().st_mtime_ns
    if any(m.is_file() and m.stat().st_mtime_ns > finished_at for m in written):
        return None
    return (
        f"paratrain: {folder} is a finished run ({steps} steps; its result.json): nothing to "
        "resume. To train on, give more steps: --set train.max_steps=N (or train.epochs)"
    )


def resumed_run(resume: str, output_dir, overrides: list[str], shown: list[str]):
    """`paratrain run --resume <run dir | its checkpoints | a step_*>` with no recipe: the run
    folder's config.yaml, continued in that folder -> (recipe, overrides)."""
    from pathlib import Path

    from paratrain.errors import UserError
    from paratrain.launch.runfolder import recover

    path = Path(resume)
    for p in (path, path.parent, path.parent.parent):
        recover(p)  # an --overwrite a killed command left undone: its config.yaml back first
    folder = next(
        (p for p in (path, path.parent, path.parent.parent) if (p / "config.yaml").is_file()), None
    )
    if folder is None:
        raise UserError(
            f"--resume: {resume} is no run folder (no config.yaml in it or above it); give the "
            "run's folder, or the recipe as well"
        )
    if output_dir is None:
        overrides = [*overrides, f"output_dir={folder}"]
    elsewhere = _checkpoint_dir(folder) if path.resolve() == folder.resolve() else None
    if elsewhere:  # the run's checkpoints are where its config put them
        overrides = [*overrides, f"checkpoint.resume={elsewhere}"]
    print(
        f"paratrain: resuming {folder} with its config.yaml"
        + (f"; overrides: {', '.join(shown)}" if shown else ""),
        flush=True,
    )
    return folder / "config.yaml", overrides


def _length(recipe) -> tuple | None:
    """How long a recipe trains (train.max_steps, train.epochs); None if it does not load."""
    from paratrain.config import load_config
    from paratrain.errors import UserError

    try:
        train = load_config(recipe).train
    except (UserError, ValueError, OSError):
        return None
    return train.max_steps, train.epochs


def _checkpoint_dir(folder) -> str | None:
    """The checkpoint.dir a run folder's config.yaml names (outside the folder), or None."""
    import yaml

    try:
        raw = yaml.safe_load((folder / "config.yaml").read_text())
        found = raw["checkpoint"]["dir"]
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        return None
    return str(found) if found else None


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
    p.add_argument(
        "--node-rank",
        type=int,
        help="this node's rank (launch.node_rank; c10d numbers the nodes as they join: not needed)",
    )
    p.add_argument("--rdzv-endpoint", help="host:port of the rendezvous (launch.rdzv_endpoint)")
    p.add_argument("--resume", help="checkpoint folder (step_*) or run directory to continue from")
    p.add_argument("--output-dir", help="where results go (output_dir)")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an earlier run in the output folder (its plan.json, result.json, step "
        "log, TensorBoard events, checkpoints, ... are removed; other files stay); without it "
        "such a folder is refused",
    )
    p.add_argument(
        "--trust-code",
        action="store_true",
        help="import and run the module:function a recipe or config names even when it is no "
        "file of yours (the standard library, an installed package, a file inside a run "
        "folder); without it such a config is refused",
    )
    p.add_argument(
        "--verbose",
        action="store_true",
        help="keep torchrun's own lines (each worker's exit, each signal it sends) and torch's native warnings",
    )


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


RUN_HELP = """\
Train a model from a recipe, with any key overridden:

  paratrain run recipes/mnist_mobilenetv2.yaml --nproc 4 \\
      --set strategy=ddp-ds --set precision=fp16 --set data.pin_memory=true

Strategies (shorthands for degrees on one device mesh): {strategies}.
Precisions: fp64, fp32, tf32, fp16, bf16.
`--list-keys` shows every key. Under an outside torchrun or inside a SLURM step, paratrain
joins the job it finds instead of starting processes.
"""
