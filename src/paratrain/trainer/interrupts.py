"""Interrupts: Ctrl-C and SIGTERM (what SLURM and Kubernetes send before they kill a job) stop
the run at a step boundary on every rank, after a checkpoint of that step
(checkpoint.on_interrupt), so that `paratrain run --resume <run dir>` goes on from there.

Under paratrain's own launch the launching command forwards the signal as SIGUSR1 (job.py),
and a SIGTERM of torchrun's agent tearing the job down after another rank failed keeps its
default meaning (stop now) unless the command marked the launch interrupted.

The first signal only sets a flag. The ranks agree at step boundaries that they all reach:
every step while no step time is known, then about once a second and at each epoch's end (an
all-reduce of the flag and the slowest rank's step time, on a gloo group beside NCCL: no GPU
sync). A second signal
more than DEBOUNCE_S after the first stops at once (KeyboardInterrupt); one within it is the
same request arriving twice (a terminal's Ctrl-C reaches the workers directly and again
through torchrun's agent)."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist

DEBOUNCE_S = 2.0
CHECK_EVERY_S = 1.0
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)


class Interrupts:
    def __init__(self, world_size: int, start_step: int):
        self.requested_at: float | None = None
        self.group = None
        if world_size > 1 and dist.is_initialized():
            # the flag travels on the CPU: an NCCL all-reduce would sync the GPU each time
            gloo = dist.get_backend() == "gloo"
            self.group = None if gloo else dist.new_group(backend="gloo")
        self.several = world_size > 1
        self.next_check, self.last = start_step + 1, (start_step, time.perf_counter())
        self.previous = {}
        if threading.current_thread() is threading.main_thread():  # signals reach it alone
            self.previous = {sig: signal.signal(sig, self._handle) for sig in SIGNALS}

    def _handle(self, signum, frame) -> None:
        if signum == signal.SIGTERM and not asked_to_stop():
            signal.signal(signal.SIGTERM, signal.SIG_DFL)  # torchrun's teardown: stop now
            os.kill(os.getpid(), signal.SIGTERM)
            return
        now = time.monotonic()
        if self.requested_at is None:
            self.requested_at = now
        elif now - self.requested_at > DEBOUNCE_S:
            raise KeyboardInterrupt  # a second Ctrl-C: stop at once

    def close(self) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        self.previous = {}

    def stop_at(self, step: int, boundary: bool = False) -> bool:
        """After step `step`: whether every rank stops here (a collective at the steps where
        all ranks check; `boundary`: an epoch's end, where they always do)."""
        if not self.several:
            return self.requested_at is not None
        if step < self.next_check and not boundary:
            return False
        last_step, last_time = self.last
        step_s = (time.perf_counter() - last_time) / max(step - last_step, 1)
        flags = torch.tensor([float(self.requested_at is not None), step_s], dtype=torch.float64)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self.group)
        # the same next check on every rank: from the all-reduced (slowest) step time
        self.next_check = step + max(1, min(1000, int(CHECK_EVERY_S / max(flags[1].item(), 1e-6))))
        self.last = (step, time.perf_counter())
        return flags[0].item() > 0


def asked_to_stop() -> bool:
    """A SIGTERM asks for a graceful stop unless this worker belongs to a paratrain launch
    that did not mark itself interrupted (then it is torchrun's agent stopping the job)."""
    from paratrain.errors import ERROR_DIR
    from paratrain.job import MARKER

    where = os.environ.get(ERROR_DIR)
    return not where or (Path(where) / MARKER).exists()
