"""Checkpointer: the run's checkpoints, owned in one place: where they go, how often
(checkpoint.every_steps), the save in flight (checkpoint.async_mode), what the saves cost the
run, and where a run resumes from (a restarted generation's newest good checkpoint, or
checkpoint.resume)."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import torch

from paratrain.checkpoint import (
    AsyncSaves,
    keep_implementation,
    list_checkpoints,
    load_checkpoint,
    read_replica,
    resolve_resume,
    save_checkpoint,
)
from paratrain.distributed import process_group as pg
from paratrain.errors import UserError
from paratrain.protocols import unwrap
from paratrain.trainer.run import Run


def restarted() -> bool:
    """This worker was started again by torchrun's agent after a failure (here or on another
    node)."""
    return pg.generation() > 0


class Checkpointer:
    def __init__(self, run: Run):
        self.run, self.cfg = run, run.cfg.checkpoint
        self.saves = AsyncSaves(self.cfg.async_mode)
        self.stats = {"saves": 0, "blocking_s": 0.0, "end_wait_s": 0.0}
        """Checkpoints written by this run, the time its steps waited for them, and (async)
        the time the end of the run waited for the last write."""
        self.saved_step: int | None = None

    def due(self, step: int) -> bool:
        """Every checkpoint.every_steps, except the last step (the end of the run saves)."""
        every = self.cfg.every_steps
        return bool(every) and step % every == 0 and step < self.run.total_steps

    def save(self) -> None:
        """The same state, the same files, on every rank (collective)."""
        run = self.run
        state = run.state
        state.samples_in_epoch = state.step_in_epoch * run.k * run.loader_batch * run.partition
        began = time.perf_counter()
        replica = self.replica()
        # DCP keeps one copy of each replicated tensor, from whichever rank its planner picks:
        # that copy is the replicas' mean, and each rank's own goes in its replica file
        one = run.sync.one_model(unwrap(run.model)) if run.sync else contextlib.nullcontext()
        with one:
            save_checkpoint(
                run.ckpt_dir,
                model=unwrap(run.model),
                optimizer=run.optimizer,
                scaler=run.scaler,
                state=state,
                device=run.env.device,
                keep=self.cfg.keep,
                layout=run.layout,
                saves=self.saves,
                replica=replica,
            )
        self.stats["saves"] += 1
        self.stats["blocking_s"] += time.perf_counter() - began
        self.saved_step = state.step

    def replica(self) -> dict | None:
        """sync.mode local_sgd / diloco / stale: this rank's weights, optimizer and sync state,
        which DCP's one copy of replicated tensors would lose."""
        run = self.run
        if run.sync is None or not run.sync.keeps_replicas:
            return None
        return {
            "model": {k: v.detach().clone() for k, v in unwrap(run.model).state_dict().items()},
            "optimizer": run.optimizer.state_dict(),
            "sync": run.sync.state_dict(),
        }

    def on_interrupt(self) -> str | None:
        """The run stops at this step boundary (Ctrl-C, SIGTERM): its checkpoint, written and
        in place, unless checkpoint.on_interrupt is off -> its folder (collective)."""
        if not self.cfg.on_interrupt:
            return None
        if self.saved_step != self.run.state.step:
            self.save()
        self.saves.close()
        found = list_checkpoints(self.run.ckpt_dir)
        return str(found[-1]) if found else None

    def finish(self, start_step: int) -> None:
        """The end of the run: its last checkpoint (checkpoint.at_end), and the one in flight
        written and in place (collective)."""
        if self.cfg.at_end and self.run.state.step > start_step:
            self.save()
        began = time.perf_counter()
        self.saves.close()
        self.stats["end_wait_s"] += time.perf_counter() - began

    # ------------------------------------------------------------------ resuming

    def resume_if_asked(self) -> None:
        """A restarted worker continues from its run's newest good checkpoint (before it has
        one, from where the first generation started); else checkpoint.resume, if set."""
        run = self.run
        start = resolve_resume("auto", run.ckpt_dir) if restarted() else None
        if start is None and self.cfg.resume:
            start = resolve_resume(self.cfg.resume, run.ckpt_dir)
        if start is None:
            return
        self.resume(start)
        if not restarted() and run.state.step >= run.total_steps:
            raise UserError(
                f"checkpoint.resume: {start} is at step {run.state.step}, where this run ends "
                f"({run.total_steps} steps): nothing to train; raise train.max_steps or "
                "train.epochs to go on"
            )

    def resume(self, path: Path) -> None:
        run = self.run
        state, writer = load_checkpoint(
            path,
            model=unwrap(run.model),
            optimizer=run.optimizer,
            scaler=run.scaler,
            device=run.env.device,
            layout=run.layout,
            aliases=run.pipe.tied.aliases if run.pipe is not None and run.pipe.tied else None,
        )
        # The epoch's samples already trained on, in this layout's steps: the same position
        # when the layout is the same, the nearest step boundary before it when it is not.
        per_step = run.unique_per_step
        state.step_in_epoch = state.samples_in_epoch // per_step
        state.samples_in_epoch = state.step_in_epoch * per_step
        if run.cfg.train.max_steps is None:  # epochs decide the length: this layout's steps
            state.step = state.epoch * run.steps_per_epoch + state.step_in_epoch
        run.state = state
        note = self.restore_replica(path, writer)
        if writer.get("world_size") != run.env.world_size or writer.get("degrees") != (
            run.dims.describe()
        ):
            note += (
                f"; written by {writer.get('world_size')} processes ({writer.get('label', '?')}),"
                f" resharded to {run.dims.label()}; random streams restart"
            )
        if run.env.is_main:
            print(
                f"paratrain: resumed from {path} at step {state.step} (epoch {state.epoch}){note}",
                flush=True,
            )

    def restore_replica(self, path: Path, writer: dict) -> str:
        """sync.mode's own replica for this rank, over what DCP loaded (rank 0's copy): with the
        same processes the run goes on bit for bit; else every rank starts from rank 0's."""
        run = self.run
        if run.sync is None or not run.sync.keeps_replicas:
            return ""
        same_world = writer.get("world_size") == run.env.world_size
        replica = read_replica(path, run.env.rank) if same_world else None
        if replica is None:
            run.sync.load_state_dict({})  # DiLoCo: the shared weights are the loaded ones
            return "; the replicas restart from rank 0's weights (no replica of this rank's kept)"
        with torch.no_grad():
            unwrap(run.model).load_state_dict(replica["model"])
        run.optimizer.load_state_dict(replica["optimizer"])
        keep_implementation(run.optimizer)  # this run's fused / foreach, not the writer's
        run.sync.load_state_dict(replica["sync"])
        return ""
