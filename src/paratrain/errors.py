"""User mistakes: the CLI prints them as one line ("paratrain: error: ...") and exits with 2.

Raise these, with the field, the bad value and the fix, for anything a user can correct: a bad
config value, missing data files, a model path that does not import. Bugs stay exceptions with
tracebacks.
"""


class UserError(ValueError):
    pass


class ConfigError(UserError):
    """A bad key or value in a recipe or a --set override."""


class DataError(UserError):
    """Missing or malformed data on disk."""
