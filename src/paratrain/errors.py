"""User mistakes: the CLI prints them as one line ("paratrain: error: ...") and exits with 2.

Raise these, with the field, the bad value and the fix, for anything a user can correct: a bad
config value, missing data files, a model path that does not import. Bugs stay exceptions with
tracebacks.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

# Set by the launching command for its workers: where a worker that finds a user mistake
# leaves its line, so the command prints it once for the whole job.
ERROR_DIR = "PARATRAIN_ERROR_DIR"


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
    """Run fn in a torchrun worker; a UserError becomes exit code 2 and its one line: left in
    $PARATRAIN_ERROR_DIR for the launching paratrain to print once, else printed here. A
    worker that fails because another rank stopped on a user mistake (its collective lost a
    peer) exits 1 without a traceback: the mistake is the news, not the broken connection."""
    where = os.environ.get(ERROR_DIR)
    try:
        fn()
    except UserError as e:
        if where:
            rank = int(os.environ.get("RANK", "0"))
            (Path(where) / f"rank_{rank:05d}.txt").write_text(one_line(e))
        else:
            print(f"paratrain: error: {one_line(e)}", file=sys.stderr)
        return 2
    except Exception:
        if where and any(Path(where).glob("rank_*.txt")):
            return 1
        raise
    return 0


def first_worker_error(where: str | Path) -> str | None:
    """The line the lowest rank that found a user mistake left, if any."""
    found = sorted(Path(where).glob("rank_*.txt"))
    return found[0].read_text() if found else None


class ConfigError(UserError):
    """A bad key or value in a recipe or a --set override."""


class DataError(UserError):
    """Missing or malformed data on disk."""
