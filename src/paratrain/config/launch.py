"""launch.* and dist.*: how many processes, on which nodes, and the process group's timeouts."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal


@dataclass(kw_only=True)
class LaunchConfig:
    nproc: int | None = None
    """Processes per node; default: one per visible GPU, or 2 on a CPU-only machine (ddp-*)."""
    nnodes: int = 1
    """Nodes taking part (torchrun --nnodes)."""
    node_rank: int = 0
    """This node's rank: checked against nnodes, not passed on (c10d's rendezvous numbers the
    nodes as they join and ignores torchrun's --node-rank)."""
    rdzv_endpoint: str | None = None
    """host:port of the c10d rendezvous for multi-node runs (torchrun --rdzv-endpoint)."""
    one_process: bool | Literal["auto"] = "auto"
    """A ddp-* run (or strategy auto) that comes to one rank: true / auto trains it in this
    process, as strategy single (no torchrun, no DDP wrapper: the same arithmetic without a
    launcher and a reducer); false keeps both, to measure DDP itself. auto keeps them where
    the run asks something of DDP or torchrun (restarts, sync modes, gradient compression,
    SyncBatchNorm, a simulated link)."""
    max_restarts: int = 0
    """Times the elastic agent restarts failed workers (resume from the newest checkpoint)."""
    cpu_threads: int | None = None
    """Threads each process computes with on the CPU (torch.set_num_threads, OMP_NUM_THREADS);
    default: OMP_NUM_THREADS where the environment sets it, else this machine's cores over the
    processes on this node. `paratrain bench` gives
    every run of a sweep the same (the cores over the sweep's largest process count), so that a
    1-process run is not measured with the cores a 2-process run splits."""
    numa_affinity: Literal["off", "node", "socket", "exclusive", "core-complex"] = "off"
    """Bind each rank's process and threads to the CPUs near its GPU: torchrun's own NUMA
    binding (--numa-binding; torch.numa.binding's modes: node, the GPU's NUMA node; socket;
    exclusive, the node's cores split between its GPUs; core-complex, one L3 domain). GPUs
    only; `paratrain doctor` names each GPU's node."""

    def __post_init__(self) -> None:
        if self.cpu_threads is not None and self.cpu_threads < 1:
            raise ValueError(f"cpu_threads: must be >= 1, got {self.cpu_threads}")
        if self.nproc is not None and self.nproc < 1:
            raise ValueError(f"nproc: must be >= 1, got {self.nproc}")
        if self.nnodes < 1:
            raise ValueError(f"nnodes: must be >= 1, got {self.nnodes}")
        if not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"node_rank: must be in [0, {self.nnodes}), got {self.node_rank}")
        if self.nnodes > 1 and not self.rdzv_endpoint:
            raise ValueError("rdzv_endpoint: a multi-node run needs host:port of the rendezvous")
        if self.rdzv_endpoint and not re.fullmatch(r"[\w.\-\[\]:]+:\d+", self.rdzv_endpoint):
            raise ValueError(f"rdzv_endpoint: expected host:port, got {self.rdzv_endpoint!r}")
        if self.max_restarts < 0:
            raise ValueError(f"max_restarts: must be >= 0, got {self.max_restarts}")


@dataclass(kw_only=True)
class DistConfig:
    """The process group's settings (dist.*)."""

    timeout_s: float = 600.0
    """How long a collective may wait for the slowest rank before the job fails (NCCL's watchdog
    aborts it; gloo raises): a rank that died or hangs costs at most this long."""
    watchdog_s: float = 60.0
    """A rank whose step has not finished this many seconds after the others' (or after the
    running median step time x 10, if longer) is named, with its phase, on rank 0's output,
    and by the job's last line should the others' collective then give up. At most half of
    dist.timeout_s is used (a shorter collective timeout shortens it: the watchdog speaks
    first); 0: no watchdog."""
    flight_recorder: int = 2000
    """Collectives each rank remembers (PyTorch's flight recorder, NCCL and gloo), dumped to
    <output_dir>/flight_recorder/ when the watchdog names a rank and when an NCCL collective
    times out; `paratrain flight <output_dir>` reads them. 0: off."""

    def __post_init__(self) -> None:
        if self.flight_recorder < 0:
            raise ValueError(f"flight_recorder: must be >= 0, got {self.flight_recorder}")
        if not self.timeout_s > 0 or self.timeout_s == float("inf"):
            raise ValueError(f"timeout_s: must be a finite number > 0, got {self.timeout_s}")
        if not self.watchdog_s >= 0 or self.watchdog_s == float("inf"):
            raise ValueError(f"watchdog_s: must be a finite number >= 0, got {self.watchdog_s}")
