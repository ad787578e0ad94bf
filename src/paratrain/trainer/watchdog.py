"""Hang and straggler detection: every rank's heartbeat in the job's store, read by rank 0, and
rank 0's read by rank 1.

A rank's loop says where it is (the step it started, the phase: the step itself, a checkpoint,
evaluation, between steps); a thread of its own writes that to the c10d store as soon as it
changes (at most every GAP_S) and every second, with the time. Rank 0's thread reads them all.
A rank whose heartbeat stops (the process was stopped, or hangs outside Python holding the
interpreter; on the same machine its process state says which) or that has been behind the
others for longer than the watchdog's limit (dist.watchdog_s, at most half of dist.timeout_s:
`limit_for`) is named once, with its phase, while the others wait for it in their next
collective; dist.timeout_s later the collective gives up and the job fails (or the agent
restarts it). Rank 0 cannot name itself stopped: rank 1's thread watches rank 0's heartbeat
and does for it what rank 0 does for the others. Under paratrain's launch both leave the ranks
they find stopped or behind in $PARATRAIN_ERROR_DIR (errors.hangs_file), so that the launching
command names them, not the rank whose collective gave up first (job.py); and each rank's
thread keeps its position there (errors.position_file): a rank killed by a signal says nothing
else.

A stop that ends is recorded by the stopped rank itself: its thread's timed waits overran by
more than the limit (it did not run meanwhile: SIGSTOP, Ctrl-Z, or starved); rank 0's own go to
result.json with the others' (`incidents`). Slow steps are also timed by the loop itself
(`StallMeter`), reported in result.json and left out of throughput.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

from paratrain.errors import ERROR_DIR, hangs_file, position_file
from paratrain.launch import procs

GAP_S = 0.2
"""The least time between two heartbeats of a rank: a new position is sent within it (the
report names the step a rank stopped in), and a store sees at most 1 / GAP_S sets per rank per
second however short the steps."""


def limit_for(watchdog_s: float, timeout_s: float) -> float:
    """The watchdog speaks before the collectives give up (dist.timeout_s), or it would never
    name the rank the others wait for: its limit is at most half the collective timeout."""
    return 0.0 if watchdog_s <= 0 else min(watchdog_s, timeout_s / 2)


class Watchdog:
    def __init__(
        self,
        rank: int,
        world: int,
        limit_s: float,
        interval_s: float = 1.0,
        dump_dir: Path | None = None,
        backend: str | None = None,
    ):
        self.rank, self.world, self.limit = rank, world, limit_s
        self.dump_dir, self.backend, self.dumped = dump_dir, backend, b""
        self.started, self.phase, self.since = 0, "between steps", time.time()
        self.reported: set[tuple] = set()
        self.silent_at: dict[int, float] = {}  # when a rank was last reported silent
        self.incidents: list[dict] = []
        self.hangs: dict[int, dict] = {}  # the ranks stopped or behind at the last look
        self.host = socket.gethostname()
        where = os.environ.get(ERROR_DIR)
        self.folder = Path(where) if where else None
        self.position = Position(self.folder, rank) if self.folder else None
        self._stop, self._moved = threading.Event(), threading.Event()
        self._thread = None
        if limit_s <= 0 or world < 2 or not dist.is_initialized():
            return
        from paratrain.distributed.process_group import generation

        # a client connection of its own: the main thread's collectives use theirs meanwhile
        client = dist.TCPStore(
            os.environ["MASTER_ADDR"],
            int(os.environ["MASTER_PORT"]),
            is_master=False,
            timeout=timedelta(seconds=30),
        )
        self.store = dist.PrefixStore(f"paratrain/generation_{generation()}/heartbeat/", client)
        # a few heartbeats within the limit, or a rank between two would look silent
        self.interval = min(interval_s, limit_s / 4)
        self._send()  # the first one now: a rank may stop before the thread's first turn
        self._thread = threading.Thread(target=self._run, name="paratrain-watchdog", daemon=True)
        self._thread.start()

    def beat(self, started: int, phase: str) -> None:
        """The loop's position: the step it started (1-based) and what it does now."""
        self.started, self.phase, self.since = started, phase, time.time()
        if self.position is not None:
            self.position.set(started, phase)
        self._moved.set()  # (a lock taken, no store round trip in the loop)

    def stop(self) -> list[dict]:
        self._stop.set()
        self._moved.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        return self.incidents

    def _run(self) -> None:
        looked = time.monotonic()
        while not self._stop.is_set():
            self._timed(self._moved.wait, self.interval)  # a new position, or the turn
            self._moved.clear()
            try:
                self._send()
                if time.monotonic() - looked >= self.interval:
                    looked = time.monotonic()
                    if self.rank == 0:
                        self._look()
                    elif self.rank == 1:
                        self._look(watched=[0])
                    self._dump_when_asked()
            except Exception:  # noqa: BLE001 - the store went away: the job is ending
                return
            self._timed(self._stop.wait, GAP_S)

    def _timed(self, wait, seconds: float) -> None:
        """A timed wait that overran by more than the limit: this process did not run
        meanwhile (stopped, or starved): recorded once it runs again."""
        began = time.monotonic()
        wait(seconds)
        lost = time.monotonic() - began - seconds
        if lost > self.limit:
            self._paused(lost)

    def _paused(self, seconds: float) -> None:
        # (the others saw it silent meanwhile: its being behind now is the same incident)
        self.silent_at[self.rank] = time.time()
        self.incidents.append(
            {
                "rank": self.rank,
                "step": self.started,
                "phase": self.phase,
                "seconds": round(seconds, 1),
                "paused": True,
            }
        )
        print(
            f"paratrain: watchdog: rank {self.rank} did not run for {seconds:.0f} s "
            f"({self.phase}, step {self.started}): stopped (SIGSTOP, Ctrl-Z) or starved of "
            "CPU; it runs again",
            file=sys.stderr,
            flush=True,
        )

    def _send(self) -> None:
        body = [self.started, self.phase, self.since, time.time(), os.getpid(), self.host]
        self.store.set(str(self.rank), json.dumps(body))

    def _dump_when_asked(self) -> None:
        """Rank 0 named a rank: every rank that can writes its flight recorder (the named one,
        if stopped, cannot; its absence is part of the answer)."""
        if self.dump_dir is None or not self.store.check(["dump"]):
            return
        asked = self.store.get("dump")
        if asked != self.dumped:
            self.dumped = asked
            # a rank that was stopped and wakes later would record where it is then, not
            # where it was: only a request of the last few seconds is answered
            if time.time() - float(asked.decode().split(":")[1]) < 2 * self.interval + 0.5:
                from paratrain.distributed.flight import dump

                dump(self.dump_dir, self.rank, self.backend)

    def _look(self, watched: list[int] | None = None) -> None:
        """Rank 0: every rank, stopped or behind; rank 1: rank 0, stopped."""
        now = time.time()
        keys = [str(r) for r in range(self.world)]
        if not self.store.check(keys):
            return
        beats = {r: json.loads(self.store.get(str(r))) for r in range(self.world)}
        where = {r: (b[0], _ORDER.get(b[1], 1)) for r, b in beats.items()}
        hangs = {}
        for r in range(self.world) if watched is None else watched:
            ahead = sorted(q for q in beats if where[q] > where[r]) if watched is None else []
            found = self._judge(r, beats[r], ahead, now)
            if found is None:
                continue
            key, seconds, line = found
            started, phase, since, sent = beats[r][:4]
            # since when: its last heartbeat (stopped), or the start of its phase (behind)
            silent = key[2] == "silent"
            hangs[r] = {"rank": r, "step": started, "phase": phase, "silent": silent}
            hangs[r].update(since=sent if silent else since, stopped=self._stopped(beats[r]))
            if key not in self.reported:
                self.reported.add(key)
                self._incident(line, r, started, phase, seconds)
        self._leave_hangs(hangs)

    def _judge(self, r: int, beat: list, ahead: list[int], now: float):
        """A rank silent past the limit, or behind the ranks `ahead` past it -> (the
        incident's key, its seconds, the line), else None."""
        started, phase, since, sent = beat[:4]
        if now - sent > self.limit:
            self.silent_at[r] = now
            how = (
                "its process is stopped (SIGSTOP, or Ctrl-Z)"
                if self._stopped(beat)
                else "stopped, or stuck outside Python"
            )
            seconds = now - sent
            line = (
                f"rank {r} has sent no heartbeat for {seconds:.0f} s (last: {phase}, step "
                f"{started}): {how}; the others wait for it"
            )
            return (r, started, "silent"), seconds, line
        # (a rank reported silent that wakes up mid-step is the same incident)
        if ahead and now - since > self.limit and since > self.silent_at.get(r, 0):
            seconds = now - since
            line = (
                f"rank {r} is behind: {seconds:.0f} s in {phase} (step {started}) while "
                f"rank{'s' if len(ahead) > 1 else ''} {', '.join(map(str, ahead))} "
                f"wait{'' if len(ahead) > 1 else 's'}"
            )
            return (r, started, phase), seconds, line
        return None

    def _stopped(self, beat: list) -> bool:
        """The rank's process is stopped (a signal's stop), where this machine can see it."""
        return len(beat) >= 6 and beat[5] == self.host and procs.stopped(int(beat[4]))

    def _incident(self, line: str, rank: int, step: int, phase: str, seconds: float) -> None:
        self.incidents.append(
            {"rank": rank, "step": step, "phase": phase, "seconds": round(seconds, 1)}
        )
        if self.dump_dir is not None:
            from paratrain.distributed.flight import note_job

            note_job(self.dump_dir, self.world, self.incidents[-1])
            self.store.set("dump", f"{len(self.incidents)}:{time.time()}")
            line += (
                f"; flight recorder dumps in {self.dump_dir} (`paratrain flight "
                f"{self.dump_dir}` names the collective that did not arrive)"
            )
        who = "" if self.rank == 0 else f" (rank {self.rank}'s)"
        print(f"paratrain: watchdog{who}: {line}", file=sys.stderr, flush=True)

    def _leave_hangs(self, hangs: dict[int, dict]) -> None:
        """The ranks stopped or behind now, for the launching command's last word should the
        others' collective give up meanwhile (a rank that catches up leaves the list)."""
        if self.folder is None or hangs == self.hangs:
            return
        self.hangs = hangs
        path = hangs_file(self.folder, self.rank)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(list(hangs.values())))
        os.replace(tmp, path)


class Position:
    """Where this rank's loop is, in the launch's folder (errors.position_file) for the
    launching command to read should a signal kill the rank: a file mapped into memory, so
    that each beat is a store of a few bytes, no system call, and what the last beat stored
    is in the file even when the process is killed right after it."""

    SIZE = 64

    def __init__(self, folder: Path, rank: int):
        import mmap

        self.map = None
        try:
            with open(position_file(folder, rank), "w+b") as f:
                f.truncate(self.SIZE)
                self.map = mmap.mmap(f.fileno(), self.SIZE)
        except (OSError, ValueError):  # (a folder gone, no room: the report goes without it)
            return

    def set(self, step: int, phase: str) -> None:
        if self.map is not None:
            self.map[:] = json.dumps([step, phase]).encode()[: self.SIZE].ljust(self.SIZE)


# Where in a step a phase lies: the step's work, then a checkpoint or evaluation, then the gap
# before the next step starts.
_ORDER = {"step": 0, "checkpoint": 1, "evaluation": 1, "between steps": 2}


class StallMeter:
    """Steps far slower than the run's usual: more than max(floor_s, 10 x the median of the
    steps so far). Their time beyond the median is taken out of the training clock and
    reported instead of being averaged into throughput."""

    def __init__(self, floor_s: float):
        self.floor = floor_s
        self.times: list[float] = []
        self.stalls: list[dict] = []

    def step(self, step: int, seconds: float) -> float:
        """-> seconds to take out of the clock (0 for a usual step)."""
        usual = statistics.median(self.times) if len(self.times) >= 3 else None
        self.times.append(seconds)
        if usual is None or self.floor <= 0 or seconds <= max(self.floor, 10 * usual):
            return 0.0
        excess = seconds - usual
        self.stalls.append(
            {"step": step, "seconds": round(seconds, 3), "excess_s": round(excess, 3)}
        )
        return excess
