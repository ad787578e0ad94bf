"""Checkpoints on torch.distributed.checkpoint (DCP): every rank writes its own shards, and a
checkpoint loads into any layout.

A checkpoint is a folder `step_<N>/`: DCP's files for the model and optimizer state (as
torch.distributed.checkpoint.state_dict gives them: DTensor shards under FSDP and tensor
parallelism, a pipeline stage's own parameters, one copy of what DDP replicates; optimizer state
flattened per parameter name, so the stages' parts never collide), plus train_state.pt (loop
position, loss scaler, the layout that wrote it) and one rng_rank<r>.pt per rank. Loading reads
the tensors this rank's layout needs, resharding as it goes (DCP's planner): a 2 x 2 FSDP x TP
run resumes on the same mesh, on another, or in one process. A model with frozen weights (LoRA)
saves only what trains: the base is rebuilt from its source on resume, and an 8B model's 16 GB
need not be rewritten every N steps.

The folder is written under a temporary name and renamed once every rank has finished: a
rename is atomic on POSIX, so a crash leaves the previous checkpoint or the new one, never half.
`read_checkpoint` turns one into plain tensors in one process (tests, inspection, export).
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import shutil
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from paratrain.errors import UserError


@dataclass(kw_only=True)
class CheckpointConfig:
    every_steps: int = 0
    """Save every N optimizer steps; 0 saves only at the end."""
    at_end: bool = True
    """Save when the run finishes."""
    keep: int = 2
    """Checkpoints kept on disk (oldest removed first); 0 keeps all."""
    dir: str | None = None
    """Where checkpoints go; default <output_dir>/checkpoints."""
    resume: str | None = None
    """Checkpoint folder (step_<N>), or a folder whose newest checkpoint is taken, to continue
    from; it may come from another layout (degrees, process count): the weights and optimizer
    state are resharded on load."""

    def __post_init__(self) -> None:
        if self.every_steps < 0:
            raise ValueError(f"every_steps: must be >= 0, got {self.every_steps}")
        if self.keep < 0:
            raise ValueError(f"keep: must be >= 0, got {self.keep}")


@dataclass
class LoopState:
    """Where the loop is; saved with the weights so a resumed run continues at the same step."""

    step: int = 0
    epoch: int = 0
    step_in_epoch: int = 0
    samples_in_epoch: int = 0
    """Samples of this epoch's order already trained on (over all data-parallel ranks): a run
    resumed with another data-parallel size skips the same samples."""


_NAME = re.compile(r"step_(\d+)$")
_TRAIN_STATE = "train_state.pt"


def checkpoint_path(directory: str | Path, step: int) -> Path:
    return Path(directory) / f"step_{step:08d}"


def list_checkpoints(directory: str | Path) -> list[Path]:
    d = Path(directory)
    if not d.is_dir():
        return []
    return sorted(p for p in d.iterdir() if _NAME.search(p.name) and (p / _TRAIN_STATE).is_file())


def resolve_resume(path: str) -> Path:
    """A checkpoint folder, a checkpoints folder, or a run folder -> the checkpoint to load."""
    p = Path(path)
    if (p / _TRAIN_STATE).is_file():
        return p
    if p.is_file() and p.suffix == ".pt":
        raise UserError(
            f"checkpoint.resume: {p} is a single-file checkpoint of an earlier paratrain; this "
            "one reads torch.distributed.checkpoint folders (step_*/). Its tensors still load "
            "with torch.load(path)['model']"
        )
    for d in (p, p / "checkpoints"):
        found = list_checkpoints(d)
        if found:
            return found[-1]
    raise UserError(f"checkpoint.resume: no checkpoint (step_*/ with {_TRAIN_STATE}) at {p}")


def rng_state(device: torch.device) -> dict[str, Any]:
    state = {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),
        "python": random.getstate(),
    }
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def _options(model: torch.nn.Module, **extra):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    frozen = any(not p.requires_grad for p in model.parameters())
    return frozen, StateDictOptions(
        ignore_frozen_params=frozen, flatten_optimizer_state_dict=True, **extra
    )


def _rank_world() -> tuple[int, int]:
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


@contextlib.contextmanager
def _single_process_quietly():
    """DCP warns on every call without a process group that it assumes one process; here that
    is what is meant."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is .*single process")
        yield


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def save_checkpoint(
    directory: str | Path,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: Any,
    state: LoopState,
    device: torch.device,
    keep: int,
    layout: dict[str, Any] | None = None,
) -> Path:
    """Collective: every rank must call it. Returns the checkpoint's folder."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    _, options = _options(model)
    model_state, optim_state = get_state_dict(model, optimizer, options=options)
    rank, world = _rank_world()
    final = checkpoint_path(directory, state.step)
    tmp = final.with_name(f".{final.name}.tmp")
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    _barrier()
    with _single_process_quietly():
        dcp.save(
            {"model": model_state, "optimizer": optim_state},
            checkpoint_id=tmp,
            no_dist=not dist.is_initialized(),
        )
    torch.save(rng_state(device), tmp / f"rng_rank{rank:05d}.pt")
    if rank == 0:
        torch.save(
            {
                "loop": vars(state).copy(),
                "scaler": scaler.state_dict() if scaler is not None else None,
                "world_size": world,
                "layout": layout or {},
            },
            tmp / _TRAIN_STATE,
        )
    _barrier()
    if rank == 0:
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        if keep:
            for old in list_checkpoints(directory)[:-keep]:
                shutil.rmtree(old, ignore_errors=True)
    _barrier()
    return final


def load_checkpoint(
    path: str | Path,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: Any,
    device: torch.device,
    layout: dict[str, Any] | None = None,
) -> tuple[LoopState, dict[str, Any]]:
    """Loads into this rank's layout (whatever wrote it) -> (loop state, the writer's layout
    and world size). Random number streams continue only where the writer had the same
    processes in the same layout (`layout`: this run's, as save_checkpoint records it): a rank
    then has the same role, and a tensor-parallel group's ranks keep one stream."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    path = Path(path)
    frozen, options = _options(model)
    model_state, optim_state = get_state_dict(model, optimizer, options=options)
    wanted = {"model": model_state, "optimizer": optim_state}
    try:
        with _single_process_quietly():
            dcp.load(wanted, checkpoint_id=path, no_dist=not dist.is_initialized())
    except Exception as e:  # DCP names the first tensor it could not find or read
        raise UserError(
            f"checkpoint.resume: {path} does not fit this model ({str(e).splitlines()[0][:200]})"
        ) from None
    _, options = _options(model, strict=not frozen)
    set_state_dict(
        model,
        optimizer,
        model_state_dict=wanted["model"],
        optim_state_dict=wanted["optimizer"],
        options=options,
    )
    train_state = torch.load(path / _TRAIN_STATE, map_location="cpu", weights_only=False)
    if scaler is not None and train_state["scaler"] is not None:
        scaler.load_state_dict(train_state["scaler"])
    rank, world = _rank_world()
    same_roles = train_state.get("layout", {}).get("degrees") == (layout or {}).get("degrees")
    if train_state["world_size"] == world and same_roles:
        rng = torch.load(path / f"rng_rank{rank:05d}.pt", map_location="cpu", weights_only=False)
        set_rng_state(rng, device)
    writer = {"world_size": train_state["world_size"], **train_state.get("layout", {})}
    return LoopState(**train_state["loop"]), writer


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """A checkpoint as plain tensors in this process: {"model": {name: tensor}, "optimizer":
    {flattened name: value}, "loop", "scaler", "world_size", "layout", "rng": [per rank]}.
    Built on DCP's own converter (torch.distributed.checkpoint.format_utils)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    path = Path(path)
    with tempfile.TemporaryDirectory() as tmp:
        whole = Path(tmp) / "whole.pt"
        with _single_process_quietly():
            dcp_to_torch_save(path, whole)
        state = torch.load(whole, map_location="cpu", weights_only=False)
    state.update(torch.load(path / _TRAIN_STATE, map_location="cpu", weights_only=False))
    state["rng"] = [
        torch.load(p, map_location="cpu", weights_only=False)
        for p in sorted(path.glob("rng_rank*.pt"))
    ]
    return state
