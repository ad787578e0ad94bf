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
    LoopState,
    keep_implementation,
    list_checkpoints,
    load_checkpoint,
    read_replica,
    resolve_resume,
    room,
    save_checkpoint,
)
from paratrain.checkpoint.integrity import owner
from paratrain.checkpoint.store import set_aside, step_of
from paratrain.distributed import process_group as pg
from paratrain.errors import UserError
from paratrain.launch import runfolder
from paratrain.launch.runfolder import restarted
from paratrain.protocols import unwrap
from paratrain.trainer.built import Held, Schedule


class Checkpointer:
    """cfg: checkpoint.*; held: what is saved and loaded; the rank's place (env, dims); the
    schedule (a checkpoint's position in an epoch, in samples); tied: a pipeline's tied
    weights' aliases, else None; epochs_decide: train.max_steps unset (a resumed run's step
    follows from its epoch, in this layout's steps); out_dir: the run folder (its ledger: the
    run's id, and what --overwrite set aside until this run's first checkpoint)."""

    def __init__(
        self,
        cfg,
        held: Held,
        *,
        ckpt_dir: Path,
        out_dir: Path,
        env: pg.DistEnv,
        dims,
        schedule: Schedule,
        tied: dict | None = None,
        epochs_decide: bool = True,
    ):
        self.cfg, self.held, self.ckpt_dir, self.out_dir = cfg, held, ckpt_dir, out_dir
        self.env, self.dims, self.schedule = env, dims, schedule
        self.tied, self.epochs_decide = tied, epochs_decide
        self.layout = {"degrees": dims.describe(), "label": dims.label()}
        self.saves = AsyncSaves(self.cfg.async_mode)
        self.stats = {"saves": 0, "blocking_s": 0.0, "end_wait_s": 0.0}
        """Checkpoints written by this run, the time its steps waited for them, and (async)
        the time the end of the run waited for the last write."""
        self.saved_step: int | None = None
        self.owner: dict = {}
        """The run's id and the line of checkpoints this run continues (resume_if_asked):
        written into each checkpoint's manifest; pruning keeps to it."""
        if env.is_main and room.writes(cfg):  # before step 1: room for one checkpoint
            size = room.estimate(unwrap(held.model), held.optimizer)
            room.check(ckpt_dir, size, "one checkpoint of this model and its optimizer")

    def due(self, step: int) -> bool:
        """Every checkpoint.every_steps, except the last step (the end of the run saves)."""
        every = self.cfg.every_steps
        return bool(every) and step % every == 0 and step < self.schedule.total_steps

    def save(self, state: LoopState) -> None:
        """The same state, the same files, on every rank (collective)."""
        held, s = self.held, self.schedule
        state.samples_in_epoch = state.step_in_epoch * s.k * s.loader_batch * s.partition
        began = time.perf_counter()
        replica = self.replica()
        # DCP keeps one copy of each replicated tensor, from whichever rank its planner picks:
        # that copy is the replicas' mean, and each rank's own goes in its replica file
        one = held.sync.one_model(unwrap(held.model)) if held.sync else contextlib.nullcontext()
        with one:
            save_checkpoint(
                self.ckpt_dir,
                model=unwrap(held.model),
                optimizer=held.optimizer,
                scaler=held.scaler,
                state=state,
                device=self.env.device,
                keep=self.cfg.keep,
                layout=self.layout,
                saves=self.saves,
                replica=replica,
                owner=self.owner,
            )
        if self.saves.mode == "none":
            self.landed()
        self.stats["saves"] += 1
        self.stats["blocking_s"] += time.perf_counter() - began
        self.saved_step = state.step

    def replica(self) -> dict | None:
        """sync.mode local_sgd / diloco / stale: this rank's weights, optimizer and sync state,
        which DCP's one copy of replicated tensors would lose."""
        held = self.held
        if held.sync is None or not held.sync.keeps_replicas:
            return None
        return {
            "model": {k: v.detach().clone() for k, v in unwrap(held.model).state_dict().items()},
            "optimizer": held.optimizer.state_dict(),
            "sync": held.sync.state_dict(),
        }

    def on_interrupt(self, state: LoopState) -> str | None:
        """The run stops at this step boundary (Ctrl-C, SIGTERM): its checkpoint, written and
        in place, unless checkpoint.on_interrupt is off -> its folder (collective)."""
        if not self.cfg.on_interrupt:
            return None
        if self.saved_step != state.step:
            self.save(state)
        self.saves.close()
        self.landed()
        found = list_checkpoints(self.ckpt_dir)
        return str(found[-1]) if found else None

    def finish(self, state: LoopState, start_step: int) -> None:
        """The end of the run: its last checkpoint (checkpoint.at_end), and the one in flight
        written and in place (collective)."""
        if self.cfg.at_end and state.step > start_step:
            self.save(state)
        began = time.perf_counter()
        self.saves.close()
        self.stats["end_wait_s"] += time.perf_counter() - began
        self.landed()

    def landed(self) -> None:
        """A checkpoint of this run is in place (rank 0): what --overwrite set aside is not
        needed any more, and the ledger lists what the run wrote so far."""
        if self.env.is_main and self.saved_step is not None:
            runfolder.drop_overwritten(self.out_dir)
            runfolder.record(self.out_dir)

    # ------------------------------------------------------------------ resuming

    def resume_if_asked(self) -> LoopState:
        """-> where the loop starts: a restarted worker continues from its run's newest good
        checkpoint (before it has one, from where the first generation started); else
        checkpoint.resume, if set; else the beginning."""
        start = resolve_resume("auto", self.ckpt_dir) if restarted() else None
        if start is None and self.cfg.resume:
            start = resolve_resume(self.cfg.resume, self.ckpt_dir)
        decided = pg.broadcast_object(self.line(start) if self.env.is_main else None)
        self.owner, later = decided
        if start is None:
            return LoopState()
        state = self.resume(start)
        total = self.schedule.total_steps
        if not restarted() and state.step >= total:
            raise UserError(
                f"checkpoint.resume: {start} is at step {state.step}, where this run ends "
                f"({total} steps): nothing to train; raise train.max_steps or "
                "train.epochs to go on"
            )
        if later and self.env.is_main:  # the resume holds: the branch it leaves goes aside
            folder = set_aside(
                self.ckpt_dir, [self.ckpt_dir / n for n in later], f"after-{start.name}"
            )
            print(
                f"paratrain: resuming from {start.name} starts a new line of checkpoints; the "
                f"later ones ({', '.join(later)}) are kept in {folder}",
                flush=True,
            )
        return state

    def line(self, start: Path | None) -> tuple[dict, list[str]]:
        """Rank 0: whose this run's checkpoints are -> ({"run", "lineage", "parent"}, the
        checkpoints after `start` to set aside once the resume holds). The run keeps its
        folder's id when it continues there. A resume from the newest checkpoint of the folder,
        of this run, continues that checkpoint's line; from an older one (or another run's) it
        starts a new line, and the checkpoints after it (the branch left, a damaged newest) are
        moved aside into <checkpoints>/aside/, named, kept, never picked by --resume DIR."""
        continues = restarted() or bool(self.cfg.resume)
        run = (runfolder.run_id(self.out_dir) if continues else None) or runfolder.new_id()
        if start is None:
            return {"run": run, "lineage": runfolder.new_id(), "parent": None}, []
        held = owner(start)
        later = [c.name for c in list_checkpoints(self.ckpt_dir) if step_of(c) > step_of(start)]
        if not later and held.get("run") in (None, run):
            lineage = held.get("lineage") or runfolder.new_id()
            return {"run": run, "lineage": lineage, "parent": held.get("parent")}, []
        parent = [held.get("lineage"), step_of(start)]
        return {"run": run, "lineage": runfolder.new_id(), "parent": parent}, later

    def resume(self, path: Path) -> LoopState:
        """The checkpoint at `path` loaded into the model, optimizer and scaler -> its loop
        state, in this layout's steps."""
        held, env, dims = self.held, self.env, self.dims
        state, writer = load_checkpoint(
            path,
            model=unwrap(held.model),
            optimizer=held.optimizer,
            scaler=held.scaler,
            device=env.device,
            layout=self.layout,
            aliases=self.tied,
        )
        # The epoch's samples already trained on, in this layout's steps: the same position
        # when the layout is the same, the nearest step boundary before it when it is not.
        per_step = self.schedule.unique_per_step
        state.step_in_epoch = state.samples_in_epoch // per_step
        state.samples_in_epoch = state.step_in_epoch * per_step
        if self.epochs_decide:  # epochs decide the length: this layout's steps
            state.step = state.epoch * self.schedule.steps_per_epoch + state.step_in_epoch
        note = self.restore_replica(path, writer)
        if writer.get("world_size") != env.world_size or writer.get("degrees") != dims.describe():
            note += (
                f"; written by {writer.get('world_size')} processes ({writer.get('label', '?')}),"
                f" resharded to {dims.label()}; random streams restart"
            )
        if env.is_main:
            print(
                f"paratrain: resumed from {path} at step {state.step} (epoch {state.epoch}){note}",
                flush=True,
            )
        return state

    def restore_replica(self, path: Path, writer: dict) -> str:
        """sync.mode's own replica for this rank, over what DCP loaded (rank 0's copy): with the
        same processes the run goes on bit for bit; else every rank starts from rank 0's."""
        held = self.held
        if held.sync is None or not held.sync.keeps_replicas:
            return ""
        same_world = writer.get("world_size") == self.env.world_size
        replica = read_replica(path, self.env.rank) if same_world else None
        if replica is None:
            held.sync.load_state_dict({})  # DiLoCo: the shared weights are the loaded ones
            return "; the replicas restart from rank 0's weights (no replica of this rank's kept)"
        with torch.no_grad():
            unwrap(held.model).load_state_dict(replica["model"])
        held.optimizer.load_state_dict(replica["optimizer"])
        keep_implementation(held.optimizer)  # this run's fused / foreach, not the writer's
        held.sync.load_state_dict(replica["sync"])
        return ""
