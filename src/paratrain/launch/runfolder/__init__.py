"""The run folder (output_dir): where a run's files go, what makes a folder an earlier run's,
and what a new run may do to one.

A fresh run does not start in a folder that holds an earlier run: its files would replace the
earlier run's (config.yaml, plan.json, result.json, steps.jsonl, curves.png) and TensorBoard
would show both runs as one. It is refused in one line that names the files, before any
process starts, unless the run continues the earlier one (--resume, a restarted generation) or
replaces it (--overwrite). A run keeps the list of the files it wrote (.paratrain/files.json,
the ledger) and its checkpoints carry its id: --overwrite moves exactly those aside (a file of
the user's in the folder, another run's checkpoints in a shared checkpoint.dir are not
touched), removes them once the new run has its first checkpoint and puts them back if it
fails before: a failed replacement leaves the earlier run whole.

A run writes into its folder once its first step has run (trainer.py): a mistake found before
(a corrupt image in the first batch, a model that does not fit its data) leaves the folder as it
was; a folder the launch made for it is removed again if nothing went into it. A crash keeps
its tracebacks (<run dir>/errors/, job.py) for diagnosis."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from paratrain.checkpoint import list_checkpoints
from paratrain.distributed import process_group as pg
from paratrain.errors import UserError
from paratrain.launch.runfolder import overwrite as overwriting
from paratrain.launch.runfolder.ledger import LEDGER, new_id, record, run_id
from paratrain.launch.runfolder.ledger import start as start_ledger
from paratrain.launch.runfolder.overwrite import recover, settle

__all__ = [
    "LEDGER",
    "check_checkpoint_dir",
    "checkpoint_dir",
    "claim",
    "drop_overwritten",
    "earlier_run",
    "made_for",
    "new_id",
    "output_dir",
    "record",
    "recover",
    "refuse_other_run",
    "remove_if_empty",
    "restarted",
    "run_id",
    "settle",
    "start_ledger",
]


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


def claim(cfg, overwrite: bool) -> dict | None:
    """The launching process, once every other check has passed: a fresh run's folder must
    hold no earlier run, unless overwrite: its files are set aside now (overwrite.py) -> the
    record of what was, for settle() at the run's end. A resume or a restarted generation
    continues the run that is there."""
    out_dir = Path(cfg.output_dir)
    ckpt_dir = checkpoint_dir(cfg, out_dir)
    found = earlier_run(out_dir, ckpt_dir)
    if overwrite:
        record = overwriting.set_aside(out_dir, ckpt_dir, found)
        if record:
            moved = [f"{len(record['files']) - 1} files"]  # (its ledger is one of them)
            moved += [f"{len(record['checkpoints'])} checkpoints"] if record["checkpoints"] else []
            os.environ[overwriting.ENV] = str(out_dir)
            print(
                f"paratrain: --overwrite: the earlier run's {' and '.join(moved)} set aside in "
                f"{out_dir / overwriting.OVERWRITTEN}; removed once this run has its first "
                "checkpoint, put back if it fails before",
                flush=True,
            )
        return record
    if found:
        raise UserError(
            f"output_dir: {out_dir} holds an earlier run ({', '.join(found)}); continue it with "
            f"--resume {out_dir}, replace it with --overwrite (paratrain.train: overwrite=True), or "
            "give another output_dir"
        )
    refuse_other_run(ckpt_dir)  # checkpoint.dir elsewhere, another run's
    return None


def check_checkpoint_dir(cfg) -> None:
    """checkpoint.dir may not be, or lie in, another run's folder: `--resume` of that run would
    find this run's checkpoints, and its --overwrite would meet them."""
    if not cfg.checkpoint.dir or not cfg.output_dir:
        return
    out_dir = Path(cfg.output_dir).resolve()
    ckpt_dir = Path(cfg.checkpoint.dir).resolve()
    for folder in (ckpt_dir, *ckpt_dir.parents):
        if folder == out_dir or out_dir in folder.parents:
            return  # this run's own folder (or one inside it)
        if (folder / "config.yaml").is_file() and (
            (folder / LEDGER).is_file() or earlier_run(folder, folder / "checkpoints")
        ):
            raise UserError(
                f"checkpoint.dir: {cfg.checkpoint.dir} lies in the run folder {folder} of another "
                "run; give this run's checkpoints a folder of their own"
            )


def drop_overwritten(out_dir: Path) -> None:
    """Rank 0 once its run's first checkpoint is in place: what this launch's --overwrite set
    aside removed (only where the launching command said it set some aside in this folder)."""
    if os.environ.get(overwriting.ENV) == str(out_dir):
        overwriting.drop(out_dir)


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
