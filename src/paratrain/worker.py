"""Entry point of each process that torchrun's agent starts: ``python -m paratrain.worker PLAN``,
or, on the CPU, `forked` (the agent forks its workers from a fork server that imported what
they need once: launch.run_torchrun).

The run was resolved once, by the launching command, into a plan (runplan.RunPlan) written as
plan.json; a worker only loads it and trains.
"""

from __future__ import annotations

import os
import signal
import sys

from paratrain.errors import ERROR_DIR, exit_code
from paratrain.launch import terminal
from paratrain.launch.job import record_pid
from paratrain.runplan import RunPlan, cpu
from paratrain.trainer.loop import train


def main(argv: list[str]) -> int:
    (plan_path,) = argv
    terminal.outlive_hangup()  # a closed terminal's EIO must not end this rank mid-checkpoint
    if os.environ.get(ERROR_DIR):  # paratrain's launch: the command takes SIGHUP for the job
        terminal.ignore_hangup()
    # the launching command forwards Ctrl-C / SIGTERM to this pid (job.forwarded_signals)
    record_pid(os.environ.get(ERROR_DIR), int(os.environ.get("RANK", "0")))
    # before the trainer takes them over (interrupts.py): an interrupt now stops at once
    signal.signal(signal.SIGUSR1, _stop_now)
    # a language model's memory, where the launching command left it to the workers (they
    # import its libraries anyway): the note, or the refusal, before the model is built
    return exit_code(lambda: train(cpu.judged(RunPlan.load(plan_path))))


def _stop_now(signum, frame):
    raise KeyboardInterrupt


def forked(plan_path: str) -> None:
    """A worker forked by torchrun's agent from the fork server of this launch
    (launch.run_torchrun): the server started with this launch's environment, and the agent
    has set the rank's own variables; then main."""
    # unbuffered, as `python -u` makes a worker's output: a killed rank's last words and a
    # progress bar's "\r" updates are out at once
    import io
    import os

    for name in ("stdout", "stderr"):
        old = getattr(sys, name)
        raw = os.fdopen(old.fileno(), "wb", buffering=0, closefd=False)
        setattr(
            sys,
            name,
            io.TextIOWrapper(raw, encoding=old.encoding, errors=old.errors, write_through=True),
        )
    code = main([plan_path])
    if code:
        raise SystemExit(code)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
