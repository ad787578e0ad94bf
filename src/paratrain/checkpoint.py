"""Checkpoint and resume for data-parallel runs.

Every rank holds the same weights under DDP (FSDP's shards and a pipeline's stages are gathered
to rank 0 first), so rank 0 writes one file with the whole model,
optimizer and scaler state, the loop position (step, epoch, step within the epoch) and the RNG
state of EVERY rank (gathered), so a resumed run continues bit-for-bit in deterministic mode.
The file is written under a temporary name and renamed: os.replace is atomic on POSIX, so a
crash leaves the previous checkpoint or the new one, never half of one.
"""

from __future__ import annotations

import os
import random
import re
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
    """Checkpoint file, or a directory whose newest checkpoint is taken, to continue from."""

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


_NAME = re.compile(r"step_(\d+)\.pt$")


def checkpoint_path(directory: str | Path, step: int) -> Path:
    return Path(directory) / f"step_{step:08d}.pt"


def list_checkpoints(directory: str | Path) -> list[Path]:
    d = Path(directory)
    if not d.is_dir():
        return []
    return sorted(p for p in d.iterdir() if _NAME.search(p.name))


def resolve_resume(path: str) -> Path:
    """A file, a checkpoint directory, or a run directory -> the checkpoint file to load."""
    p = Path(path)
    if p.is_file():
        return p
    for d in (p, p / "checkpoints"):
        found = list_checkpoints(d)
        if found:
            return found[-1]
    raise UserError(f"checkpoint.resume: no checkpoint (step_*.pt) at {p}")


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


def _merge_parts(parts: list[tuple[dict, dict]]) -> tuple[dict, dict]:
    """Pipeline stages' disjoint (model, optimizer) state dicts -> the whole model's. Optimizer
    state is keyed by parameter name, so groups merge by concatenating their names."""
    model_state: dict[str, Any] = {}
    optim_state: dict[str, Any] = {"state": {}, "param_groups": []}
    for m, o in parts:
        model_state.update(m)
        optim_state["state"].update(o["state"])
        for i, group in enumerate(o["param_groups"]):
            if i == len(optim_state["param_groups"]):
                optim_state["param_groups"].append({**group, "params": []})
            optim_state["param_groups"][i]["params"] += list(group["params"])
    return model_state, optim_state


def _own_part(model: torch.nn.Module, model_state: dict, optim_state: dict) -> tuple[dict, dict]:
    """The whole model's state dicts -> what this pipeline stage holds."""
    mine = set(model.state_dict())
    groups = [
        {**g, "params": [n for n in g["params"] if n in mine]} for g in optim_state["param_groups"]
    ]
    return (
        {k: v for k, v in model_state.items() if k in mine},
        {
            "state": {k: v for k, v in optim_state["state"].items() if k in mine},
            "param_groups": groups,
        },
    )


def _state_dicts(model: torch.nn.Module, optimizer: torch.optim.Optimizer, pipelined: bool):
    """Whole (unsharded) model and optimizer state, on rank 0's CPU; collective under FSDP and
    for a pipeline (each stage's part gathered to rank 0).

    torch.distributed.checkpoint.state_dict gives one format for plain, DDP and FSDP2 models. A
    model with frozen weights (LoRA) saves only what trains: the base is rebuilt from its source
    on resume, and an 8B model's 16 GB need not be rewritten every N steps.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    frozen = any(not p.requires_grad for p in model.parameters())
    if pipelined:
        local = get_state_dict(model, optimizer, options=StateDictOptions(cpu_offload=True))
        parts: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(parts, local)
        return _merge_parts(parts)
    options = StateDictOptions(
        full_state_dict=True, cpu_offload=dist.is_initialized(), ignore_frozen_params=frozen
    )
    return get_state_dict(model, optimizer, options=options)


def save_checkpoint(
    directory: str | Path,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: Any,
    state: LoopState,
    device: torch.device,
    keep: int,
    pipelined: bool = False,
) -> Path | None:
    """Collective: every rank must call it. Returns the path on rank 0."""
    model_state, optim_state = _state_dicts(model, optimizer, pipelined)
    rngs = [rng_state(device)]
    if dist.is_initialized():
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, rngs[0])
        rngs = gathered
    rank = dist.get_rank() if dist.is_initialized() else 0
    path = None
    if rank == 0:
        path = checkpoint_path(directory, state.step)
        path.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "model": model_state,
            "optimizer": optim_state,
            "scaler": scaler.state_dict() if scaler is not None else None,
            "loop": vars(state).copy(),
            "rng": rngs,
        }
        tmp = path.with_name(path.name + ".tmp")
        torch.save(payload, tmp)
        os.replace(tmp, path)
        if keep:
            for old in list_checkpoints(directory)[:-keep]:
                old.unlink(missing_ok=True)
    if dist.is_initialized():
        dist.barrier()
    return path


def load_checkpoint(
    path: str | Path,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: Any,
    device: torch.device,
    pipelined: bool = False,
) -> LoopState:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    payload = torch.load(path, map_location="cpu", weights_only=False)
    frozen = any(not p.requires_grad for p in model.parameters())
    if pipelined:  # the file holds the whole model; a stage takes its part
        payload["model"], payload["optimizer"] = _own_part(
            model, payload["model"], payload["optimizer"]
        )
    # Every rank read the same file; each takes its shard (FSDP) or the whole (DDP, single).
    # strict=False only where frozen weights were left out of the file on purpose.
    set_state_dict(
        model,
        optimizer,
        model_state_dict=payload["model"],
        optim_state_dict=payload["optimizer"],
        options=StateDictOptions(full_state_dict=True, strict=not frozen),
    )
    if scaler is not None and payload["scaler"] is not None:
        scaler.load_state_dict(payload["scaler"])
    rank = dist.get_rank() if dist.is_initialized() else 0
    world = dist.get_world_size() if dist.is_initialized() else 1
    if len(payload["rng"]) != world:
        raise UserError(
            f"checkpoint.resume: {path} was written by {len(payload['rng'])} ranks, this run has {world}"
        )
    set_rng_state(payload["rng"][rank], device)
    return LoopState(**payload["loop"])
