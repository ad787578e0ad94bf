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
from paratrain.errors import HANGS, INTERRUPTED, Interrupted, UserError, first_worker_error
from paratrain.flight import waited_in

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
    hang = hang_line(where, run_dir)
    if not failures:
        print(
            hang[0] if hang else "paratrain: training failed; the workers' errors are above",
            file=sys.stderr,
        )
        return 1
    first = failures[0]
    if hang and (hang[1]["since"] > first["time"] or hang[1]["rank"] == first["rank"]):
        hang = None  # it began after the first failure, or the rank itself raised: no hang
    # a failed import far from its cause (a torchvision of another build than torch's): the
    # install check's line says which package and how to mend it
    mends = install.explain(first["type"], first["traceback"])
    report = failure_report(failures, save_tracebacks(failures, run_dir), hang and hang[0], mends)
    print(report, file=sys.stderr)
    return 1


def hang_line(where: Path, run_dir: str | None) -> tuple[str, dict] | None:
    """The rank rank 0's watchdog last found stopped (or behind) and the collective the others
    wait in for it (the flight recorder's dumps) -> (the line, the watchdog's record). The first rank to
    fail is then only the first whose collective gave up (dist.timeout_s): the news is the
    rank it waited for."""
    try:
        hangs = json.loads((where / HANGS).read_text())
    except (OSError, ValueError):
        return None
    if not hangs:
        return None
    h = min(hangs, key=lambda h: h["since"])  # the longest stopped
    what = "stopped sending heartbeats" if h["silent"] else "fell behind"
    line = f"paratrain: rank {h['rank']} {what} ({h['phase']}, step {h['step']})"
    collective = waited_in(Path(run_dir) / "flight_recorder", h["rank"]) if run_dir else None
    line += f"; the others waited for it in {collective}" if collective else ""
    return line, h


def save_tracebacks(failures: list[dict], run_dir: str | None) -> list[Path] | str:
    """The full tracebacks in <run dir>/errors/, or why they could not be written there (a
    full disk, a folder gone): the report must say the workers' error whatever happens here."""
    folder = Path(run_dir or ".") / "errors"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        paths = []
        for f in failures:
            path = folder / f"rank{f['rank']}.txt"
            path.write_text(f["traceback"])
            paths.append(path)
    except OSError as e:
        return f"not saved ({folder}: {e.strerror or e})"
    return paths


def failure_report(
    failures: list[dict],
    paths: list[Path] | str,
    hang: str | None = None,
    mends: Sequence[str] = (),
) -> str:
    """The rank that failed first (or, first, the rank a hang waited for: hang_line), its
    exception, the user's frame and the exception that started its chain, where the tracebacks
    are; then the install's problems that explain it."""
    first = failures[0]
    others = len(failures) - 1
    saved = ", ".join(map(str, paths)) if isinstance(paths, list) else paths
    failed = f"rank {first['rank']} failed first: {first['type']}: {first['message']}"
    if hang:
        failed = f"then rank {first['rank']} gave up: {first['type']}: {first['message']}"
    lines = [
        *([hang] if hang else []),
        f"{'  ' if hang else 'paratrain: '}{failed}",
        f"  at {first['frame']}",
        *([f"  caused by {first['cause']}"] if first.get("cause") else []),
        f"  full tracebacks: {saved}"
        + (f" ({others} other rank{'s' if others > 1 else ''} failed after it)" if others else ""),
    ]
    if isinstance(paths, str):  # not in a file: the first rank's here, the news of the job
        lines += [f"rank {first['rank']}'s traceback:", first["traceback"].rstrip()]
    return "\n".join(lines + list(mends))


def clean(where: Path) -> None:
    shutil.rmtree(where, ignore_errors=True)
