"""Fault injection for the fault-tolerance tests and benchmarks/chaos: faults named in the
environment variable PARATRAIN_FAULTS fire inside the training loop, after a given optimizer
step, on a given rank. Nothing fires unless the variable is set.

    PARATRAIN_FAULTS="kill:rank=1:step=3"          SIGKILL rank 1 after step 3 (first generation
                                                    only, so a restarted run gets past it)
    PARATRAIN_FAULTS="nan:step=2"                  step 2's gradients become NaN on every rank
    PARATRAIN_FAULTS="raise:step=3"                a RuntimeError after step 3 (a crash)
    PARATRAIN_FAULTS="stall:rank=1:step=2:s=20"    rank 1 sleeps 20 s after step 2
    PARATRAIN_FAULTS="sigstop:rank=1:step=2:s=20"  rank 1 is stopped (SIGSTOP, all its threads)
                                                    for 20 s after step 2, then continued
Several faults: separated by commas.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Fault:
    kind: str
    step: int
    rank: int | None = None
    seconds: float = 0.0


def parse(text: str | None) -> list[Fault]:
    faults = []
    for item in filter(None, (text or "").split(",")):
        kind, *fields = item.strip().split(":")
        values = dict(f.split("=", 1) for f in fields)
        faults.append(
            Fault(
                kind,
                int(values["step"]),
                int(values["rank"]) if "rank" in values else None,
                float(values.get("s", 0)),
            )
        )
    return faults


_FAULTS = parse(os.environ.get("PARATRAIN_FAULTS"))


def _mine(fault: Fault, rank: int, step: int) -> bool:
    return fault.step == step and fault.rank in (None, rank)


def after_step(rank: int, step: int) -> None:
    """Called by the loop once optimizer step `step` (1-based) is done."""
    from paratrain.distributed.process_group import generation

    first_generation = generation() == 0
    for fault in _FAULTS:
        if not _mine(fault, rank, step):
            continue
        if fault.kind == "kill" and first_generation:
            os.kill(os.getpid(), signal.SIGKILL)
        if fault.kind == "raise":
            raise RuntimeError(f"injected failure after step {step}")
        if fault.kind == "stall":
            time.sleep(fault.seconds)
        if fault.kind == "sigstop":  # someone else must send SIGCONT: a shell started now
            pid = os.getpid()
            # a stop may come at any moment; this one comes once the heartbeat thread has
            # had its turn (trainer/watchdog.py's GAP_S) to say where the rank is
            time.sleep(0.5)
            subprocess.Popen(["sh", "-c", f"sleep {fault.seconds}; kill -CONT {pid}"])
            os.kill(pid, signal.SIGSTOP)


def poison_gradients(rank: int, step: int) -> bool:
    """True when step `step` (1-based) must see NaN gradients (a nan fault)."""
    return any(f.kind == "nan" and _mine(f, rank, step) for f in _FAULTS)
