"""Process group and rank helpers. NCCL on GPUs, gloo on the CPU; torchrun (or SLURM, mapped in
launch.py) provides RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT. The mesh over the
ranks is parallel_dims.py's."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from paratrain.errors import UserError

GENERATION = "PARATRAIN_GENERATION"


def generation() -> int:
    """Which start of the job's workers this is (0: the first; more after restarts)."""
    return int(os.environ.get(GENERATION, os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")))


@dataclass(frozen=True)
class DistEnv:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    backend: str | None
    """None when the run is a single process without a process group."""

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def pick_device(preference: str, local_rank: int) -> torch.device:
    if preference == "cpu" or (preference == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise UserError(
            "device: cuda was asked for but no GPU is visible (check CUDA_VISIBLE_DEVICES)"
        )
    count = torch.cuda.device_count()
    if local_rank >= count:
        raise UserError(
            f"launch.nproc: local rank {local_rank} has no GPU; {count} visible (CUDA_VISIBLE_DEVICES)"
        )
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    return device


def init_distributed(preference: str, multiprocess: bool, timeout_s: float = 600.0) -> DistEnv:
    """Join the process group that the launcher described in the environment.

    The store comes from torch's env:// rendezvous, under a prefix of its own per generation
    of workers: torchrun's c10d rendezvous keeps one store across restarts, where a restarted
    generation would otherwise read the killed one's addresses (gloo: 'connectFullMesh failed
    ... Connection refused' to a dead port; NCCL: a stale unique id). The generation is counted
    in the store itself (every worker adds 1 once as it joins), not taken from
    TORCHELASTIC_RESTART_COUNT: across nodes, an agent restarted because another node's worker
    failed keeps its count, so two nodes' workers would disagree."""
    if not multiprocess:
        return DistEnv(0, 0, 1, pick_device(preference, 0), None)
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    world = int(os.environ["WORLD_SIZE"])
    device = pick_device(preference, local_rank)
    backend = "nccl" if device.type == "cuda" else "gloo"
    if not dist.is_initialized():
        kwargs = {"device_id": device} if device.type == "cuda" else {}
        timeout = timedelta(seconds=timeout_s)
        store, _, _ = next(dist.rendezvous("env://", rank, world, timeout=timeout))
        joined = store.add("paratrain/workers_joined", 1)
        os.environ[GENERATION] = str((joined - 1) // world)
        store = dist.PrefixStore(f"paratrain/generation_{generation()}/", store)
        dist.init_process_group(
            backend, store=store, rank=rank, world_size=world, timeout=timeout, **kwargs
        )
    return DistEnv(rank, local_rank, world, device, backend)


def all_reduce_sum(values: list[float], device: torch.device) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=device)
    if dist.is_initialized():
        dist.all_reduce(t)
    return t.tolist()


def all_reduce_max(value: float, device: torch.device) -> float:
    t = torch.tensor([value], dtype=torch.float64, device=device)
    if dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def broadcast_object(obj, src: int = 0):
    if not dist.is_initialized():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def all_gather_object(obj) -> list:
    """Every rank's object, in rank order."""
    if not dist.is_initialized():
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
