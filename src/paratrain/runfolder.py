"""The run folder (output_dir): where a run's files go, what makes a folder an earlier run's,
and what a new run may do to one.

A fresh run does not start in a folder that holds an earlier run: its files would replace the
earlier run's (config.yaml, plan.json, result.json, steps.jsonl, curves.png) and TensorBoard
would show both runs as one. It is refused in one line that names the files, before any
process starts, unless the run continues the earlier one (--resume, a restarted generation) or
replaces it (--overwrite: the earlier run's own files are removed first, other files are left).

A run writes into its folder once its first step has run (trainer.py): a mistake found before
(a corrupt image in the first batch, a model that does not fit its data) leaves the folder as it
was; a folder the launch made for it is removed again if nothing went into it. A crash keeps
its tracebacks (<run dir>/errors/, job.py) for diagnosis."""

from __future__ import annotations

import contextlib
import shutil
import time
from pathlib import Path

from paratrain.checkpoint import list_checkpoints
from paratrain.distributed import process_group as pg
from paratrain.errors import UserError

# What a run writes into its folder (beside checkpoints/): what --overwrite removes.
# config.yaml is kept until the new run writes its own (it may be the recipe being run: bench
# and the plan's calibrations run <folder>/config.yaml into <folder>).
RUN_FILES = (
    "plan.json",
    "result.json",
    "steps.jsonl",
    "curves.png",
    "tensorboard",
    "errors",  # a crash's tracebacks (job.py)
    "flight_recorder",
    "wandb",
    "profile.txt",  # train.profile_steps (profiling.py)
    "phases.png",
    "trace.json",
    "trace.json.gz",
    "samples",  # the GAN's sample grids
    "adapter",  # causal_lm's LoRA adapter and merged model
    "merged",
)


def output_dir(cfg) -> str:
    """Where the run's files go: output_dir, or runs/<name>-<time>. Decided here only: the
    launching command names the folder before anything checks it (runner.with_output_dir);
    workers torchrun started directly take rank 0's name (trainer/setup.py)."""
    return cfg.output_dir or str(Path("runs") / f"{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}")


def restarted() -> bool:
    """This worker was started again by torchrun's agent after a failure (here or on another
    node): it continues the run in its folder."""
    return pg.generation() > 0


def checkpoint_dir(cfg, out_dir: Path) -> Path:
    return Path(cfg.checkpoint.dir) if cfg.checkpoint.dir else out_dir / "checkpoints"


def earlier_run(out_dir: Path, ckpt_dir: Path) -> list[str]:
    """The files that make out_dir an earlier run's: its config.yaml with any of plan.json,
    result.json, steps.jsonl, TensorBoard events or checkpoints (in ckpt_dir); [] for an empty
    folder or one of other files (a bench run's folder holds the config.yaml it is given)."""
    if not (out_dir / "config.yaml").is_file():
        return []
    found = [
        name for name in ("plan.json", "result.json", "steps.jsonl") if (out_dir / name).is_file()
    ]
    if any((out_dir / "tensorboard").glob("events.out.tfevents.*")):
        found.append("tensorboard/")
    checkpoints = list_checkpoints(ckpt_dir)
    if checkpoints:
        where = ckpt_dir.name if ckpt_dir.parent == out_dir else str(ckpt_dir)
        found.append(f"{where}/{checkpoints[-1].name}")
    return ["config.yaml", *found] if found else []


def refuse_other_run(ckpt_dir: Path) -> None:
    """A fresh run must not start where another run's checkpoints are: it would mix with them
    (and keep=N would delete its own newest first)."""
    found = list_checkpoints(ckpt_dir)
    if found:
        raise UserError(
            f"output_dir: {ckpt_dir} holds another run's checkpoints (newest {found[-1].name}); "
            "continue it with checkpoint.resume=auto, or give this run a new output_dir"
        )


def claim(cfg, overwrite: bool) -> None:
    """The launching process, once every other check has passed: a fresh run's folder must
    hold no earlier run, unless overwrite (its files are removed now). A resume or a restarted
    generation continues the run that is there."""
    out_dir = Path(cfg.output_dir)
    ckpt_dir = checkpoint_dir(cfg, out_dir)
    if overwrite:
        removed = remove_earlier_run(out_dir, ckpt_dir)
        if removed:
            print(
                f"paratrain: --overwrite: removed the earlier run's {', '.join(removed)} "
                f"from {out_dir}",
                flush=True,
            )
        return
    found = earlier_run(out_dir, ckpt_dir)
    if found:
        raise UserError(
            f"output_dir: {out_dir} holds an earlier run ({', '.join(found)}); continue it with "
            f"--resume {out_dir}, replace it with --overwrite (paratrain.train: overwrite=True), or "
            "give another output_dir"
        )
    refuse_other_run(ckpt_dir)  # checkpoint.dir elsewhere, another run's


def remove_earlier_run(out_dir: Path, ckpt_dir: Path) -> list[str]:
    """The earlier run's own files (RUN_FILES, its checkpoints) out of the folder -> what went;
    config.yaml stays until this run writes its own, other files stay."""
    removed = []
    for name in RUN_FILES:
        path = out_dir / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
            removed.append(f"{name}/")
        elif path.exists() or path.is_symlink():
            path.unlink()
            removed.append(name)
    # its checkpoints (and a killed save's unfinished ones); the folder too when that leaves it
    # empty and it is the run folder's own
    own = ckpt_dir.parent == out_dir
    stale = [*list_checkpoints(ckpt_dir), *ckpt_dir.glob(".step_*.tmp")]
    for path in stale:
        shutil.rmtree(path)
    if stale:
        removed.append(f"{ckpt_dir.name if own else ckpt_dir}/step_* ({len(stale)})")
        if own and not any(ckpt_dir.iterdir()):
            ckpt_dir.rmdir()
    return removed


def made_for(out_dir: Path) -> list[Path]:
    """The folders a launch into out_dir may make before the run's first step (out_dir, its
    flight_recorder/ made early for NCCL's own dumps) that do not exist yet."""
    return [p for p in (out_dir / "flight_recorder", out_dir) if not p.exists()]


def remove_if_empty(folders: list[Path]) -> None:
    """The folders made for a run that ended before anything went into them (a mistake found
    before its first step), removed again; a folder with anything in it is left."""
    for folder in folders:
        # not empty (a crash's errors/, a step's files), or never made: left
        with contextlib.suppress(OSError):
            folder.rmdir()
