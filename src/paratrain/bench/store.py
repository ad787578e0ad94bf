"""Results store: one SQLite file, one row per run.

WAL journal: a report can read the file while a sweep writes it. Each run's row is committed as
soon as the run ends, so a crash of the sweep loses no finished run. Several sweeps may share one
file at once: a run is claimed (table claims, in one IMMEDIATE transaction) before it starts, so
each run key is run by one process; a claim whose process is gone (same host) or whose lease ran
out (its run's time limit and a minute: another host's) is taken over.

Bench processes running one sweep on one file at the same time form one pass (table passes: the
first to start opens it, the others join it while a member lives): in a pass each run runs once,
a failed run's retry and `--rerun` included; its claim stays, marked done, for the pass's other
members. A later invocation opens a new pass: failed runs are tried again, and `--rerun` runs
everything once more.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sqlite3
import time
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_key       TEXT PRIMARY KEY,
    sweep         TEXT NOT NULL,
    label         TEXT NOT NULL,
    program       TEXT NOT NULL,
    repeat        INTEGER NOT NULL,
    params        TEXT NOT NULL,   -- JSON: the grid point / variant settings
    config        TEXT NOT NULL,   -- JSON: the resolved RunConfig
    hardware      TEXT,            -- JSON: GPU name and count, driver, CUDA, torch, CPUs
    git_commit    TEXT,
    started_at    TEXT,
    finished_at   TEXT,
    status        TEXT NOT NULL,   -- ok | failed | timeout | skipped
    error         TEXT,
    unique_samples_per_s REAL,
    step_time_s   REAL,
    val_accuracy  REAL,
    peak_memory_bytes INTEGER,
    metrics       TEXT,            -- JSON: the result's whole summary
    result        TEXT             -- JSON: the whole result file
);
CREATE TABLE IF NOT EXISTS claims (
    run_key TEXT PRIMARY KEY,
    owner TEXT NOT NULL,           -- host:pid of the process running it
    claimed_at TEXT NOT NULL,
    pass_id TEXT,                  -- the pass it was claimed in (see passes)
    expires REAL,                  -- its lease (unix time): past it, taken over
    done INTEGER NOT NULL DEFAULT 0  -- its run's row is written
);
CREATE TABLE IF NOT EXISTS passes (
    owner TEXT PRIMARY KEY,        -- host:pid of a bench process
    sweep TEXT NOT NULL,
    pass_id TEXT NOT NULL,         -- the pass it joined
    expires REAL NOT NULL          -- its lease (unix time): past it, gone whatever its host
);
CREATE TABLE IF NOT EXISTS sweeps (
    name TEXT PRIMARY KEY,
    table_kind TEXT NOT NULL,
    spec TEXT NOT NULL,            -- JSON of the sweep file
    updated_at TEXT NOT NULL
);
"""

COLUMNS = (
    "run_key",
    "sweep",
    "label",
    "program",
    "repeat",
    "params",
    "config",
    "hardware",
    "git_commit",
    "started_at",
    "finished_at",
    "status",
    "error",
    "unique_samples_per_s",
    "step_time_s",
    "val_accuracy",
    "peak_memory_bytes",
    "metrics",
    "result",
)


def error_line(error: str) -> str:
    """A stored error's headline: its first line (a failed run's cause: execute.cause_of)."""
    return error.splitlines()[0] if error else ""


@dataclass
class Row:
    run_key: str
    sweep: str
    label: str
    program: str
    repeat: int
    params: dict[str, Any]
    config: dict[str, Any]
    hardware: dict[str, Any] | None
    git_commit: str | None
    started_at: str | None
    finished_at: str | None
    status: str
    error: str | None
    unique_samples_per_s: float | None
    step_time_s: float | None
    val_accuracy: float | None
    peak_memory_bytes: int | None
    metrics: dict[str, Any] | None
    result: dict[str, Any] | None


_JSON = {"params", "config", "hardware", "metrics", "result"}


class Store:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for attempt in range(100):
            # Switching a new file to WAL takes a lock that sqlite's busy timeout does not
            # wait for: two sweeps starting on one new file retry instead of failing.
            try:
                with closing(self._connect()) as db, db:
                    db.execute("PRAGMA journal_mode=WAL")
                    db.executescript(SCHEMA)
                    _add_claim_columns(db)
                break
            except sqlite3.OperationalError as e:
                if "locked" not in str(e) or attempt == 99:
                    raise
                time.sleep(0.05 + 0.01 * attempt)

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=30)

    def join_pass(self, sweep: str, owner: str | None = None, lease_s: float = 600.0) -> str:
        """The pass of `sweep` this process runs in: a live one's (another bench process on
        this file runs the sweep now), else a new one."""
        owner, now = owner or me(), time.time()
        with _immediate(self._connect()) as db:
            rows = db.execute(
                "SELECT owner, pass_id, expires FROM passes WHERE sweep = ?", (sweep,)
            ).fetchall()
            live = [p for o, p, x in rows if _live(o, x, owner)]
            gone = [(o,) for o, p, x in rows if not _live(o, x, owner)]  # (and my leftover)
            db.executemany("DELETE FROM passes WHERE owner = ?", gone)
            pass_id = live[0] if live else f"{owner}@{now:.6f}"
            db.execute(
                "INSERT OR REPLACE INTO passes VALUES (?, ?, ?, ?)",
                (owner, sweep, pass_id, now + lease_s),
            )
        return pass_id

    def leave_pass(self, owner: str | None = None) -> None:
        with closing(self._connect()) as db, db:
            db.execute("DELETE FROM passes WHERE owner = ?", (owner or me(),))

    def claim(
        self,
        run_key: str,
        *,
        rerun: bool = False,
        owner: str | None = None,
        pass_id: str | None = None,
        lease_s: float = 86400.0,
    ) -> bool:
        """Take run_key for this process: False when it is done (unless rerun), ran or runs in
        this pass, or another live process holds it. The claim's lease: lease_s (the run's
        time limit and a margin), after which another host's process may take it over."""
        owner, now = owner or me(), time.time()
        with _immediate(self._connect()) as db:
            done = db.execute("SELECT status FROM runs WHERE run_key = ?", (run_key,)).fetchone()
            held = db.execute(
                "SELECT owner, pass_id, expires, done FROM claims WHERE run_key = ?", (run_key,)
            ).fetchone()
            holder, held_pass, expires, finished = held or (None, None, None, 1)
            if (
                (done and done[0] == "ok" and not rerun)
                or (not finished and _live(holder, expires, owner))  # running elsewhere
                or (pass_id is not None and held_pass == pass_id and finished)  # ran in this pass
            ):
                return False
            db.execute(
                "INSERT OR REPLACE INTO claims (run_key, owner, claimed_at, pass_id, expires, "
                "done) VALUES (?, ?, ?, ?, ?, 0)",
                (run_key, owner, time.strftime("%Y-%m-%dT%H:%M:%S"), pass_id, now + lease_s),
            )
            # a member running a long run stays a member (its lease as long as the run's)
            db.execute(
                "UPDATE passes SET expires = max(expires, ?) WHERE owner = ?",
                (now + lease_s, owner),
            )
        return True

    def release(self, run_key: str) -> None:
        """The claim given up (the run did not end: interrupted): another process may run it."""
        with closing(self._connect()) as db, db:
            db.execute("DELETE FROM claims WHERE run_key = ?", (run_key,))

    def save_sweep(self, name: str, table_kind: str, spec: dict[str, Any], now: str) -> None:
        with closing(self._connect()) as db, db:
            db.execute(
                "INSERT OR REPLACE INTO sweeps VALUES (?, ?, ?, ?)",
                (name, table_kind, json.dumps(spec, default=str), now),
            )

    def sweeps(self) -> dict[str, tuple[str, dict[str, Any]]]:
        with closing(self._connect()) as db:
            rows = db.execute("SELECT name, table_kind, spec FROM sweeps ORDER BY name").fetchall()
        return {n: (kind, json.loads(spec)) for n, kind, spec in rows}

    def put(self, row: Row) -> None:
        values = [
            json.dumps(getattr(row, c), default=str) if c in _JSON else getattr(row, c)
            for c in COLUMNS
        ]
        with closing(self._connect()) as db, db:  # the row and its claim's end: one transaction
            db.execute(
                f"INSERT OR REPLACE INTO runs ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})",
                values,
            )
            db.execute("UPDATE claims SET done = 1 WHERE run_key = ?", (row.run_key,))

    def status_of(self, run_key: str) -> str | None:
        with closing(self._connect()) as db:
            hit = db.execute("SELECT status FROM runs WHERE run_key = ?", (run_key,)).fetchone()
        return hit[0] if hit else None

    def rows(self, sweep: str | None = None) -> list[Row]:
        query = f"SELECT {', '.join(COLUMNS)} FROM runs"
        args: tuple = ()
        if sweep:
            query += " WHERE sweep = ?"
            args = (sweep,)
        with closing(self._connect()) as db:
            raw = db.execute(query + " ORDER BY sweep, started_at", args).fetchall()
        out = []
        for values in raw:
            d = {
                c: (json.loads(v) if c in _JSON and v is not None else v)
                for c, v in zip(COLUMNS, values, strict=True)
            }
            out.append(Row(**d))
        return out

    def export_csv(self, path: str | Path) -> None:
        import csv

        with closing(self._connect()) as db:
            cur = db.execute(
                f"SELECT {', '.join(c for c in COLUMNS if c != 'result')} FROM runs ORDER BY sweep, started_at"
            )
            header = [d[0] for d in cur.description]
            with open(path, "w", newline="") as f:
                w = csv.writer(f)
                w.writerow(header)
                w.writerows(cur.fetchall())


def me() -> str:
    """This process, as claims and passes name it."""
    return f"{socket.gethostname()}:{os.getpid()}"


def _add_claim_columns(db: sqlite3.Connection) -> None:
    """A file made before passes and leases: its claims table gets their columns."""
    have = {row[1] for row in db.execute("PRAGMA table_info(claims)")}
    for column in ("pass_id TEXT", "expires REAL", "done INTEGER NOT NULL DEFAULT 0"):
        if column.split()[0] not in have:
            try:
                db.execute(f"ALTER TABLE claims ADD COLUMN {column}")
            except sqlite3.OperationalError as e:  # another process added it meanwhile
                if "duplicate column" not in str(e):
                    raise


@contextlib.contextmanager
def _immediate(db: sqlite3.Connection):
    """One transaction holding the file's write lock from its start (BEGIN IMMEDIATE): what it
    reads no other process changes before it commits."""
    db.isolation_level = None  # transactions by hand
    try:
        db.execute("BEGIN IMMEDIATE")
        try:
            yield db
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")
    finally:
        db.close()


def _live(holder: str | None, expires: float | None, me: str) -> bool:
    """Whether a claim's or a member's process still counts: not this process's leftover, its
    lease not run out, and, on this host, its process running."""
    if holder is None or (expires is not None and time.time() > expires):
        return False
    return _alive(holder, me)


def _alive(holder: str, me: str) -> bool:
    """Whether the claim's process still runs: checked on this host; elsewhere assumed."""
    host, _, pid = holder.rpartition(":")
    if holder == me:
        return False  # this process's own leftover claim
    if host != socket.gethostname():
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, ValueError):
        return True
    return True
