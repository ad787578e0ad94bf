"""User mistakes: the CLI prints them as one line ("paratrain: error: ...") and exits with 2.

Raise these, with the field, the bad value and the fix, for anything a user can correct: a bad
config value, missing data files, a model path that does not import. Bugs stay exceptions with
tracebacks.
"""

from __future__ import annotations

import sys
from collections.abc import Callable


class UserError(ValueError):
    pass


def exit_code(fn: Callable[[], object]) -> int:
    """Run fn; a UserError becomes its one line on stderr and exit code 2 (torchrun workers)."""
    try:
        fn()
    except UserError as e:
        print(f"paratrain: error: {e}", file=sys.stderr)
        return 2
    return 0


class ConfigError(UserError):
    """A bad key or value in a recipe or a --set override."""


class DataError(UserError):
    """Missing or malformed data on disk."""
