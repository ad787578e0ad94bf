"""Checkpoints on torch.distributed.checkpoint: sharded saves any layout can load (store.py),
written atomically with a manifest of sizes and SHA-256 that is checked before any load, and
read without running code (integrity.py). Below the trainer: a task may read a finished run's
weights (the GAN's classifier score) without importing the trainer."""

from paratrain.checkpoint.store import (
    AsyncSaves,
    LoopState,
    checkpoint_path,
    keep_implementation,
    list_checkpoints,
    load_checkpoint,
    read_checkpoint,
    read_replica,
    resolve_resume,
    save_checkpoint,
)

__all__ = [
    "AsyncSaves",
    "LoopState",
    "checkpoint_path",
    "keep_implementation",
    "list_checkpoints",
    "load_checkpoint",
    "read_checkpoint",
    "read_replica",
    "resolve_resume",
    "save_checkpoint",
]
