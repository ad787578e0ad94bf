"""--overwrite: an earlier run replaced without losing it if the new run fails.

The launching command moves the earlier run's own files (its ledger's) into
<run dir>/.paratrain/overwritten/ and its checkpoints into <checkpoints>/aside/overwritten/
(renames within their folders), and keeps the record of what it moved in memory (and on disk,
for a command that is killed). The new run's rank 0 removes them once its first checkpoint is in
place; the command removes them when the run ends well without one, or puts them back when it
fails before (the new run's own files first removed: a failed run with no checkpoint cannot be
resumed, and TensorBoard would show both runs). A record left on disk by a killed command is
undone the same way by the next command into the folder.

Every name in a record or ledger is taken only inside its folder, through no link (ledger.inside):
a handed folder cannot name a file elsewhere to be moved or removed.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
from pathlib import Path

from paratrain.checkpoint import list_checkpoints
from paratrain.checkpoint.integrity import owner
from paratrain.checkpoint.store import ASIDE, remove_checkpoint
from paratrain.errors import UserError
from paratrain.launch.runfolder import ledger
from paratrain.launch.runfolder.ledger import LEDGER, inside

OVERWRITTEN = Path(".paratrain") / "overwritten"
ENV = "PARATRAIN_OVERWRITTEN"
"""Set by the launching command to the run folder whose earlier run it set aside: the run's rank 0
may remove that at its first checkpoint (a worker never acts on a record it was not told of)."""
_STEP = re.compile(r"step_\d+")


def set_aside(out_dir: Path, ckpt_dir: Path, earlier: list[str]) -> dict | None:
    """The earlier run's own files and checkpoints moved aside -> the record of what moved, or
    None where nothing was there. Refused in one line, nothing moved, where the folder has an
    earlier run (`earlier`) but no ledger, or ckpt_dir holds another run's checkpoints."""
    found = ledger.read(out_dir)
    if found is None:
        if earlier:
            raise UserError(
                f"--overwrite: {out_dir} holds a run ({', '.join(earlier)}) without the list of "
                f"the files it wrote ({LEDGER}: written by an older paratrain, or copied without "
                "it); paratrain removes only files it knows its run wrote: move the folder away, "
                "or give another output_dir"
            )
        return None
    own, foreign = _checkpoints_of(found["run"], ckpt_dir, ckpt_dir.parent == out_dir)
    if foreign:
        raise UserError(
            f"--overwrite: {ckpt_dir} also holds another run's checkpoints ({foreign[-1].name}); "
            "they are not this folder's to replace: give this run its own checkpoint.dir"
        )
    files = [f for f in found["files"] if (out_dir / f).is_file()] + [str(LEDGER)]
    aside = out_dir / OVERWRITTEN
    if inside(out_dir, str(OVERWRITTEN)) is None or aside.exists():
        raise UserError(
            f"--overwrite: {aside} is there already (a replacement that did not finish); "
            "run once more without --overwrite to put it back"
        )
    for name in files:
        target = aside / "files" / name
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(out_dir / name, target)
    for c in own:  # within their folder: a rename, whatever file system it is on
        _aside_of(ckpt_dir, c.name).parent.mkdir(parents=True, exist_ok=True)
        os.replace(c, _aside_of(ckpt_dir, c.name))
    record = {"files": files, "checkpoints": [c.name for c in own], "ckpt_dir": str(ckpt_dir)}
    (aside / "record.json").write_text(json.dumps(record, indent=1))
    return record


def _checkpoints_of(run: str, ckpt_dir: Path, inside_run: bool) -> tuple[list, list]:
    """The checkpoints in ckpt_dir -> (the run's, another run's). One without an owner is the
    run's when its folder is the run folder's own checkpoints/, else another's."""
    own, foreign = [], []
    for c in list_checkpoints(ckpt_dir):
        held = owner(c).get("run")
        mine = held == run if held else inside_run
        (own if mine else foreign).append(c)
    return own, foreign


def _aside_of(ckpt_dir: Path, name: str) -> Path:
    """Where --overwrite keeps an earlier run's checkpoint: <checkpoints>/aside/overwritten/
    (no --resume looks below the checkpoint folder itself)."""
    return Path(ckpt_dir) / ASIDE / "overwritten" / name


def _checkpoint_names(record: dict) -> list[str]:
    names = record.get("checkpoints") if isinstance(record.get("checkpoints"), list) else []
    return [n for n in names if isinstance(n, str) and _STEP.fullmatch(n)]


def _aside_checkpoint(ckpt_dir: Path, name: str) -> Path | None:
    """The set-aside checkpoint `name`, where its folders are no links."""
    return inside(Path(ckpt_dir), f"{ASIDE}/overwritten/{name}")


def read_record(out_dir: Path) -> dict | None:
    """A record left on disk (by this launch, or by a command that was killed), its names
    checked: files inside the folder, checkpoints named step_<N>."""
    path = inside(Path(out_dir), f"{OVERWRITTEN}/record.json")
    try:
        found = json.loads(path.read_text()) if path else None
    except (OSError, ValueError):
        return None
    if not isinstance(found, dict) or not isinstance(found.get("ckpt_dir"), str):
        return None
    files = found.get("files") if isinstance(found.get("files"), list) else []
    found["files"] = [f for f in files if inside(Path(out_dir), f) is not None]
    found["checkpoints"] = _checkpoint_names(found)
    return found


def drop(out_dir: Path, record: dict | None = None) -> None:
    """The earlier run's set-aside files and checkpoints removed: the new run has its first
    checkpoint, or ended well without one. A checkpoint loses only the files a checkpoint holds
    (store.remove_checkpoint)."""
    out_dir = Path(out_dir)
    record = record or read_record(out_dir)
    if record is None:
        return
    ckpt_dir = Path(record["ckpt_dir"])
    for name in _checkpoint_names(record):
        found = _aside_checkpoint(ckpt_dir, name)
        if found is not None and found.is_dir():
            remove_checkpoint(found)
            if found.exists():  # a file of someone's was in it: kept, and said where
                print(f"paratrain: {found} kept: it holds files that are no checkpoint's")
    for empty in (ckpt_dir / ASIDE / "overwritten", ckpt_dir / ASIDE):
        with contextlib.suppress(OSError):
            empty.rmdir()
    aside = inside(out_dir, str(OVERWRITTEN))
    if aside is not None and aside.is_dir():
        shutil.rmtree(aside)


def restore(out_dir: Path, record: dict, remove_new: bool) -> list[str]:
    """The earlier run's files and checkpoints put back -> the names that could not be (their
    place taken: kept in the aside folder, which then stays). remove_new: the new run's own
    files go first (its ledger's, a crash's tracebacks kept)."""
    out_dir = Path(out_dir)
    if remove_new:
        new = ledger.read(out_dir)
        for name in [*(new["files"] if new else []), str(LEDGER)]:
            path = inside(out_dir, name)
            if path is not None and not name.startswith("errors/") and path.is_file():
                path.unlink()
    kept = []
    for name in record["files"]:
        source = inside(out_dir / OVERWRITTEN / "files", name)
        target = inside(out_dir, name)
        if source is None or target is None or not source.is_file() or target.exists():
            kept.append(name)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(source, target)
    ckpt_dir = Path(record["ckpt_dir"])
    for name in _checkpoint_names(record):
        source, target = _aside_checkpoint(ckpt_dir, name), inside(ckpt_dir, name)
        if source is None or target is None or not source.is_dir() or target.exists():
            kept.append(name)
            continue
        os.replace(source, target)
    if not kept:
        drop(out_dir, {"ckpt_dir": str(ckpt_dir), "checkpoints": []})
    return kept


def settle(out_dir: Path, succeeded: bool, record: dict | None) -> None:
    """The launching command at the run's end: the ledger's last look (result.json, a crash's
    tracebacks), then what this command set aside (`record`: only that) removed after a
    success, or put back after a failure before the new run's first checkpoint."""
    out_dir = Path(out_dir)
    ledger.record(out_dir)
    os.environ.pop(ENV, None)
    if record is None or read_record(out_dir) is None:
        return  # nothing set aside, or the new run's first checkpoint removed it
    if succeeded:
        drop(out_dir, record)
        return
    kept = restore(out_dir, record, remove_new=True)
    if kept:
        print(f"paratrain: the earlier run's {', '.join(kept)} kept in {out_dir / OVERWRITTEN}")


def recover(out_dir: Path) -> None:
    """A replacement whose command was killed before it ended (kill -9, a closed terminal): its
    new run never reached a checkpoint (its first one removes the record), so it is undone as
    a failed one is: the new run's files (its ledger's, inside the folder) removed, the earlier
    run's put back, said once."""
    record = read_record(out_dir)
    if record is None:
        return
    kept = restore(out_dir, record, remove_new=True)
    print(
        f"paratrain: {out_dir}: an --overwrite that did not finish left the earlier run aside; "
        + (
            f"put back but {', '.join(kept)} (kept in {out_dir / OVERWRITTEN})"
            if kept
            else "put back"
        ),
        flush=True,
    )
