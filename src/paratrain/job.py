"""One launch's workers as the launching command sees them: the signals it forwards to them
(Ctrl-C, SIGTERM) and how they ended, said once for the whole job.

Every worker leaves its pid and, when it stops, how it ended in the launch's folder
($PARATRAIN_ERROR_DIR; errors.exit_code writes it). torchrun's agent is told not to handle
SIGINT / SIGTERM itself (it would tear the workers down): the first one here marks the launch
interrupted and asks every worker to stop at the next step boundary (SIGUSR1); one more than
interrupts.DEBOUNCE_S later kills them (SIGKILL)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from paratrain import install
from paratrain.errors import INTERRUPTED, Interrupted, UserError, first_worker_error

MARKER = "interrupt_requested"
"""The launch asked its workers to stop (a worker's SIGTERM then means the same)."""
DEBOUNCE_S = 2.0


def record_pid(where: str | None, rank: int) -> None:
    if where:
        (Path(where) / f"pid_rank_{rank:05d}").write_text(str(os.getpid()))


def worker_pids(where: Path) -> list[int]:
    return [int(p.read_text()) for p in sorted(where.glob("pid_rank_*")) if p.read_text()]


@contextlib.contextmanager
def forwarded_signals(where: Path):
    """SIGINT / SIGTERM to this process: the workers stop at a step boundary (a worker not
    started yet reads the marker); a second one (after DEBOUNCE_S) kills them and stops the
    agent (KeyboardInterrupt here), which would otherwise restart them."""
    if threading.current_thread() is not threading.main_thread():  # signals reach it alone
        yield
        return
    first: list[float] = []

    def handle(signum, frame):
        now = time.monotonic()
        if not first:
            first.append(now)
            (where / MARKER).write_text(str(signum))
            _send(where, signal.SIGUSR1)
        elif now - first[0] > DEBOUNCE_S:
            _send(where, signal.SIGKILL)
            raise KeyboardInterrupt

    previous = {s: signal.signal(s, handle) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def _send(where: Path, sig: signal.Signals) -> None:
    for pid in worker_pids(where):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def check_interrupted(where: Path) -> None:
    """Workers that stopped at a step boundary exit 0 (torchrun would restart failed ones):
    their record says so."""
    stopped = sorted(where.glob(f"{INTERRUPTED}.rank_*"))
    if stopped:
        raise Interrupted(**json.loads(stopped[0].read_text()))


def outcome(where: Path, run_dir: str | None) -> int:
    """How the workers ended, once: a user mistake (UserError), an interrupt (Interrupted), or
    the rank that failed first, its exception and the user's frame in a few lines, the full
    tracebacks in <run dir>/errors/rank<r>.txt, and where the install explains it (a failed
    import), the install's problems with their mends -> exit code 1."""
    mistake = first_worker_error(where)
    if mistake:
        raise UserError(mistake)
    check_interrupted(where)
    failures = sorted(
        (json.loads(p.read_text()) for p in where.glob("failure_rank_*.json")),
        key=lambda f: f["time"],
    )
    if (where / MARKER).exists() and not failures:
        print(
            "paratrain: interrupted before a step boundary (a second Ctrl-C, or before the "
            "first step): no checkpoint written",
            file=sys.stderr,
        )
        return 130
    if not failures:
        print("paratrain: training failed; the workers' errors are above", file=sys.stderr)
        return 1
    first = failures[0]
    # a failed import far from its cause (a torchvision of another build than torch's): the
    # install check's line says which package and how to mend it
    mends = install.explain(first["type"], first["traceback"])
    print(failure_report(failures, save_tracebacks(failures, run_dir), mends), file=sys.stderr)
    return 1


def save_tracebacks(failures: list[dict], run_dir: str | None) -> list[Path]:
    folder = Path(run_dir or ".") / "errors"
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for f in failures:
        path = folder / f"rank{f['rank']}.txt"
        path.write_text(f["traceback"])
        paths.append(path)
    return paths


def failure_report(failures: list[dict], paths: list[Path], mends: Sequence[str] = ()) -> str:
    """The first failure in three lines, then the install's problems that explain it."""
    first = failures[0]
    others = len(failures) - 1
    lines = [
        f"paratrain: rank {first['rank']} failed first: {first['type']}: {first['message']}",
        f"  at {first['frame']}",
        *([f"  caused by {first['cause']}"] if first.get("cause") else []),
        f"  full tracebacks: {', '.join(map(str, paths))}"
        + (f" ({others} other rank{'s' if others > 1 else ''} failed after it)" if others else ""),
    ]
    return "\n".join(lines + list(mends))


def clean(where: Path) -> None:
    shutil.rmtree(where, ignore_errors=True)
