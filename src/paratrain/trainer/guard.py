"""NaNGuard (train.max_bad_steps): a step whose loss or gradients are not finite on some rank
is not applied (every rank skips it), counted and named; past the limit the run stops with one
line naming the steps and the last checkpoint.

The step says whether it was applied (trainer/step.py): a bool where the host checked, or a
device flag where the fused optimizer judged it on the GPU; those are read a step later, from
pinned memory behind the step's work, so the GPU never idles for the read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from paratrain.checkpoint import LoopState, list_checkpoints
from paratrain.errors import UserError


class NaNGuard:
    def __init__(self, state: LoopState, *, limit: int, ckpt_dir: Path, is_main: bool):
        """state: the loop's (its step, its list of skipped steps); limit: train.max_bad_steps;
        ckpt_dir: where the last checkpoint, named when the run stops, is."""
        self.state, self.limit, self.ckpt_dir, self.is_main = state, limit, ckpt_dir, is_main
        self.pending: list[tuple[int, torch.Tensor, Any]] = []

    def judge(self, loss: torch.Tensor | None, good) -> torch.Tensor | None:
        """After step state.step + 1: -> the loss the epoch's sum takes (nothing for a skipped
        step)."""
        if isinstance(good, torch.Tensor):  # the device's flag
            self.read()  # the step before's, finished by now (this one is queued)
            self.add(self.state.step + 1, good)
            return None if loss is None else torch.where(good > 0, torch.zeros_like(loss), loss)
        if not good:
            self.skipped()
            return None
        return loss

    def add(self, step: int, flag: torch.Tensor) -> None:
        if flag.is_cuda:
            host = torch.empty((), dtype=flag.dtype, pin_memory=True)
            host.copy_(flag, non_blocking=True)
            done = torch.cuda.Event()
            done.record()
        else:
            host, done = flag, None
        self.pending.append((step, host, done))

    def read(self) -> None:
        """The verdicts of steps judged on the device, now: before a checkpoint (its list of
        skipped steps is complete) and at the end of an epoch."""
        pending, self.pending = self.pending, []
        for step, host, done in pending:
            if done is not None:
                done.synchronize()
            if host.item() > 0:
                self.skipped(step)

    def skipped(self, step: int | None = None) -> None:
        """A step was not applied: count it, say so, and stop once train.max_bad_steps is
        passed. `step`: one judged on the device and read later; default the step being
        finished (1-based, as printed)."""
        state, limit = self.state, self.limit
        step = state.step + 1 if step is None else step
        state.bad_steps.append(step)
        if self.is_main:
            print(
                f"paratrain: step {step}: non-finite loss or gradient; skipped "
                f"({len(state.bad_steps)} of at most {limit})",
                flush=True,
            )
        if len(state.bad_steps) > limit:
            good = list_checkpoints(self.ckpt_dir)
            raise UserError(
                f"train: {len(state.bad_steps)} steps had a non-finite loss or gradient (steps "
                f"{', '.join(map(str, state.bad_steps[-5:]))}); stopped. Last checkpoint: "
                f"{good[-1] if good else 'none'}. Lower train.lr, or raise train.max_bad_steps"
            )
