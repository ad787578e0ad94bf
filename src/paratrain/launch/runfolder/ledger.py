"""The ledger: which files of a run folder its run wrote (<run dir>/.paratrain/files.json), and
the run's id, which its checkpoints carry. It is what --overwrite removes, exactly.

A run folder is a file people hand each other, its ledger with it: every name read from one is
taken only where it is a relative path that stays inside the folder through no symbolic link
(`inside`); anything else is passed over. What the ledger lists: the files under the names a
run writes (PATTERNS) that appeared once the run's session started writing, a file the user
put beside them (notes.md in tensorboard/, a sample of their own in samples/) is not one.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path, PurePosixPath

LEDGER = Path(".paratrain") / "files.json"

# What a run writes into its folder (beside its checkpoints), as globs under it
PATTERNS = (
    "config.yaml",
    "plan.json",
    "result.json",
    "steps.jsonl",
    "curves.png",
    "tensorboard/events.out.tfevents.*",
    "errors/rank*.txt",  # a crash's tracebacks (job.py)
    "flight_recorder/rank_*",  # flight.py's dumps and the job's record
    "flight_recorder/job.json",
    "wandb/**/*",
    "profile.txt",  # train.profile_steps (profiling.py)
    "phases.png",
    "trace.json",
    "trace.json.gz",
    "samples/epoch_*.png",  # the GAN's sample grids
    "adapter/**/*",  # causal_lm's LoRA adapter and merged model (save_pretrained's folders)
    "merged/**/*",
)


def new_id() -> str:
    return uuid.uuid4().hex[:12]


def inside(folder: Path, name) -> Path | None:
    """folder/name where name is a relative path that stays in folder, through no symbolic
    link (folder itself included), else None."""
    if not isinstance(name, str) or not name or "\\" in name:
        return None
    rel = PurePosixPath(name)
    if rel.is_absolute() or any(part in ("..", ".", "") for part in rel.parts):
        return None
    path = Path(folder)
    if path.is_symlink():
        return None
    for part in rel.parts:
        path = path / part
        if path.is_symlink():
            return None
    return path


def read(out_dir: Path) -> dict | None:
    """The ledger, with only the names that stay inside the folder; None without one (or one
    that is no ledger)."""
    path = inside(Path(out_dir), str(LEDGER))
    try:
        found = json.loads(path.read_text()) if path else None
    except (OSError, ValueError):
        return None
    if not isinstance(found, dict) or not isinstance(found.get("run"), str):
        return None
    files = found.get("files") if isinstance(found.get("files"), list) else []
    found["files"] = [f for f in files if inside(Path(out_dir), f) is not None]
    return found


def run_id(out_dir: Path) -> str | None:
    """The id of the run whose files the folder holds (its checkpoints carry it)."""
    found = read(out_dir)
    return found["run"] if found else None


def start(out_dir: Path, run: str, new_session: bool) -> None:
    """Rank 0, before the run writes its first file here: the ledger made (or, for the same run
    continued, kept, with a new start when a new command continues it: files that appeared
    between two sessions are not the run's)."""
    found = read(out_dir)
    if found and found["run"] == run and not new_session:
        return
    files = found["files"] if found and found["run"] == run else []
    write(out_dir, {"run": run, "files": files})
    since = (Path(out_dir) / LEDGER).stat().st_mtime_ns  # the file system's clock, as files'
    write(out_dir, {"run": run, "files": files, "since_ns": since})


def record(out_dir: Path) -> None:
    """The ledger brought up to date: the files under a run's names (PATTERNS) written since
    its session started, beside those listed before."""
    out_dir = Path(out_dir)
    found = read(out_dir)
    if not found or not isinstance(found.get("since_ns"), int):
        return
    listed = set(found["files"])
    for pattern in PATTERNS:
        for path in out_dir.glob(pattern):
            name = str(path.relative_to(out_dir))
            new = path.is_file() and path.stat().st_mtime_ns >= found["since_ns"]
            if new and inside(out_dir, name):
                listed.add(name)
    found["files"] = sorted(f for f in listed if (out_dir / f).is_file())
    write(out_dir, found)


def write(out_dir: Path, body: dict) -> None:
    path = Path(out_dir) / LEDGER
    if inside(Path(out_dir), str(LEDGER.parent)) is None:
        return  # a .paratrain that is a link: not written through
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(body, indent=1))
    tmp.replace(path)
