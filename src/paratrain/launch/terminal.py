"""A terminal that closes under a run (an ssh session dropped, a laptop's lid shut) does not end
it. The kernel sends SIGHUP to the command, which stops the run at a step boundary after a
checkpoint, as Ctrl-C does (job.forwarded_signals; in one process, trainer/interrupts.py), so
that `paratrain run --resume DIR` goes on from there. Every later write to the dead terminal
fails with EIO: the first such failure, or the hang-up itself, points the process's stdout and
stderr at /dev/null, so no print, progress bar or log line raises in the middle of that
checkpoint. The workers ignore SIGHUP (a GPU launch starts them in sessions of their own; CPU
workers, forked from the launch's fork server, share the command's process group, which a
shell signals as a whole) and guard their writes the same way."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import sys
import threading

GONE = (errno.EIO, errno.ENXIO)  # what a write to a hung-up terminal raises


def detach() -> None:
    """This process's stdout and stderr (the file descriptors: Python's and C's writes) to
    /dev/null where their terminal hung up (a write of nothing to it fails with EIO): a
    `kill -HUP` by hand leaves a live terminal its output, a file stays a file."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        for fd in (1, 2):
            if gone(fd):
                with contextlib.suppress(OSError):
                    os.dup2(devnull, fd)
    finally:
        os.close(devnull)


def gone(fd: int) -> bool:
    try:
        os.write(fd, b"")
    except OSError as e:
        return e.errno in GONE
    return False


@contextlib.contextmanager
def hangup_ignored():
    """SIGHUP ignored while processes are started that must outlive a closed terminal: an
    ignored signal stays ignored across fork and exec (a handler does not), so the launch's fork
    server and its resource tracker, in the command's process group, keep running; the
    command's own handler is back after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGHUP, previous)


def ignore_hangup() -> None:
    """A worker of paratrain's launch: SIGHUP ignored (its data loaders inherit that). The
    command stops the run on it (job.forwarded_signals); CPU workers, forked from the launch's
    fork server, share the command's process group, to which a shell sends its SIGHUP."""
    signal.signal(signal.SIGHUP, signal.SIG_IGN)


class Outliving:
    """A text stream whose writes outlive its terminal: the first EIO detaches (above) and the
    text goes nowhere; anything else passes to the stream it wraps."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError as e:
            if e.errno not in GONE:
                raise
            detach()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as e:
            if e.errno not in GONE:
                raise
            detach()

    def __getattr__(self, name):
        return getattr(self._stream, name)


def outlive_hangup() -> None:
    """sys.stdout and sys.stderr, where they are terminals, wrapped in Outliving."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is None or isinstance(stream, Outliving):
            continue
        try:
            tty = stream.isatty()
        except (OSError, ValueError):
            continue
        if tty:
            setattr(sys, name, Outliving(stream))
