"""Trainer: a run built once (trainer/setup.py) and the components that act on it, each owning
its state and its cadence:

    Checkpointer   every checkpoint.every_steps, at the end; the resume      checkpointer.py
    Evaluator      held-out metrics at the end of each epoch                 evaluate.py
    Measure        the training clock, warm-up mark, profiler, telemetry     measure.py
    Reporter       progress bar, step log every log.every_steps, epoch lines report.py
    NaNGuard       skipped steps (train.max_bad_steps)                       guard.py
    Watchdog       heartbeats; names a rank that falls behind                watchdog.py
    Interrupts     Ctrl-C / SIGTERM: every rank stops at a step boundary     interrupts.py
    RunLosses      the epochs' losses, carried across restarts in checkpoints losses.py

and the step, chosen once for the run (trainer/step.py: micro-batches, a pipeline schedule, or
the task's own step). `fit` is the loop: read it top to bottom.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from paratrain.distributed import process_group as pg
from paratrain.errors import Interrupted
from paratrain.launch import runfolder
from paratrain.meters import metrics
from paratrain.tasks import counts_tokens
from paratrain.trainer import faults
from paratrain.trainer import result as results
from paratrain.trainer.checkpointer import Checkpointer
from paratrain.trainer.evaluate import Evaluator
from paratrain.trainer.guard import NaNGuard
from paratrain.trainer.interrupts import Interrupts
from paratrain.trainer.losses import RunLosses
from paratrain.trainer.measure import Measure, gc_pause, gc_tick, lr_at, run_devices, set_lr
from paratrain.trainer.report import Reporter
from paratrain.trainer.setup import announce, setup, tidy, write_plan
from paratrain.trainer.step import Step, choose_step
from paratrain.trainer.watchdog import Watchdog, limit_for


class Trainer:
    """What setup builds (built: trainer.built.Built), the lengths decided once (schedule), the
    loop's state (state: where it is, what it skipped), and the components, each given the
    fields it reads."""

    def __init__(self, plan, env: pg.DistEnv):
        self.built, self.schedule = built, schedule = setup(plan, env)
        cfg = built.cfg
        pipe = built.pipe
        self.checkpoints = Checkpointer(
            cfg.checkpoint,
            built.held,
            ckpt_dir=built.ckpt_dir,
            out_dir=built.out_dir,
            env=env,
            dims=built.dims,
            schedule=schedule,
            tied=pipe.tied.aliases if pipe is not None and pipe.tied else None,
            epochs_decide=cfg.train.max_steps is None,
        )
        self.state = state = self.checkpoints.resume_if_asked()
        self.interrupts = Interrupts(env.world_size, state.step)
        self.losses = RunLosses(
            state,
            rank=env.rank,
            world=env.world_size,
            replicas=env.world_size // built.dims.pp,
            device=env.device,
        )
        self.loss_sum: torch.Tensor | None = None  # the epoch's, on this rank
        announce(built)  # the plan's lines, once every check has passed
        self.watchdog = Watchdog(
            env.rank,
            env.world_size,
            limit_for(cfg.dist.watchdog_s, cfg.dist.timeout_s),
            dump_dir=built.out_dir / "flight_recorder" if cfg.dist.flight_recorder else None,
            backend=env.backend,
        )
        self.measure = Measure(
            env,
            cfg.train,
            start_step=state.step,
            out_dir=built.out_dir,
            watchdog_s=cfg.dist.watchdog_s,
            devices=run_devices(built.split, env.device),
        )
        self.report = reporter(built, schedule, self.measure, state.step)
        self.guard = NaNGuard(
            state, limit=cfg.train.max_bad_steps, ckpt_dir=built.ckpt_dir, is_main=env.is_main
        )
        self.evaluate = Evaluator(
            self.watchdog,
            enabled=cfg.train.eval,
            model=built.model,
            eval_model=built.eval_model,
            val=built.work.val,
            score=built.work.evaluate,
            sync=built.sync,
            step_context=built.step_context,
            pipe=pipe,
            autocast=built.policy.autocast,
            loader_batch=schedule.loader_batch,
            before=built.sync_buffers,
        )
        self.step = choose_step(Step.of_built(built), schedule.k)
        self.start_step = state.step
        self.folder_written = False

    def fit(self) -> dict[str, Any]:
        built, state, total = self.built, self.state, self.schedule.total_steps
        began, epochs = time.perf_counter(), list(self.losses.epochs)  # the run's before this one
        gc_pause(built.cfg.train.gc_every_steps)
        self.interrupts.install()
        try:
            while state.step < total:
                epochs.append(self.epoch())
            return self.finish(epochs, began)
        finally:
            self.measure.profiler.discard()  # still open only if the run failed inside it
            self.report.salvage()  # a failed run's last points (the steps before a divergence)
            self.watchdog.stop()
            self.interrupts.close()

    def epoch(self) -> dict[str, Any]:
        """One pass over this rank's share of the data (or what is left of it on resume),
        then the held-out metrics."""
        built, state, clock, schedule = self.built, self.state, self.measure.clock, self.schedule
        skip = schedule.skip(state.step_in_epoch)  # resume mid-epoch
        built.work.sampler.set_epoch(state.epoch, skip=skip)
        built.model.train()
        first, began, wall = state.step, clock.elapsed(), time.perf_counter()
        so_far = self.losses.begin(state)  # a resumed epoch's sum goes on from its checkpoint's
        self.loss_sum = torch.full((), so_far, device=built.env.device, dtype=torch.float64)
        batches = iter(built.work.train)
        clock.resume()
        self.report.epoch_start(state.step, so_far)
        per_epoch, total = schedule.steps_per_epoch, schedule.total_steps
        while state.step_in_epoch < per_epoch and state.step < total:
            self.train_step(batches)
        if state.step < total and self.interrupts.stop_at(state.step, boundary=True):
            self.interrupt()
        clock.pause()
        self.guard.read()
        record = self.epoch_record(first, clock.elapsed() - began)
        complete = state.step_in_epoch >= per_epoch
        if complete:
            state.epoch += 1
            state.step_in_epoch = 0
        record.update(self.evaluate(state.step))
        record["wall_s"] = time.perf_counter() - wall  # training + evaluation
        self.losses.ended(record, complete)
        self.report.epoch_end(record)
        return record

    def train_step(self, batches) -> None:
        """One optimizer step, and what follows it: its loss into the epoch's sum (none for a
        skipped step, nor on a pipeline stage without the loss), the components' turns."""
        built, state, tc = self.built, self.state, self.built.cfg.train
        total = self.schedule.total_steps
        self.measure.before_step(state.step)
        set_lr(built.optimizer, lr_at(state.step, total, tc))
        began = time.perf_counter()
        self.watchdog.beat(state.step + 1, "step")

        # forward, backward, optimizer step
        loss, tokens, good, grad_norm = self.step(batches, state.step)

        loss = self.guard.judge(loss, good)
        if loss is not None:
            self.loss_sum += loss
        self.measure.count(tokens)
        state.step += 1
        state.step_in_epoch += 1
        gc_tick(tc.gc_every_steps, state.step)
        # this run's first step has run: its folder is written from here
        wrote = self.first_step_done() if not self.folder_written else 0.0
        saving = self.checkpoint_if_due()
        self.watchdog.beat(state.step, "between steps")
        faults.after_step(built.env.rank, state.step)  # PARATRAIN_FAULTS only (tests, chaos)
        # the stop check is a collective: a rank waiting there for a stalled one waits in this
        # step, so the step's time (and the stall meter) must include it
        stop = state.step < total and self.interrupts.stop_at(state.step)
        self.measure.after_step(state.step, time.perf_counter() - began - saving - wrote)
        # logged after a stall's excess left the clock: the next step's rate stays its own
        self.report.after_step(state.step, self.loss_sum, grad_norm)
        if stop:
            self.interrupt()  # (at the last step the run ends as it would)

    def first_step_done(self) -> float:
        """The run's first step has run (its work waited for: on a GPU a failed kernel shows
        by now): from here the run writes into its folder. -> the seconds that took, out of
        the training clock and the step's time."""
        clock, began = self.measure.clock, time.perf_counter()
        clock.pause()
        self.watchdog.beat(self.state.step, "writing the run folder")  # wandb.init: seconds
        self.write_folder()
        clock.resume()
        return time.perf_counter() - began

    def write_folder(self) -> None:
        """config.yaml, plan.json, and the step log opened (steps.jsonl, TensorBoard, wandb):
        written once the run's first step has run, so that a mistake found before it (a
        corrupt image in the first batch, a model that does not fit its data) leaves the
        folder as it was (launch/runfolder/)."""
        if not self.folder_written:
            self.folder_written = True
            write_plan(self.built, self.checkpoints.owner["run"])
            self.report.open()
            if self.built.env.is_main:
                runfolder.record(self.built.out_dir)  # the step log's files: the run's

    def interrupt(self) -> None:
        """Ctrl-C / SIGTERM, agreed by every rank at this step boundary: the step's checkpoint
        (checkpoint.on_interrupt), the logs closed, then Interrupted (exit 130)."""
        built = self.built
        self.write_folder()  # (a no-op after a step; a checkpoint needs its config.yaml)
        self.measure.clock.pause()
        self.guard.read()  # the checkpoint's list of skipped steps is complete
        self.watchdog.beat(self.state.step, "checkpoint")
        built.sync_buffers()
        self.losses.carry(self.state, self.loss_sum)
        checkpoint = self.checkpoints.on_interrupt(self.state)
        self.report.close()
        tidy(built)
        raise Interrupted(self.state.step, checkpoint, str(built.out_dir))

    def checkpoint_if_due(self) -> float:
        """-> the seconds a checkpoint took (already outside the training clock)."""
        built, state, clock = self.built, self.state, self.measure.clock
        if not self.checkpoints.due(state.step):
            return 0.0
        began = time.perf_counter()
        self.guard.read()  # a checkpoint's list of skipped steps is complete
        clock.pause()
        self.watchdog.beat(state.step, "checkpoint")
        built.sync_buffers()
        self.losses.carry(state, self.loss_sum)
        self.checkpoints.save(state)
        clock.resume()
        return time.perf_counter() - began

    def epoch_record(self, first: int, train_s: float) -> dict[str, Any]:
        """The epoch's steps and time in this run; its loss over all its steps, those before a
        resume included (trainer/losses.py)."""
        built, state = self.built, self.state
        steps = state.step - first
        good = self.losses.good_steps(state)
        (loss_total,) = pg.all_reduce_sum([self.loss_sum.item()], built.env.device)
        return {
            "epoch": state.epoch,
            "steps": steps,
            "train_s": train_s,
            # each data-parallel replica's loss once: tp ranks repeat it, and of a pipeline's
            # stages only the last has it
            "train_loss": loss_total / (built.env.world_size // built.dims.pp) / max(good, 1),
            "train_loss_steps": self.losses.covered(state),
            "unique_samples_per_s": self.schedule.unique_per_step * steps / max(train_s, 1e-9),
        }

    def finish(self, epochs: list[dict], began: float) -> dict[str, Any]:
        """The end of the run: the last checkpoint, the task's artifacts, result.json."""
        built, measure, state = self.built, self.measure, self.state
        self.write_folder()  # (a no-op after a step: a run with none left to take has none)
        artifacts = self.report.close()
        built.sync.finish()  # stale-1: the last all-reduce waited for (its gradients not applied)
        telemetry = measure.finish()
        built.sync_buffers()  # the final state, for the checkpoint and the run's artifacts
        self.losses.carry(state, self.loss_sum)
        self.checkpoints.finish(state, self.start_step)
        if built.work.finish is not None:
            artifacts = {**built.work.finish(built.model, built.out_dir), **artifacts}
        facts = results.facts_of(built, self.schedule.k, state.step - self.start_step)
        result = results.build(
            facts,
            self.schedule,
            state,
            epochs=epochs,
            start_step=self.start_step,
            window=measure.meter.window(state.step, measure.clock),
            joules=measure.meter.joules(state.step, measure.clock),
            tokens=measure.meter.tokens,
            train_s=measure.clock.elapsed(),
            wall_s=time.perf_counter() - began,
            telemetry=telemetry,
            profile=measure.profiler.summary,
            phases=measure.profiler.phases,
            artifacts=artifacts,
            stalls={"slow_steps": measure.stalls.stalls, "stragglers": self.watchdog.incidents},
            checkpoints=self.checkpoints.stats,
            step_times=measure.stalls.times,  # each step's seconds, as the stall meter saw them
        )
        if built.work.floor:  # train.floor: the step's matmuls and attention timed alone
            result["summary"]["floor"] = results.floor_or_why(built, self.schedule.k, result)
        if built.env.is_main:
            metrics.write_json(built.out_dir / "result.json", result)
            results.print_summary(result)
        pg.barrier()
        tidy(built)
        return result


def reporter(built, schedule, measure: Measure, start_step: int) -> Reporter:
    """The Reporter, given what it shows: the bar's label, the step log's settings, what
    counts as a trained unit (tokens of a language model, else samples)."""
    cfg, env = built.cfg, built.env
    label = f"{built.plan.label} x{env.world_size} {cfg.precision}"
    label += " [redundant data]" if built.redundant else ""
    wandb = {"project": cfg.log.wandb_project, "name": cfg.name, "config": cfg.to_dict()}
    return Reporter(
        measure,
        log=cfg.log,
        schedule=schedule,
        start_step=start_step,
        is_main=env.is_main,
        device=env.device,
        label=label,
        lm=counts_tokens(built.plan.task),
        copies=1 if built.redundant else built.dims.dp_size,  # tokens: rank 0's x replicas
        has_loss=built.pipe is None or built.pipe.last,  # a pipeline's: on its last stage
        out_dir=built.out_dir,
        scaler=built.scaler,
        lr=lambda step: lr_at(step, schedule.total_steps, cfg.train),
        wandb=wandb if cfg.log.wandb else None,
    )
