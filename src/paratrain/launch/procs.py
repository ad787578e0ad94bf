"""A launch's processes as Linux's /proc shows them: whether one is stopped (SIGSTOP, Ctrl-Z),
whether the kernel's OOM killer has killed anything, and the ending of every process a launch
started, its workers' DataLoader workers and fork servers included, however it ended.

Why the last: a worker killed with SIGKILL (kill -9, the OOM killer) leaves its children
behind. A DataLoader worker forked from its rank's fork server watches that server, not the
rank, so it never notices; the fork server lives on for it, and both hold the launching
command's stdout, so that `paratrain run ... | tee log` never returned. While a launch runs,
its command is a child subreaper (prctl PR_SET_CHILD_SUBREAPER): what is orphaned stays its
descendant instead of init's; when the launch ends, every process that carries the launch's
mark in its environment or is a new descendant is ended (SIGTERM, then SIGKILL) and reaped.

Nothing here imports the rest of paratrain; off Linux each function answers None / does
nothing."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

PROC = Path("/proc")
PR_SET_CHILD_SUBREAPER = 36


def stat_fields(pid: int) -> list[str] | None:
    """/proc/<pid>/stat's fields from the state on (the command name, which may hold spaces
    and parentheses, left out): [state, ppid, pgrp, ...]; None when there is no such
    process."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def state(pid: int) -> str | None:
    """The process's state letter: R running, S sleeping, T stopped, Z zombie, ..."""
    fields = stat_fields(pid)
    return fields[0] if fields else None


def stopped(pid: int) -> bool:
    """Stopped by a signal (SIGSTOP, SIGTSTP: Ctrl-Z); 't' is a tracer's stop."""
    return state(pid) in ("T", "t")


def oom_kills() -> int | None:
    """How many processes the kernel's OOM killer has killed: in this process's memory cgroup
    (v2 memory.events, v1 memory.oom_control), else on the whole machine (/proc/vmstat);
    None when none of them can be read."""
    for path in _cgroup_files():
        found = _counter(path, "oom_kill")
        if found is not None:
            return found
    return _counter(PROC / "vmstat", "oom_kill")


def _cgroup_files() -> list[Path]:
    try:
        lines = (PROC / "self" / "cgroup").read_text().splitlines()
    except OSError:
        return []
    files = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2: one hierarchy
            files.append(Path("/sys/fs/cgroup") / path.lstrip("/") / "memory.events")
        elif "memory" in controllers.split(","):
            files.append(Path("/sys/fs/cgroup/memory") / path.lstrip("/") / "memory.oom_control")
    return files


def _counter(path: Path, name: str) -> int | None:
    try:
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == name:
                return int(value)
    except (OSError, ValueError):
        return None
    return None


def _subreaper(on: bool) -> bool:
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _children() -> dict[int, list[int]]:
    """ppid -> pids, over every process this user can see."""
    tree: dict[int, list[int]] = {}
    for entry in _pids():
        fields = stat_fields(entry)
        if fields:
            tree.setdefault(int(fields[1]), []).append(entry)
    return tree


def _pids() -> list[int]:
    try:
        return [int(p.name) for p in PROC.iterdir() if p.name.isdigit()]
    except OSError:
        return []


def descendants(pid: int | None = None) -> set[int]:
    tree, found = _children(), set()
    todo = [os.getpid() if pid is None else pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _marked(mark: bytes) -> set[int]:
    """The processes whose environment holds `mark` (a NAME=value entry)."""
    found = set()
    for pid in _pids():
        with contextlib.suppress(OSError):
            if mark in (PROC / str(pid) / "environ").read_bytes().split(b"\0"):
                found.add(pid)
    return found


def _start_time(pid: int) -> str | None:
    fields = stat_fields(pid)
    return fields[19] if fields else None  # field 22: when it started (a reused pid differs)


@contextlib.contextmanager
def none_outlive(mark: str | None):
    """The launch inside ends with none of its processes alive: those whose environment holds
    `mark` ("NAME=value", set by the launch for its workers) and the descendants of this
    process that appeared meanwhile (this process a child subreaper for the while, so that
    orphans stay its descendants), but this process's own multiprocessing resource tracker
    (later launches reuse it; it ends with this process)."""
    if not PROC.is_dir():
        yield
        return
    before = {pid: _start_time(pid) for pid in descendants()}
    reaper = _subreaper(True)
    try:
        yield
    finally:
        try:
            end_all(_leftovers(mark, before, _own_helpers()))
            _reap(before)
        finally:
            if reaper:
                _subreaper(False)


def _leftovers(mark: str | None, before: dict[int, str | None], keep: tuple[int, ...]) -> set[int]:
    me = os.getpid()
    new = {p for p in descendants() if p not in before or _start_time(p) != before[p]}
    found = new | (_marked(mark.encode()) if mark else set())
    return {p for p in found if p != me and p not in keep and state(p) not in (None, "Z", "X")}


def _own_helpers() -> tuple[int, ...]:
    from multiprocessing import resource_tracker

    pid = getattr(resource_tracker._resource_tracker, "_pid", None)
    return (pid,) if pid else ()


def end_all(pids: set[int], grace_s: float = 2.0) -> None:
    """SIGTERM (and SIGCONT: a stopped process acts on nothing else), then SIGKILL whatever
    still lives after grace_s; those that were orphaned to this process reaped."""
    for sig in (signal.SIGTERM, signal.SIGCONT):
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, sig)
    alive = _gone_within(pids, grace_s)
    for pid in alive:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    _gone_within(alive, 2.0)


def _gone_within(pids: set[int], seconds: float) -> set[int]:
    """Wait up to `seconds` for `pids` to end, reaping this process's children among them ->
    those still running."""
    deadline = time.monotonic() + seconds
    alive = set(pids)
    while True:
        for pid in alive:
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, os.WNOHANG)
        alive = {p for p in alive if state(p) not in (None, "Z", "X")}
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.05)


def _reap(before: dict[int, str | None]) -> None:
    """Orphans the launch left that ended on their own: zombies among this process's children
    that were not its children before."""
    tree = _children()
    for pid in tree.get(os.getpid(), []):
        if pid not in before and state(pid) == "Z":
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, os.WNOHANG)
