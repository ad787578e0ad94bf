"""An image folder's files checked before training: each file opened by PIL and verified
(Image.open + verify: the format's header and structure, no pixels decoded; a PNG's chunks and
their checksums; a JPEG's end-of-image marker, which a file cut short lacks), in a pool of
threads (the work is mostly waiting on the disk). A file that cannot be read is named before
any process starts, instead of stopping the run at the batch that meets it (batch 1: mid-way)
or passing unseen when the run does not reach it. Damage inside the pixel data that leaves the
structure whole is found only by decoding, when a batch reads the file.

data.bad_images=error (the default) refuses the run naming every bad file; skip leaves them
out of the data set with a count said once. The launching process checks (runner.preflight)
and hands what it found to the workers it launches (hand_down: a file in the launch's folder,
its path in the environment), so with skip they leave out the same files without reading the
folder again; a worker with nothing handed down (a job that torchrun or Slurm started, a rank
on another node) checks the folder itself, quietly, once per process."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

PROGRESS_FROM = 2000
"""Folders of at least this many files show a progress bar while checked."""
SHOWN = 10
"""Bad files named in the one line (the count says how many more)."""
CHUNK = 256
"""Files a thread checks per task."""

_checked: dict[tuple[str, int], list[tuple[str, str]]] = {}
HANDED = "PARATRAIN_CHECKED_IMAGES"
"""The environment variable naming the launching process's findings (hand_down)."""


JPEG_TAIL = 4096
"""Bytes at a JPEG's end searched for its end-of-image marker (some writers pad after it)."""
JPEG_KINDS = ("JPEG", "MPO")
"""PIL's names for JPEG files (MPO: a multi-picture JPEG, as Ultra HDR photos are)."""


def problem(path: str) -> str | None:
    """-> why PIL cannot read this image file, or None when its header and structure hold."""
    from PIL import Image

    try:
        with open(path, "rb") as f, Image.open(f) as image:  # one open: a network disk's cost
            kind = image.format
            image.verify()
            # PIL's verify reads a JPEG's header only; a download cut short (the commonest
            # damage) loses the scan's end and its end-of-image marker: look for it at the end
            ends = kind not in JPEG_KINDS or _ends_jpeg(f)
    except Exception as e:  # PIL's readers raise OSError, SyntaxError, struct.error, ...
        return _why(e, path)
    # a whole JPEG may carry more after its marker (a phone's motion photo appends a video):
    # where the end holds none, decoding the pixels decides
    return None if ends else _undecodable(path)


def _undecodable(path: str) -> str | None:
    """-> why a JPEG without an end marker does not decode, or None when it does."""
    from PIL import Image

    try:
        with Image.open(path) as image:
            image.load()
    except Exception as e:  # PIL: "image file is truncated" and the like
        return f"no end-of-image marker, and {_why(e, path)}"
    return None


def _why(e: Exception, path: str) -> str:
    why = str(e).replace(f" '{path}'", "")  # PIL names the file: it is named already
    return f"{type(e).__name__}: {why}".strip()[:120]


def _ends_jpeg(f) -> bool:
    size = f.seek(0, os.SEEK_END)
    f.seek(max(0, size - JPEG_TAIL))
    return b"\xff\xd9" in f.read()


def clear() -> None:
    """Forget the folders checked (a next run in this process checks them again: a file may
    have been mended in between)."""
    _checked.clear()


def _problems(paths: Sequence[str]) -> list[str | None]:
    return [problem(p) for p in paths]


def unreadable(paths: Sequence[str], *, progress: bool = False) -> list[tuple[str, str]]:
    """-> (path, why) of each file in `paths` that cannot be read, in their order; a progress
    bar (progress=True) for PROGRESS_FROM files or more."""
    import contextlib
    from concurrent.futures import ThreadPoolExecutor

    # chunks: a million files are a few thousand tasks, not a million futures
    chunks = [paths[i : i + CHUNK] for i in range(0, len(paths), CHUNK)]
    workers = min(32, 4 * (os.cpu_count() or 1), max(len(chunks), 1))
    bar = None
    with contextlib.ExitStack() as stack:
        if progress and len(paths) >= PROGRESS_FROM:
            from rich.progress import Progress

            bar = stack.enter_context(Progress(transient=True))
            task = bar.add_task(f"checking {len(paths):,} images", total=len(paths))
        pool = stack.enter_context(ThreadPoolExecutor(workers, "paratrain-images"))
        problems: list[str | None] = []
        for chunk, found in zip(chunks, pool.map(_problems, chunks), strict=True):
            problems += found
            if bar is not None:
                bar.advance(task, len(chunk))
    return [(p, why) for p, why in zip(paths, problems, strict=True) if why is not None]


def bad_files(root: str, paths: Sequence[str], *, progress: bool = False) -> list[tuple[str, str]]:
    """unreadable(paths) of the folder `root`: what the launching process handed down for the
    same folder and file count, else checked here, once per process."""
    key = (os.path.abspath(root), len(paths))
    if key not in _checked:
        found = _handed().get(key)
        _checked[key] = found if found is not None else unreadable(paths, progress=progress)
    return _checked[key]


def hand_down(folder: Path) -> None:
    """This process's findings to the processes it launches: folder/checked_images.json, its
    path in HANDED (the launch removes both)."""
    if not _checked:
        return
    path = Path(folder) / "checked_images.json"
    try:
        path.write_text(json.dumps([[root, n, bad] for (root, n), bad in _checked.items()]))
    except OSError:  # best effort: without it each worker checks the folder itself
        return
    os.environ[HANDED] = str(path)


def _handed() -> dict[tuple[str, int], list[tuple[str, str]]]:
    where = os.environ.get(HANDED)
    if not where:
        return {}
    try:
        found = json.loads(Path(where).read_text())
    except (OSError, ValueError):  # gone or cut: the folder is checked here instead
        return {}
    return {(root, n): [(p, why) for p, why in bad] for root, n, bad in found}


def named(bad: list[tuple[str, str]], root: str) -> str:
    """The first SHOWN bad files, relative to root, with why; the count of the rest."""
    shown = "; ".join(f"{os.path.relpath(p, root)} ({why})" for p, why in bad[:SHOWN])
    more = len(bad) - SHOWN
    return shown + (f"; and {more:,} more" if more > 0 else "")
