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
import json
import os
import shutil
import time
import uuid
from pathlib import Path

from paratrain.checkpoint import list_checkpoints
from paratrain.checkpoint.integrity import owner
from paratrain.checkpoint.store import ASIDE
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
    hold no earlier run, unless overwrite (its files are set aside now, removed once the new
    run has its first checkpoint: settle). A resume or a restarted generation continues the
    run that is there."""
    out_dir = Path(cfg.output_dir)
    ckpt_dir = checkpoint_dir(cfg, out_dir)
    if overwrite:
        moved = set_aside_earlier_run(out_dir, ckpt_dir)
        if moved:
            print(
                f"paratrain: --overwrite: the earlier run's {', '.join(moved)} set aside in "
                f"{out_dir / OVERWRITTEN}; removed once this run has its first checkpoint, put "
                "back if it fails before",
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


# ---------------------------------------------------------------------------- the run's files

LEDGER = Path(".paratrain") / "files.json"
"""What the run in this folder wrote (relative paths), its id, and since when it writes here:
what --overwrite removes, exactly."""
OVERWRITTEN = Path(".paratrain") / "overwritten"
"""An earlier run's files, set aside by --overwrite until the new run's first checkpoint."""


def new_id() -> str:
    return uuid.uuid4().hex[:12]


def read_ledger(out_dir: Path) -> dict | None:
    try:
        found = json.loads((Path(out_dir) / LEDGER).read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) and isinstance(found.get("files"), list) else None


def run_id(out_dir: Path) -> str | None:
    """The id of the run whose files the folder holds (its checkpoints carry it)."""
    found = read_ledger(out_dir)
    return found.get("run") if found else None


def start_ledger(out_dir: Path, run: str, ckpt_dir: Path, new_session: bool) -> None:
    """Rank 0, before the run writes its first file here: the ledger made (or, for the same run
    continued, kept, with a new start when a new command continues it: files that appeared
    between two sessions are not the run's)."""
    found = read_ledger(out_dir)
    if found and found.get("run") == run and not new_session:
        return
    files = found["files"] if found and found.get("run") == run else []
    body = {"run": run, "files": files, "checkpoints": str(ckpt_dir)}
    _write_ledger(out_dir, body)
    since = (out_dir / LEDGER).stat().st_mtime_ns  # the file system's clock, as files' mtimes
    _write_ledger(
        out_dir, {"run": run, "files": files, "since_ns": since, "checkpoints": str(ckpt_dir)}
    )


def record(out_dir: Path) -> None:
    """The ledger brought up to date: the files the run wrote since its session started (under
    the names a run writes: RUN_FILES, config.yaml), beside those listed before."""
    found = read_ledger(out_dir)
    if not found or "since_ns" not in found:
        return
    since, listed = found["since_ns"], set(found["files"])
    for path in _run_files(out_dir):
        if path.stat().st_mtime_ns >= since:
            listed.add(str(path.relative_to(out_dir)))
    found["files"] = sorted(f for f in listed if (out_dir / f).is_file())
    _write_ledger(out_dir, found)


def _run_files(out_dir: Path):
    for name in ("config.yaml", *RUN_FILES):
        path = out_dir / name
        if path.is_file() and not path.is_symlink():
            yield path
        elif path.is_dir() and not path.is_symlink():
            yield from (p for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def _write_ledger(out_dir: Path, body: dict) -> None:
    path = out_dir / LEDGER
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(body, indent=1))
    tmp.replace(path)


def set_aside_earlier_run(out_dir: Path, ckpt_dir: Path) -> list[str]:
    """--overwrite: the earlier run's own files (its ledger's; a folder of an older paratrain
    without one: what a run writes, RUN_FILES) and its checkpoints moved aside -> what went.
    Another run's checkpoints in a shared checkpoint.dir are refused first, nothing moved."""
    ledger = read_ledger(out_dir)
    run = ledger.get("run") if ledger else None
    own, foreign = _checkpoints_of(run, ckpt_dir, ckpt_dir.parent == out_dir)
    if foreign:
        raise UserError(
            f"--overwrite: {ckpt_dir} also holds another run's checkpoints ({foreign[-1].name}); "
            "they are not this folder's to replace: give this run its own checkpoint.dir"
        )
    if ledger:
        files = [out_dir / f for f in ledger["files"] if (out_dir / f).is_file()]
    else:
        files = list(_run_files(out_dir)) if earlier_run(out_dir, ckpt_dir) else []
    files += [out_dir / LEDGER] if ledger else []
    if not files and not own:
        return []
    aside = out_dir / OVERWRITTEN
    for path in files:
        target = aside / "files" / path.relative_to(out_dir)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(path, target)
    for c in own:  # within their folder: a rename, whatever file system it is on
        _aside_of(c).parent.mkdir(parents=True, exist_ok=True)
        os.replace(c, _aside_of(c))
    body = {"files": [str(p.relative_to(out_dir)) for p in files]}
    body["checkpoints"] = [str(ckpt_dir / c.name) for c in own]
    (aside / "record.json").write_text(json.dumps(body, indent=1))
    moved = [f"{len(files)} files"] if files else []
    return moved + ([f"{len(own)} checkpoints"] if own else [])


def _checkpoints_of(run: str | None, ckpt_dir: Path, inside: bool) -> tuple[list, list]:
    """The checkpoints in ckpt_dir -> (the run's, another run's). One without an owner is the
    run's when its folder is the run folder's own checkpoints/, else another's."""
    own, foreign = [], []
    for c in list_checkpoints(ckpt_dir):
        held = owner(c).get("run")
        mine = held == run if held and run else inside
        (own if mine else foreign).append(c)
    return own, foreign


def _aside_of(checkpoint: Path) -> Path:
    """Where --overwrite keeps an earlier run's checkpoint: <checkpoints>/aside/overwritten/
    (no --resume looks below the checkpoint folder itself)."""
    return checkpoint.parent / ASIDE / "overwritten" / checkpoint.name


def drop_overwritten(out_dir: Path) -> None:
    """Rank 0 once the new run has a checkpoint (or the launching command once it succeeded
    without one): the earlier run's files set aside by --overwrite removed."""
    aside = Path(out_dir) / OVERWRITTEN
    try:
        body = json.loads((aside / "record.json").read_text())
    except (OSError, ValueError):
        return
    for c in body.get("checkpoints", []):
        shutil.rmtree(_aside_of(Path(c)), ignore_errors=True)
        for empty in (_aside_of(Path(c)).parent, _aside_of(Path(c)).parent.parent):
            with contextlib.suppress(OSError):
                empty.rmdir()
    shutil.rmtree(aside, ignore_errors=True)


def settle(out_dir: Path, succeeded: bool) -> None:
    """The launching command at the run's end: the ledger's last look (result.json, a crash's
    errors/), then what --overwrite set aside removed after a success, or put back after a
    failure before the new run's first checkpoint (the new run's own files removed first: a
    failed run with no checkpoint cannot be resumed, and TensorBoard would show both). A
    crash's tracebacks stay."""
    out_dir = Path(out_dir)
    record(out_dir)
    aside = out_dir / OVERWRITTEN
    if not (aside / "record.json").is_file():
        return
    if succeeded:
        drop_overwritten(out_dir)
        return
    body = json.loads((aside / "record.json").read_text())
    new = read_ledger(out_dir)
    for name in [*(new["files"] if new else []), str(LEDGER)]:
        if not name.startswith("errors/"):
            (out_dir / name).unlink(missing_ok=True)
    kept = []
    for name in body["files"]:
        source, target = aside / "files" / name, out_dir / name
        if target.exists():
            kept.append(name)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(source, target)
    for c in body["checkpoints"]:
        os.replace(_aside_of(Path(c)), c)
    if kept:
        print(f"paratrain: the earlier run's {', '.join(kept)} kept in {aside}", flush=True)
    else:
        shutil.rmtree(aside, ignore_errors=True)


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
