"""The training loop. Read `train` top to bottom: set-up (trainer/setup.py), the steps
(trainer/step.py: forward, loss, backward, optimizer step), evaluation at the end of each epoch,
checkpoints, the result (trainer/result.py).

Every rank runs this function; rank 0 alone prints, shows the bar and writes files.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch

from paratrain import faults, flight, metrics
from paratrain.distributed import process_group as pg
from paratrain.profiling import StepProfiler
from paratrain.protocols import unwrap
from paratrain.tasks import counts_tokens
from paratrain.telemetry import GpuSampler, energy_counter
from paratrain.trainer import result as results
from paratrain.trainer.measure import (
    Meter,
    TrainClock,
    gc_pause,
    gc_schedule,
    gc_tick,
    lr_at,
    sdpa_priority,
    set_lr,
)
from paratrain.trainer.setup import Run, deterministic_env, setup
from paratrain.trainer.step import train_step
from paratrain.trainer.steplog import StepLog, memory_in_use
from paratrain.trainer.watchdog import StallMeter, Watchdog


def train(plan) -> dict[str, Any]:
    """Train the run `plan` (runplan.RunPlan, or a RunConfig resolved here) describes, on
    this process's rank."""
    from paratrain.runplan import RunPlan, resolve

    plan = plan if isinstance(plan, RunPlan) else resolve(plan)
    cfg = plan.config
    deterministic_env(cfg)
    from paratrain.launch import threads_per_process

    torch.set_num_threads(
        threads_per_process(cfg.launch, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    )
    if plan.multiprocess:
        flight.enable(
            cfg.dist.flight_recorder,
            Path(cfg.output_dir) / "flight_recorder" if cfg.output_dir else None,
            cuda=cfg.device != "cpu" and torch.cuda.is_available(),
        )
    env = pg.init_distributed(cfg.device, plan.multiprocess, cfg.dist.timeout_s)
    try:
        with sdpa_priority(cfg.train.sdpa_backend), gc_schedule(cfg.train.gc_every_steps):
            run = setup(plan, env)
            watchdog = Watchdog(
                env.rank,
                env.world_size,
                cfg.dist.watchdog_s,
                dump_dir=run.out_dir / "flight_recorder" if cfg.dist.flight_recorder else None,
                backend=env.backend,
            )
            try:
                return _loop(run, watchdog)
            finally:
                watchdog.stop()
    finally:
        pg.shutdown()


def _loop(run: Run, watchdog: Watchdog) -> dict[str, Any]:
    cfg, env, state, tc = run.cfg, run.env, run.state, run.cfg.train
    device, work = env.device, run.work
    label = f"{run.plan.label} x{env.world_size} {cfg.precision}" + (
        " [redundant data]" if run.redundant else ""
    )
    progress = metrics.Progress(env.is_main and cfg.log.progress, run.total_steps, label)
    progress.update(state.step)
    metrics.reset_peak_memory(device)
    gpu = GpuSampler(device)  # clocks, power, temperature over the measured steps
    clock = TrainClock(device, energy_counter(run_devices(run)), gpu)
    meter = Meter(device, state.step, tc.warmup_steps, tc.profile_steps)
    profiler = StepProfiler(device, tc.profile_steps, run.out_dir, env.is_main)
    start_step = state.step
    epochs: list[dict[str, Any]] = []
    run_start = time.perf_counter()
    has_loss = run.pipe is None or run.pipe.last  # a pipeline's loss lives on its last stage
    stalls = StallMeter(cfg.dist.watchdog_s)  # steps far slower than usual, out of throughput
    logged = env.is_main and cfg.log.steps
    steplog = StepLog(
        run.out_dir,
        logged,
        cfg.log.tensorboard,
        resumed=start_step > 0,
        wandb=(
            {"project": cfg.log.wandb_project, "name": cfg.name, "config": cfg.to_dict()}
            if logged and cfg.log.wandb
            else None
        ),
    )
    lm = counts_tokens(run.plan.task)
    copies = 1 if run.redundant else run.dims.dp_size  # tokens: rank 0's, times the replicas

    def trained_units() -> float:
        return float(meter.tokens.item()) * copies if lm else state.step * run.unique_per_step

    late = LateVerdicts()

    # ================================================================ the loop
    gc_pause(tc.gc_every_steps)
    while state.step < run.total_steps:
        skip = state.step_in_epoch * run.k * run.loader_batch  # resume mid-epoch
        work.sampler.set_epoch(state.epoch, skip=skip)
        run.model.train()
        epoch_first_step, epoch_clock, epoch_wall = state.step, clock.elapsed(), time.perf_counter()
        loss_sum = torch.zeros((), device=device, dtype=torch.float64)
        batches = iter(work.train)
        clock.resume()
        if steplog.enabled:
            steplog.start(state.step, 0.0, clock.elapsed(), trained_units())
        while state.step_in_epoch < run.steps_per_epoch and state.step < run.total_steps:
            if state.step - start_step == tc.warmup_steps:
                profiler.start()  # when asked for: the steps right after warm-up
            if meter.at_warm_mark(state.step):
                profiler.stop()
                meter.mark(state.step, clock)  # throughput counts from here
                gpu.start()
            set_lr(run.optimizer, lr_at(state.step, run.total_steps, tc))
            step_start = time.perf_counter()
            watchdog.beat(state.step + 1, "step")

            loss, tokens, good = train_step(run, batches)  # forward, backward, optimizer step

            if isinstance(good, torch.Tensor):  # the guard's flag, judged on the device
                late.read(run)  # the step before's, finished by now (this one is queued)
                late.add(state.step + 1, good)
                if loss is not None:
                    loss_sum += torch.where(good > 0, torch.zeros_like(loss), loss)
            elif not good:
                skipped_bad_step(run)
            elif loss is not None:
                loss_sum += loss
            if tokens is not None:
                meter.tokens += tokens
            state.step += 1
            state.step_in_epoch += 1
            gc_tick(tc.gc_every_steps, state.step)

            if env.is_main and cfg.log.progress and state.step % cfg.log.every_steps == 0:
                done = state.step - epoch_first_step
                rate = run.unique_per_step * done / max(clock.elapsed() - epoch_clock, 1e-9)
                progress.update(state.step, rate, loss_sum.item() / done if has_loss else None)
            else:
                progress.update(state.step)
            if steplog.enabled and state.step % cfg.log.every_steps == 0:
                steplog.point(
                    state.step,
                    loss_sum=loss_sum.item() if has_loss else None,
                    seconds=clock.elapsed(),
                    units=trained_units(),
                    unit="tokens" if lm else "samples",
                    lr=lr_at(state.step - 1, run.total_steps, tc),
                    grad_norm=float(run.grad_norm) if run.grad_norm is not None else None,
                    memory_bytes=memory_in_use(device),
                    loss_scale=run.scaler.get_scale() if run.scaler is not None else None,
                )
            every = cfg.checkpoint.every_steps
            saving = time.perf_counter()
            if every and state.step % every == 0 and state.step < run.total_steps:
                late.read(run)  # a checkpoint's list of skipped steps is complete
                clock.pause()
                watchdog.beat(state.step, "checkpoint")
                run.sync_buffers()
                run.save()
                clock.resume()
            saving = time.perf_counter() - saving  # already outside the training clock
            watchdog.beat(state.step, "between steps")
            faults.after_step(env.rank, state.step)  # PARATRAIN_FAULTS only (tests, chaos)
            # the loss check's sync makes this the step's real time (also on a GPU)
            clock.exclude(stalls.step(state.step, time.perf_counter() - step_start - saving))
        clock.pause()
        late.read(run)

        epoch_steps = state.step - epoch_first_step
        good_steps = epoch_steps - sum(epoch_first_step < b <= state.step for b in state.bad_steps)
        train_s = clock.elapsed() - epoch_clock
        (loss_total,) = pg.all_reduce_sum([loss_sum.item()], device)
        record = {
            "epoch": state.epoch,
            "steps": epoch_steps,
            "train_s": train_s,
            # each data-parallel replica's loss once: tp ranks repeat it, and of a pipeline's
            # stages only the last has it
            "train_loss": loss_total / (env.world_size // run.dims.pp) / max(good_steps, 1),
            "unique_samples_per_s": run.unique_per_step * epoch_steps / max(train_s, 1e-9),
        }
        if state.step_in_epoch >= run.steps_per_epoch:
            state.epoch += 1
            state.step_in_epoch = 0
        if work.val is not None and tc.eval:
            watchdog.beat(state.step, "evaluation")
            run.sync_buffers()
            # local SGD / DiLoCo: the replicas' mean is evaluated (the model the run returns)
            with run.step_context(), run.sync.one_model(unwrap(run.model)):
                if run.pipe is not None:
                    held = run.pipe.evaluate(
                        run.eval_model, work.val, run.policy.autocast, run.loader_batch
                    )
                else:
                    held = work.evaluate(run.eval_model, work.val)
            record.update(held)
        record["wall_s"] = time.perf_counter() - epoch_wall  # training + evaluation
        epochs.append(record)
        if env.is_main:
            progress.print(results.epoch_line(record))
    # ================================================================ end of loop

    progress.close()
    run.sync.finish()  # stale-1: the last all-reduce waited for (its gradients are not applied)
    curves = steplog.close()
    profiler.stop()  # a run too short to reach its measured steps
    telemetry = pg.all_gather_object(gpu.stop())
    run.sync_buffers()  # the final state, for the checkpoint and the run's artifacts
    if cfg.checkpoint.at_end and state.step > start_step:
        run.save()
    run.finish_saves()
    artifacts = work.finish(run.model, run.out_dir) if work.finish is not None else {}
    if steplog.enabled:
        artifacts["steps"] = str(steplog.path)
        if curves is not None:
            artifacts["curves"] = str(curves)
        if steplog.writer is not None:
            artifacts["tensorboard"] = str(run.out_dir / "tensorboard")
    result = results.build(
        run,
        epochs=epochs,
        start_step=start_step,
        window=meter.window(state.step, clock),
        joules=meter.joules(state.step, clock),
        tokens=meter.tokens,
        train_s=clock.elapsed(),
        wall_s=time.perf_counter() - run_start,
        telemetry=telemetry,
        profile=profiler.summary,
        phases=profiler.phases,
        artifacts=artifacts,
        stalls={"slow_steps": stalls.stalls, "stragglers": watchdog.incidents},
    )
    if env.is_main:
        metrics.write_json(run.out_dir / "result.json", result)
        results.print_summary(result)
    pg.barrier()
    return result


def run_devices(run: Run) -> list[torch.device]:
    """The devices this rank drives: every GPU a layer split spans, else its own."""
    if run.split and run.env.device.type == "cuda":
        return [torch.device(d) for d in run.split["devices"]]
    return [run.env.device]


class LateVerdicts:
    """The NaN guard's flags of steps judged on the device (step.guard_on_device), read by the
    host one step later: copied to pinned memory behind the step's work, waited for once the
    next step is queued, so the GPU never idles for the read."""

    def __init__(self) -> None:
        self.pending: list[tuple[int, torch.Tensor, Any]] = []

    def add(self, step: int, flag: torch.Tensor) -> None:
        if flag.is_cuda:
            host = torch.empty((), dtype=flag.dtype, pin_memory=True)
            host.copy_(flag, non_blocking=True)
            done = torch.cuda.Event()
            done.record()
        else:
            host, done = flag, None
        self.pending.append((step, host, done))

    def read(self, run: Run) -> None:
        pending, self.pending = self.pending, []
        for step, host, done in pending:
            if done is not None:
                done.synchronize()
            if host.item() > 0:
                skipped_bad_step(run, step)


def skipped_bad_step(run: Run, step: int | None = None) -> None:
    """A step with a non-finite loss or gradient was not applied (every rank skipped it):
    count it, say so, and stop once train.max_bad_steps is passed. `step`: a step judged on
    the device and read later; default the step being finished (1-based, as printed)."""
    from paratrain.errors import UserError
    from paratrain.trainer.checkpoint import list_checkpoints

    state = run.state
    step = state.step + 1 if step is None else step
    state.bad_steps.append(step)
    limit = run.cfg.train.max_bad_steps
    if run.env.is_main:
        print(
            f"paratrain: step {step}: non-finite loss or gradient; skipped "
            f"({len(state.bad_steps)} of at most {limit})",
            flush=True,
        )
    if len(state.bad_steps) > limit:
        good = list_checkpoints(run.ckpt_dir)
        raise UserError(
            f"train: {len(state.bad_steps)} steps had a non-finite loss or gradient (steps "
            f"{', '.join(map(str, state.bad_steps[-5:]))}); stopped. Last checkpoint: "
            f"{good[-1] if good else 'none'}. Lower train.lr, or raise train.max_bad_steps"
        )
