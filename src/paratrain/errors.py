"""User mistakes: the CLI prints them as one line ("paratrain: error: ...") and exits with 2.

Raise these, with the field, the bad value and the fix, for anything a user can correct: a bad
config value, missing data files, a model path that does not import. Bugs stay exceptions with
tracebacks.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

# Set by the launching command for its workers: where a worker that finds a user mistake
# leaves its line, so the command prints it once for the whole job.
ERROR_DIR = "PARATRAIN_ERROR_DIR"
HANGS = "watchdog.json"
"""In $PARATRAIN_ERROR_DIR: the ranks rank 0's watchdog finds stopped or behind now, for the
command to name them should the others' collectives give up (job.py)."""


def hangs_file(where: Path, rank: int) -> Path:
    """HANGS of the watchdog of `rank`: rank 0's watches every rank, rank 1's rank 0."""
    return where / (HANGS if rank == 0 else f"watchdog.rank{rank}.json")


GONE = ("Connection reset", "Connection closed", "Broken pipe")
"""What a collective says when a peer's process is gone (gloo's and NCCL's own words; torch
raises most of them as a plain RuntimeError) ..."""
LATE = ("Timed out", "timed out")
"""... and when it never came (stopped, hung, or gone)."""
LINGER_S = 2.0


def lost_peer(e: BaseException | dict, gone: bool = False) -> bool:
    """A collective that failed for another rank (an exception, or its failure record); gone:
    one whose process is gone, not only late."""
    text = f"{e['type']}: {e['message']}" if isinstance(e, dict) else f"{type(e).__name__}: {e}"
    words = GONE if gone else GONE + LATE
    return "DistNetworkError" in text or any(w in text for w in words)


def position_file(where: Path, rank: int) -> Path:
    """In $PARATRAIN_ERROR_DIR: where a rank's loop last was ([step, phase]), kept by its
    watchdog (trainer/watchdog.py's Position): a rank killed by a signal leaves no other
    word."""
    return where / f"position_rank_{rank:05d}.json"


class UserError(ValueError):
    pass


def one_line(e: BaseException) -> str:
    """A UserError's line. Raised in a DataLoader worker process, it comes back wrapped in that
    worker's traceback text ("Caught DataError in DataLoader worker process 0. Original
    Traceback ..."): its own line is the last one."""
    text = str(e)
    if "Original Traceback" not in text:
        return text
    last = [x for x in text.splitlines() if x.strip()][-1]
    return last.split("Error: ", 1)[1] if "Error: " in last else last


def exit_code(fn: Callable[[], object]) -> int:
    """Run fn in a torchrun worker and say how it ended, in $PARATRAIN_ERROR_DIR for the
    launching paratrain to report once for the whole job (or here, without one):
    - a UserError: exit 2 and its one line;
    - Interrupted (Ctrl-C / SIGTERM, agreed at a step boundary): where the checkpoint is, exit
      0 under paratrain's launch (the command says it and exits 130), else 130; a second
      Ctrl-C (KeyboardInterrupt): exit 130 at once;
    - any other exception: exit 1, its traceback in a file and the rank, type, message and the
      user's own frame for the one report (workers_report.py). A worker that fails because
      another rank stopped on a user mistake exits 1 quietly: the mistake is the news."""
    where = os.environ.get(ERROR_DIR)
    rank = int(os.environ.get("RANK", "0"))
    try:
        fn()
    except UserError as e:
        try:
            if where:
                (Path(where) / f"rank_{rank:05d}.txt").write_text(one_line(e))
                return 2
        except OSError:  # the launch's folder on the disk that filled: said here instead
            pass
        print(f"paratrain: error: {one_line(e)}", file=sys.stderr)
        return 2
    except Interrupted as e:
        if not where:
            print(e.line(), file=sys.stderr, flush=True)
            return 130
        # under paratrain's launch: exit 0, or torchrun's agent would count a failure (and
        # restart the workers under launch.max_restarts); the command reads the record
        (Path(where) / f"{INTERRUPTED}.rank_{rank:05d}").write_text(json.dumps(e.to_dict()))
        return 0
    except KeyboardInterrupt:
        return 130
    except Exception as e:
        if not where:
            raise
        if not any(Path(where).glob("rank_*.txt")):
            record_failure(Path(where), rank, e)
            first_across_nodes(Path(where), rank)
        if lost_peer(e, gone=True):
            # torchrun's agent reports one rank's end, the first it sees: the lost rank's (and
            # the signal that ended it, its only word) rather than this one's; the agent ends
            # this process meanwhile
            time.sleep(LINGER_S)
        return 1
    return 0


INTERRUPTED = "interrupted.json"
FIRST_FAILURE = "paratrain/first_failure"


def first_across_nodes(where: Path, rank: int) -> None:
    """The job's first failure, across nodes: the first rank to fail puts its record in the
    launch's store (torchrun's TCPStore at MASTER_ADDR:MASTER_PORT, reached anew: the process
    group is torn down by now; compare_set: the first writer wins); a rank that fails after it
    finds it there and, where that rank ran on another node (no record of it here), writes it
    beside its own, first, so this node's command names the rank where the failure began
    rather than its own "connection closed by peer". Where the store is gone too (its host was
    the failed node), the local records stand as before."""
    import socket
    from datetime import timedelta

    import torch.distributed as dist

    env = os.environ
    host, port = env.get("MASTER_ADDR"), env.get("MASTER_PORT")
    if not host or not port or int(env.get("WORLD_SIZE", "1")) < 2:
        return
    # one key per launch and generation: a restarted generation starts with none
    key = f"{FIRST_FAILURE}/{env.get('TORCHELASTIC_RUN_ID', '')}/{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    try:
        mine = json.loads((where / f"failure_rank_{rank:05d}.json").read_text())
        # the rendezvous's node rank (c10d assigns it, whatever --node-rank said) and the host
        mine["node"] = f"{env.get('GROUP_RANK', '?')} on {socket.gethostname()}"
        mine["traceback"] = mine["traceback"][-20000:]
        store = dist.TCPStore(
            host, int(port), is_master=False, timeout=timedelta(seconds=5), wait_for_workers=False
        )
        first = json.loads(store.compare_set(key, "", json.dumps(mine)))
    except Exception:  # noqa: BLE001 - a report's extra, never a second failure
        return
    theirs = where / f"failure_rank_{first['rank']:05d}.json"
    if first["rank"] != rank and not theirs.exists():
        # the store's order, not two machines' clocks, says it came first
        first.update(remote=True, time=min(first["time"], mine["time"] - 1e-3))
        theirs.write_text(json.dumps(first))


def record_failure(where: Path, rank: int, e: BaseException) -> None:
    """A worker's exception for the launcher's short report: when, where, what."""
    import traceback

    frames = traceback.extract_tb(e.__traceback__)
    (where / f"failure_rank_{rank:05d}.json").write_text(
        json.dumps(
            {
                "rank": rank,
                "time": time.time(),
                "type": type(e).__name__,
                "message": str(e).strip().splitlines()[0][:500] if str(e).strip() else "",
                "frame": user_frame(frames),
                "cause": root_cause(e),
                "traceback": "".join(traceback.format_exception(e)),
            }
        )
    )


def root_cause(e: BaseException) -> str | None:
    """The exception that started a chain ("raise X from Y", or raised while handling Y): a
    failed import's message often names the symbol, its cause the reason (transformers'
    "Could not import module 'LlamaConfig'" over "operator torchvision::nms does not exist")."""
    seen, root = {id(e)}, e
    while (nxt := _before(root)) is not None and id(nxt) not in seen:
        seen.add(id(nxt))
        root = nxt
    if root is e:
        return None
    text = str(root).strip().splitlines()
    return f"{type(root).__name__}: {text[0][:300] if text else ''}"


def _before(e: BaseException) -> BaseException | None:
    if e.__cause__ is not None:
        return e.__cause__
    return None if e.__suppress_context__ else e.__context__


def user_frame(frames) -> str:
    """The deepest frame of the user's own code: not paratrain's, not an installed package's,
    not the standard library's (else the deepest frame of all)."""
    import sysconfig

    skip = [str(Path(__file__).resolve().parent)]
    skip += [sysconfig.get_paths()[k] for k in ("stdlib", "purelib", "platlib")]
    mine = [
        f for f in frames if not any(str(Path(f.filename).resolve()).startswith(s) for s in skip)
    ]
    chosen = (mine or list(frames) or [None])[-1]
    if chosen is None:
        return "?"
    return f"{chosen.filename}:{chosen.lineno} in {chosen.name}"


def first_worker_error(where: str | Path) -> str | None:
    """The line the lowest rank that found a user mistake left, if any."""
    found = sorted(Path(where).glob("rank_*.txt"))
    return found[0].read_text() if found else None


class ConfigError(UserError):
    """A bad key or value in a recipe or a --set override."""


class DataError(UserError):
    """Missing or malformed data on disk."""


class Interrupted(Exception):
    """The run was interrupted (Ctrl-C, SIGTERM) and stopped at a step boundary on every rank:
    not a mistake; the command prints one line and exits with 130."""

    def __init__(self, step: int, checkpoint: str | None, run_dir: str | None):
        super().__init__(step, checkpoint, run_dir)
        self.step, self.checkpoint, self.run_dir = step, checkpoint, run_dir

    def __str__(self) -> str:
        return self.line()

    def line(self) -> str:
        if self.checkpoint is None:
            return f"paratrain: interrupted at step {self.step}; no checkpoint written"
        return (
            f"paratrain: interrupted at step {self.step}; checkpoint {self.checkpoint}; "
            f"resume with: paratrain run --resume {self.run_dir}"
        )

    def to_dict(self) -> dict:
        return {"step": self.step, "checkpoint": self.checkpoint, "run_dir": self.run_dir}
