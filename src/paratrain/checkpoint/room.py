"""Room for a checkpoint: what one needs, what its folder has, and a save that fails for want of
either said in one line.

A disk that fills during a save (ENOSPC), a quota (EDQUOT), a file size limit (EFBIG), a folder
that cannot be written (EROFS, EACCES, EPERM): the save's error is one line naming the folder,
the bytes the checkpoint needs and those free there, exit code 2 as for any condition the user
mends (free space, or another checkpoint.dir) - the same line preflight gives when it finds no
room before step 1. The half-written `.step_*.tmp` is removed; nothing of the checkpoints
before it is touched (they are renamed into place whole and pruned only after a newer one is),
so a resume goes on from the last one.

torch's zip writer reports a full disk as "unexpected pos" without the OSError, and DCP wraps
every rank's error in a CheckpointException, a BaseException that no `except Exception` sees:
each is looked into, and a save that failed while its folder has less room than it needs counts
as a full disk."""

from __future__ import annotations

import contextlib
import errno
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

from paratrain.errors import UserError

NO_ROOM = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
NOT_WRITABLE = {errno.EROFS, errno.EACCES, errno.EPERM}


def size(n: float | None) -> str:
    if n is None:
        return "?"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def free_bytes(folder: Path) -> int | None:
    """Free bytes (for an unprivileged user) on the file system that holds folder, or would
    hold it once made."""
    p = Path(folder).absolute()
    ancestor = next((a for a in (p, *p.parents) if a.exists()), None)
    try:
        return shutil.disk_usage(ancestor).free if ancestor is not None else None
    except OSError:
        return None


def folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in Path(folder).rglob("*") if f.is_file())


def newest_under(path: Path) -> Path | None:
    """The newest checkpoint folder a resume path names: itself, its newest step_*, or its
    checkpoints/' newest."""
    if (path / "train_state.pt").is_file():
        return path
    for d in (path, path / "checkpoints"):
        found = sorted(p for p in d.glob("step_*") if p.is_dir()) if d.is_dir() else []
        if found:
            return found[-1]
    return None


def state_bytes(*states) -> int:
    """The tensors' bytes in (nested) state dicts, each whole (a DTensor's numel is the
    global one): what one copy of them on disk takes."""
    import torch

    total, todo = 0, list(states)
    while todo:
        x = todo.pop()
        if isinstance(x, torch.Tensor):
            total += x.numel() * x.element_size()
        elif isinstance(x, dict):
            todo += x.values()
        elif isinstance(x, (list, tuple)):
            todo += x
    return total


def estimate(model, optimizer) -> int:
    """A checkpoint's bytes before the optimizer has state: the weights it saves (the trained
    ones when some are frozen), and per trained weight the moments its optimizer keeps (two
    for Adam's kind, one for momentum SGD; none assumed for others). Low rather than high:
    it refuses a run only when even this does not fit."""
    params = dict(model.named_parameters())
    frozen = any(not p.requires_grad for p in params.values())
    weights = {
        k: v
        for k, v in model.state_dict().items()
        if not (frozen and k in params and not params[k].requires_grad)
    }
    total = state_bytes(weights)
    for opt in optimizer if isinstance(optimizer, list) else [optimizer]:
        moments = _moments(opt)
        for group in opt.param_groups:
            total += moments * sum(p.numel() * p.element_size() for p in group["params"])
    return total


def _moments(opt) -> int:
    if type(opt).__module__.split(".")[0] != "torch" and "MasterAdamW" not in type(opt).__name__:
        return 0  # (torchao's low-bit states are smaller than the weights)
    if "betas" in opt.defaults:
        return 2
    return 1 if opt.defaults.get("momentum", 0) else 0


def writes(ckpt) -> bool:
    """checkpoint.*: whether the run may write a checkpoint at all."""
    return bool(ckpt.at_end or ckpt.every_steps or ckpt.on_interrupt)


def preflight(ckpt, folder: Path) -> None:
    """Before any process starts: a resumed run's checkpoints are the size of the one it
    resumes, and its folder must have room for one more (the oldest is pruned only after)."""
    newest = newest_under(folder if ckpt.resume == "auto" else Path(ckpt.resume))
    if newest is not None:
        check(folder, folder_bytes(newest), f"a checkpoint (as {newest.name})")


def check(folder: Path, needed: int, what: str, key: str = "checkpoint.dir") -> None:
    """Refuse (one line) a folder whose file system has less room than `needed` bytes."""
    free = free_bytes(folder)
    if free is not None and free < needed:
        raise UserError(
            f"{key}: {folder} has {size(free)} free and {what} needs about {size(needed)}; free "
            "some space, or set checkpoint.dir to a folder with room"
        )


def disk_error(e: BaseException) -> OSError | None:
    """The OSError of a full, read-only or over-quota disk in e: itself, its chain, or (DCP)
    any rank's error a CheckpointException gathered."""
    seen, todo = set(), [e]
    while todo:
        x = todo.pop()
        if x is None or id(x) in seen:
            continue
        seen.add(id(x))
        if isinstance(x, OSError) and x.errno in NO_ROOM | NOT_WRITABLE:
            return x
        todo += [x.__cause__, x.__context__]
        failures = getattr(x, "failures", None)
        if isinstance(failures, dict):  # {rank: (exception, its stack)}
            todo += [v[0] if isinstance(v, tuple) else v for v in failures.values()]
    return None


def failed_line(
    e: BaseException, folder: Path, step: int, needed: int | None, kept: Path | None
) -> str | None:
    """The one line for a save that failed for want of room or of a writable folder; None for
    any other failure."""
    found = disk_error(e)
    free = free_bytes(folder)
    short = found is None and needed is not None and free is not None and free < needed
    if found is None and not short:
        return None
    reason = found.strerror if found is not None else "no space left on device"
    previous = f"{kept.name} is kept" if kept is not None else "no checkpoint before it"
    line = (
        f"checkpoint.dir: step {step}'s checkpoint not saved in {folder}: {reason} (it needs "
        f"about {size(needed)}, {size(free)} free); {previous}; "
    )
    if found is not None and found.errno in NOT_WRITABLE:
        return line + "set checkpoint.dir to a folder this user can write"
    return line + "free some space, or set checkpoint.dir to a folder with room"


@contextlib.contextmanager
def saving(
    folder: Path, tmp: Path, step: int, needed: Callable[[], int | None], kept: Path | None
) -> Iterator[None]:
    """A save's writes: one that fails loses its unfinished folder (`tmp`) only; a full or
    read-only disk is one line (UserError); any other failure an Exception the worker's
    report sees (DCP's CheckpointException is not one)."""
    try:
        yield
    except (KeyboardInterrupt, SystemExit, UserError):
        raise
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        line = failed_line(e, folder, step, _quietly(needed), kept)
        if line:
            raise UserError(line) from None
        if isinstance(e, Exception):
            raise
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise RuntimeError(f"step {step}'s checkpoint not saved in {folder}: {first}") from e


def _quietly(needed: Callable[[], int | None]) -> int | None:
    try:
        return needed()
    except Exception:  # noqa: BLE001 - an estimate for a message: none rather than a new error
        return None
