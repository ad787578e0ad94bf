"""Interrupts: Ctrl-C and SIGTERM (what SLURM and Kubernetes send before they kill a job) stop
the run at a step boundary on every rank, after a checkpoint of that step
(checkpoint.on_interrupt), so that `paratrain run --resume <run dir>` goes on from there.

Which signals mean "stop at the next step boundary":
- SIGINT (a terminal's Ctrl-C reaches every process of the job's group) and SIGUSR1 (what
  paratrain's launching command forwards, job.py) always;
- SIGTERM and SIGHUP (the terminal closing: launch/terminal.py) only when this process is not a
  worker of paratrain's own launch: there the command turns its own SIGTERM and SIGHUP into
  SIGUSR1, and a SIGTERM reaching a worker is torchrun's agent tearing the job down after
  another rank failed, which must stop it now (its default).
The launch's marker file (job.MARKER) counts as a request too: a signal that came before this
worker could be told.

The first request only sets a flag. The ranks agree at step boundaries they all reach: every
step while no step time is known, then about once a second and at each epoch's end (an
all-reduce of the flag and the slowest rank's step time, on a gloo group beside NCCL: no GPU
sync). Where nothing else escalates (one process, an outside torchrun), a second SIGINT more
than DEBOUNCE_S after the first stops at once (KeyboardInterrupt); under paratrain's launch
the command does that (job.py). Once the stop is agreed, further signals are ignored."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist

from paratrain.launch import terminal

DEBOUNCE_S = 2.0
CHECK_EVERY_S = 1.0


class Interrupts:
    def __init__(self, world_size: int, start_step: int):
        self.requested_at: float | None = None
        self.stopping = False
        self.group = None
        if world_size > 1 and dist.is_initialized():
            # the flag travels on the CPU: an NCCL all-reduce would sync the GPU each time
            gloo = dist.get_backend() == "gloo"
            self.group = None if gloo else dist.new_group(backend="gloo")
        self.several = world_size > 1
        self.next_check, self.last = start_step + 1, (start_step, time.perf_counter())
        self.previous: dict = {}
        # a worker of paratrain's launch: its command escalates a second Ctrl-C itself (and a
        # SIGINT may reach a worker twice: directly, and from torch's parent-death signal)
        self.led = own_launch()

    def install(self) -> None:
        """Take the signals over (the main thread alone receives them); close() gives them
        back. A request the launch made before this worker could hear it counts."""
        if threading.current_thread() is not threading.main_thread():
            return
        signals = [signal.SIGINT, signal.SIGUSR1]
        if not own_launch():  # one process, an outside torchrun: the terminal's SIGHUP too
            signals += [signal.SIGTERM, signal.SIGHUP]
            terminal.outlive_hangup()
        self.previous = {sig: signal.signal(sig, self._handle) for sig in signals}
        if launch_marked():
            self.requested_at = time.monotonic()
        self.last = (self.last[0], time.perf_counter())  # step times from the loop's start

    def _handle(self, signum, frame) -> None:
        now = time.monotonic()
        if signum == signal.SIGHUP:  # the terminal closed: stop, and write nowhere from now on
            terminal.detach()
            if self.requested_at is not None:
                return
        if self.stopping:
            return
        if self.requested_at is None:
            self.requested_at = now
        elif signum == signal.SIGINT and now - self.requested_at > DEBOUNCE_S and not self.led:
            raise KeyboardInterrupt  # a second Ctrl-C: stop at once

    def close(self) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        self.previous = {}

    def stop_at(self, step: int, boundary: bool = False) -> bool:
        """After step `step`: whether every rank stops here (a collective at the steps where
        all ranks check; `boundary`: an epoch's end, where they always do)."""
        if not self.several:
            self.stopping = self.requested_at is not None
            return self.stopping
        if step < self.next_check and not boundary:
            return False
        last_step, last_time = self.last
        step_s = (time.perf_counter() - last_time) / max(step - last_step, 1)
        flags = torch.tensor([float(self.requested_at is not None), step_s], dtype=torch.float64)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self.group)
        # the same next check on every rank: from the all-reduced (slowest) step time
        every = int(CHECK_EVERY_S / max(flags[1].item(), 1e-6))
        self.next_check = step + max(1, min(1000, every))
        self.last = (step, time.perf_counter())
        self.stopping = flags[0].item() > 0
        return self.stopping


def own_launch() -> bool:
    """A worker of paratrain's own torchrun launch (the command set $PARATRAIN_ERROR_DIR)."""
    from paratrain.errors import ERROR_DIR

    return bool(os.environ.get(ERROR_DIR))


def launch_marked() -> bool:
    from paratrain.errors import ERROR_DIR
    from paratrain.launch.job import MARKER

    where = os.environ.get(ERROR_DIR)
    return bool(where) and (Path(where) / MARKER).exists()
