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
import re
import shutil
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from paratrain import install
from paratrain.distributed.flight import waited_in
from paratrain.errors import (
    INTERRUPTED,
    Interrupted,
    UserError,
    first_worker_error,
    lost_peer,
    position_file,
)
from paratrain.launch import terminal
from paratrain.launch.procs import oom_kills

MARKER = "interrupt_requested"
"""The launch asked its workers to stop (a worker's SIGTERM then means the same)."""
DEBOUNCE_S = 2.0


def record_pid(where: str | None, rank: int) -> None:
    if where:
        (Path(where) / f"pid_rank_{rank:05d}").write_text(str(os.getpid()))


def worker_pids(where: Path) -> list[int]:
    return [int(p.read_text()) for p in sorted(where.glob("pid_rank_*")) if p.read_text()]


def exits_of(error) -> dict[int, tuple[int, float]]:
    """torchrun's ChildFailedError -> {rank: (exit code, when)}: a negative code is the
    signal that ended the rank (the only word of a rank killed by one)."""
    return {
        int(rank): (int(f.exitcode), float(getattr(f, "timestamp", 0) or 0))
        for rank, f in getattr(error, "failures", {}).items()
    }


@contextlib.contextmanager
def forwarded_signals(where: Path):
    """SIGINT / SIGTERM / SIGHUP to this process: the workers stop at a step boundary (a worker
    not started yet reads the marker); a second SIGINT or SIGTERM (after DEBOUNCE_S) kills them
    and stops the agent (KeyboardInterrupt here), which would otherwise restart them. SIGHUP,
    the terminal closing, also sends this process's output to /dev/null (terminal.py)."""
    if threading.current_thread() is not threading.main_thread():  # signals reach it alone
        yield
        return
    first: list[float] = []
    terminal.outlive_hangup()

    def handle(signum, frame):
        now = time.monotonic()
        if signum == signal.SIGHUP:  # the terminal closed: a request to stop, never a kill
            terminal.detach()
            if first:
                return
        if not first:
            first.append(now)
            (where / MARKER).write_text(str(signum))
            _send(where, signal.SIGUSR1)
        elif now - first[0] > DEBOUNCE_S:
            _send(where, signal.SIGKILL)
            raise KeyboardInterrupt

    asks = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {s: signal.signal(s, handle) for s in asks}
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


def recorded(where: Path) -> list[dict]:
    """The workers' failure records in the launch's folder, first failure first."""
    return sorted(
        (json.loads(p.read_text()) for p in where.glob("failure_rank_*.json")),
        key=lambda f: f["time"],
    )


def outcome(
    where: Path,
    run_dir: str | None,
    exits: dict[int, tuple[int, float]] | None = None,
    ooms_before: int | None = None,
) -> int:
    """How the workers ended, once: a user mistake (UserError), an interrupt (Interrupted), or
    where the failure began, then the rank that failed first, its exception and the user's
    frame in a few lines, the full tracebacks in <run dir>/errors/rank<r>.txt, and where the
    install explains it (a failed import), the install's problems with their mends -> exit
    code 1. Where it began: a rank a signal killed (`exits`, torchrun's {rank: (exit code,
    when)}: negative for a signal; `ooms_before`, the OOM killer's count when the launch
    began), or a rank found stopped, before the others' errors, which are only what followed
    (a connection reset, a collective that gave up)."""
    mistake = first_worker_error(where)
    if mistake:
        raise UserError(mistake)
    check_interrupted(where)
    failures = recorded(where)
    if (where / MARKER).exists() and not failures:
        print(
            "paratrain: interrupted before a step boundary (a second Ctrl-C, or before the "
            "first step): no checkpoint written",
            file=sys.stderr,
        )
        return 130
    lead, then = origin(where, run_dir, failures, exits or {}, ooms_before)
    if not failures:
        print(lead or silent_end(exits or {}), file=sys.stderr)
        return 1
    first = failures[0]
    # a failed import far from its cause (a torchvision of another build than torch's): the
    # install check's line says which package and how to mend it
    mends = install.explain(first["type"], first["traceback"])
    paths = save_tracebacks(failures, run_dir)
    report = failure_report(failures, paths, lead, mends, then)
    print(report, file=sys.stderr)
    return 1


def unreached(endpoint: str | None, e: BaseException) -> str:
    """The agent never reached the rendezvous (its workers never started): the line that says
    what to check, for torchrun's "RendezvousConnectionError ... See inner exception"."""
    return (
        f"paratrain: could not reach the rendezvous at {endpoint} ({type(e).__name__}): the "
        "node whose command binds it first hosts it; start that one, and check that this host "
        "reaches that address and port (a firewall, a name that resolves elsewhere)"
    )


def saved_before(run_dir: str | None) -> dict[str, tuple[int, int]]:
    """The run folder's saved tracebacks as the launch begins ({name: (mtime_ns, size)}):
    a file another node writes during the launch is one not here or changed since (an earlier
    attempt's files stay in the folder; mtimes on a shared file system are the server's)."""
    if not run_dir:
        return {}
    try:
        stats = {p.name: p.stat() for p in (Path(run_dir) / "errors").glob("rank*.txt")}
    except OSError:
        return {}
    return {name: (st.st_mtime_ns, st.st_size) for name, st in stats.items()}


def lost_rendezvous(
    where: Path,
    run_dir: str | None,
    endpoint: str | None,
    before: dict[str, tuple[int, int]],
    e: BaseException,
    ooms_before: int | None = None,
    wait_s: float = 5.0,
) -> int | None:
    """The agent lost the rendezvous's store after its workers had started: its host (the
    node whose agent bound the endpoint first) has gone, most often because a rank of its own
    failed first. Said once instead of torchrun's "RendezvousConnectionError": a mistake or an
    interrupt on record as ever; a failure of this node's own ranks that began here; else the
    first traceback another node saved to the run folder during the launch (a shared file
    system); else what happened and where to look (this node's ranks only lost their peers).
    None: the workers never started (the endpoint was never reached), not this case."""
    if not any(where.glob("pid_rank_*")):
        return None
    mistake = first_worker_error(where)
    if mistake:
        raise UserError(mistake)
    check_interrupted(where)
    lost = (
        f"this node lost the launch's rendezvous ({endpoint}) mid-run: the node that hosted it "
        f"has stopped ({type(e).__name__})"
    )
    failures = recorded(where)
    if failures and (failures[0].get("remote") or not lost_peer(failures[0])):
        code = outcome(where, run_dir, ooms_before=ooms_before)  # it began here, or was told
        print(f"  then {lost}", file=sys.stderr)
        return code
    written = theirs(run_dir, before, wait_s)
    if written:
        path, last = written
        rank = path.stem.removeprefix("rank")
        print(f"paratrain: rank {rank} failed first: {last}", file=sys.stderr)
        print(f"  its node's traceback: {path}; {lost}", file=sys.stderr)
    else:
        print(
            f"paratrain: {lost}; that node's output names the failure where it began",
            file=sys.stderr,
        )
    if failures:  # this node's ranks only lost their peers after it: kept, not the news
        paths = save_tracebacks(failures, run_dir)
        saved = saved_where(paths)
        print(f"  this node's ranks lost their peers after it: {saved}", file=sys.stderr)
    return 1


_LAST_LINE = re.compile(r"[A-Za-z_][\w.]*(: .*)?")
"""A traceback's closing line, "Type: message" (or "Type"): a file read mid-write has none."""


def theirs(
    run_dir: str | None, before: dict[str, tuple[int, int]], wait_s: float = 5.0
) -> tuple[Path, str] | None:
    """The first traceback (errors/rank<r>.txt, with its last line) another node's command
    saved to the run folder during this launch (not in `before`, or changed since): on a
    shared file system it lands there a moment after this node loses the store, so it is
    waited for a few seconds, and read again until it is whole."""
    if not run_dir:
        return None
    folder = Path(run_dir) / "errors"
    deadline = time.monotonic() + wait_s
    found = None
    while True:
        try:
            stats = {p: p.stat() for p in folder.glob("rank*.txt")}
            fresh = sorted(
                (st.st_mtime_ns, p)
                for p, st in stats.items()
                if before.get(p.name) != (st.st_mtime_ns, st.st_size)
            )
            if fresh:
                path = fresh[0][1]
                lines = [x.strip() for x in path.read_text(errors="replace").splitlines()]
                lines = [x for x in lines if x]
                found = (path, lines[-1] if lines else "(empty)")
                if lines and _LAST_LINE.fullmatch(lines[-1]):
                    return found
        except OSError:
            pass
        if time.monotonic() >= deadline:
            return found
        time.sleep(0.2)


def origin(
    where: Path,
    run_dir: str | None,
    failures: list[dict],
    exits: dict[int, tuple[int, float]],
    ooms_before: int | None,
) -> tuple[str | None, str]:
    """The line that names where the failure began: a rank a signal killed, or one found
    stopped or behind (None when the first failure itself is the news), and what the first
    rank that raised then did."""
    first = failures[0] if failures else None
    hang = hang_line(where, run_dir)
    if hang and first and (hang[1]["since"] > first["time"] or hang[1]["rank"] == first["rank"]):
        hang = None  # it began after the first failure, or the rank itself raised: no hang
    dead = killed(exits, failures) or unspoken(where, failures)
    if dead and not (hang and (hang[1]["rank"] == dead[0] or hang[1]["since"] < dead[2])):
        return killed_line(where, run_dir, dead, ooms_before), "failed without it"
    return (hang[0] if hang else None), "gave up"


def killed(
    exits: dict[int, tuple[int, float]], failures: list[dict]
) -> tuple[int, int, float] | None:
    """The rank a signal ended before any rank failed in Python -> (rank, signal, when). It
    left no record (a signal gives it no say); torchrun's agent ends the others after a
    failure with SIGTERM (and SIGKILL 30 s later): those come after the first record."""
    raised = {f["rank"] for f in failures}
    first = failures[0]["time"] if failures else None
    found = []
    for rank, (code, when) in exits.items():
        if code >= 0 or rank in raised:
            continue
        if first is not None and (-code == signal.SIGTERM or when > first + 1):
            continue  # (when: torchrun's whole seconds)
        found.append((-code == signal.SIGTERM, when, rank, -code))
    if not found:
        return None
    _, when, rank, sig = min(found)
    return rank, sig, when


def unspoken(where: Path, failures: list[dict]) -> tuple[int, int, float] | None:
    """The rank whose loss the first failure reports (a lost peer) that left no record, where
    torchrun saw the survivor end first: -> (rank, 0: its signal unknown, 0)."""
    if not failures or not lost_peer(failures[0], gone=True):
        return None
    raised = {f["rank"] for f in failures}
    started = sorted(int(p.name.split("_")[-1]) for p in where.glob("pid_rank_*"))
    quiet = [r for r in started if r not in raised]
    return (quiet[0], 0, 0.0) if quiet else None


def killed_line(
    where: Path, run_dir: str | None, dead: tuple[int, int, float], ooms_before: int | None
) -> str:
    """The line for a rank a signal killed: the signal, where the rank was (its watchdog's
    position file) and the collective the others waited in (their flight recorder dumps)."""
    rank, sig, _ = dead
    how = signal_words(sig or signal.SIGKILL, ooms_before)
    line = f"paratrain: rank {rank} was killed by {how}"
    if not sig and not how.startswith("the kernel's OOM killer"):  # (its signal unknown)
        kill = (
            "kill -9; not the OOM killer" if "not the OOM" in how else "kill -9 or the OOM killer"
        )
        line = (
            f"paratrain: rank {rank} ended without a word: killed by a signal (SIGKILL: {kill}), "
            "or a crash in native code"
        )
    position = last_position(where, rank)
    if position:
        line += f" ({placed(*position)})"
    collective = waited_in(Path(run_dir) / "flight_recorder", rank) if run_dir else None
    return line + (f"; the others waited for it in {collective}" if collective else "")


def signal_words(sig: int, ooms_before: int | None) -> str:
    """SIGKILL comes from kill -9 or from the kernel's OOM killer: its count, read before the
    launch and now, tells them apart where it can be read."""
    try:
        name = signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"
    if sig != signal.SIGKILL:
        crash = {"SIGSEGV": "a crash in native code", "SIGBUS": "a crash in native code"}
        crash["SIGABRT"] = "aborted by native code"
        return f"{name} ({crash[name]})" if name in crash else name
    now = oom_kills()
    if ooms_before is None or now is None:
        return "SIGKILL (kill -9, or the kernel's OOM killer)"
    if now > ooms_before:
        return "the kernel's OOM killer (SIGKILL: out of memory)"
    return "SIGKILL (kill -9; not the OOM killer)"


def last_position(where: Path, rank: int) -> tuple[int, str] | None:
    try:
        step, phase = json.loads(position_file(where, rank).read_text())
    except (OSError, ValueError, TypeError):
        return None
    return int(step), str(phase)


def placed(step: int, phase: str) -> str:
    return f"in step {step}" if phase == "step" else f"{phase}, step {step}"


def silent_end(exits: dict[int, tuple[int, float]]) -> str:
    """No worker said why it ended: what torchrun saw of them."""
    ended = sorted((r, code) for r, (code, _) in exits.items() if code)
    if not ended:
        return "paratrain: training failed; the workers' errors are above"
    said = ", ".join(f"rank {r} exited with code {code}" for r, code in ended)
    return f"paratrain: training failed: {said}, leaving no error of its own (see its output above)"


def hang_line(where: Path, run_dir: str | None) -> tuple[str, dict] | None:
    """The rank a watchdog last found stopped (or behind) and the collective the others wait
    in for it (the flight recorder's dumps) -> (the line, the watchdog's record). Rank 0's
    watchdog watches every rank, rank 1's watches rank 0 (errors.hangs_file). The first rank
    to fail is then only the first whose collective gave up (dist.timeout_s): the news is the
    rank it waited for."""
    hangs = []
    for path in sorted(where.glob("watchdog*.json")):
        try:
            hangs += json.loads(path.read_text())
        except (OSError, ValueError):
            continue
    if not hangs:
        return None
    h = min(hangs, key=lambda h: h["since"])  # the longest stopped
    if h.get("stopped"):
        what = "was stopped (SIGSTOP, or Ctrl-Z)"
    else:
        what = "stopped sending heartbeats" if h["silent"] else "fell behind"
    line = f"paratrain: rank {h['rank']} {what} ({placed(h['step'], h['phase'])})"
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
            if not (f.get("remote") and path.exists()):  # its own node's copy is whole
                # whole or absent: another node may read it as it lands (lost_rendezvous)
                part = path.with_name(f".{path.name}.{os.getpid()}")
                part.write_text(f["traceback"])
                part.replace(path)
            paths.append(path)
    except OSError as e:
        return f"not saved ({folder}: {e.strerror or e})"
    return paths


def saved_where(paths: list[Path] | str) -> str:
    """save_tracebacks' answer as the report says it: the files, or why there are none."""
    return ", ".join(map(str, paths)) if isinstance(paths, list) else paths


def failure_report(
    failures: list[dict],
    paths: list[Path] | str,
    hang: str | None = None,
    mends: Sequence[str] = (),
    then: str = "gave up",
) -> str:
    """The rank that failed first (or, first, where the failure began: a rank killed or
    stopped, job.origin), its exception, the user's frame and the exception that started its
    chain, where the tracebacks are; then the install's problems that explain it."""
    first = failures[0]
    others = len(failures) - 1
    saved = saved_where(paths)
    node = f" (node {first['node']})" if first.get("remote") and first.get("node") else ""
    failed = f"rank {first['rank']}{node} failed first: {first['type']}: {first['message']}"
    if hang:
        failed = f"then rank {first['rank']} {then}: {first['type']}: {first['message']}"
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
