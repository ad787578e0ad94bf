"""The fork server's imports, each guarded.

multiprocessing's fork server imports its preload modules itself and passes over an ImportError
only: any other exception (a torchvision whose compiled ops do not load raises RuntimeError)
ends the server with a traceback of its own, and torchrun's agent then fails with
"EOFError: unexpected EOF", far from the cause. Here the server imports this one module, which
imports the launch's modules (named in PRELOAD by `guarded`) and passes over any failure: a
worker forked without one of them imports it again, fails inside the run, and the launching
command's one report names the failure and, where the install explains it, the install check's
line with its mend (job.outcome).
"""

from __future__ import annotations

import contextlib
import importlib
import os

PRELOAD = "PARATRAIN_PRELOAD"


@contextlib.contextmanager
def guarded(modules: tuple[str, ...]):
    """The names to give the fork server for `modules` (this module alone, which imports them
    in the server), with PRELOAD set while the launch starts its server; () stays ()."""
    if not modules:
        yield ()
        return
    before = os.environ.get(PRELOAD)
    os.environ[PRELOAD] = ",".join(modules)
    try:
        yield (__name__,)
    finally:
        os.environ.pop(PRELOAD, None)
        if before is not None:
            os.environ[PRELOAD] = before


def _import_each() -> None:
    for name in filter(None, os.environ.get(PRELOAD, "").split(",")):
        with contextlib.suppress(Exception):
            importlib.import_module(name)


if __name__ != "__main__":
    _import_each()
