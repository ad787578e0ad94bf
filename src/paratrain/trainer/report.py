"""Reporter: what rank 0 shows and logs while training: the progress bar (rate, loss, ETA), the
step log (steps.jsonl, TensorBoard, Weights & Biases) every log.every_steps, a line per epoch.

A point's GPU values (the loss, the gradient norm, an LM's token count, fp16's loss scale) are
copied to pinned host memory without waiting and read once the copies have landed, a step or
two later; nothing here waits for the GPU until an epoch ends or the log closes. Reading them
with .item() at the point waited for every queued kernel: the GPU then sat idle while the host
launched the next step (MobileNetV2 at 500 px on one H200, 2026-12-03 profile: ~3 ms idle at
each point, a point every 3 steps of 27 ms); so did the training clock's reading there, until
the point took the host's clock (TrainClock.queued). A point's step, time and learning rate
are the host's when the step was queued."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import torch

from paratrain.meters import metrics
from paratrain.trainer import result as results
from paratrain.trainer.steplog import StepLog, memory_in_use


@dataclass
class Point:
    """One log point's values as the step was queued: host numbers, and device ones on their way
    to pinned host memory (`landed` recorded after their copies; None when there were none)."""

    step: int
    done: int  # steps of this epoch so far (the bar's loss is the epoch's mean)
    seconds: float
    rate: float
    lr: float
    memory_bytes: int | None
    bar: bool
    log: bool
    values: dict = field(default_factory=dict)  # loss_sum, grad_norm, units, loss_scale
    landed: torch.cuda.Event | None = None


def send(values: dict) -> tuple[dict, torch.cuda.Event | None]:
    """-> the values with each CUDA tensor copied into pinned host memory without waiting (a CPU
    tensor cloned: the loss sum grows in place), and the event after the copies (None if none)."""
    sent, cuda = {}, False
    for key, v in values.items():
        if isinstance(v, torch.Tensor) and v.is_cuda:
            host = torch.empty(v.shape, dtype=v.dtype, pin_memory=True)
            sent[key], cuda = host.copy_(v.detach(), non_blocking=True), True
        else:
            sent[key] = v.detach().clone() if isinstance(v, torch.Tensor) else v
    event = None
    if cuda:
        event = torch.cuda.Event()
        event.record()
    return sent, event


def number(v) -> float | None:
    return float(v.item()) if isinstance(v, torch.Tensor) else v


def scale_of(scaler) -> torch.Tensor | float | None:
    """fp16's loss scale as GradScaler keeps it (a device tensor once it has stepped), not
    get_scale()'s .item()."""
    if scaler is None:
        return None
    if not scaler.is_enabled():
        return 1.0
    scale = scaler._get_scale_async()  # None before the first step
    return scaler.get_scale() if scale is None else scale


class Reporter:
    """log: log.*; label: the bar's; lm: a task that counts tokens (units are tokens, rank 0's
    times `copies`, the data-parallel replicas); has_loss: this rank holds the loss (a
    pipeline's last stage); lr: the learning rate at a step; wandb: wandb.init's project, name
    and config when log.wandb, else None."""

    def __init__(
        self,
        measure,
        *,
        log,
        schedule,
        start_step: int,
        is_main: bool,
        device,
        label: str,
        lm: bool,
        copies: int,
        has_loss: bool,
        out_dir,
        scaler,
        lr,
        wandb: dict | None = None,
    ):
        self.measure, self.schedule, self.device = measure, schedule, device
        self.scaler, self.lr, self.out_dir = scaler, lr, out_dir
        self.every = log.every_steps or log_every(schedule.total_steps)
        self.bar = is_main and log.progress
        self.progress = metrics.Progress(self.bar, schedule.total_steps, label)
        self.progress.update(start_step)
        self.step = start_step  # the last step finished
        logged = is_main and log.steps
        self.steplog = StepLog(
            out_dir,
            logged,
            log.tensorboard,
            start_step=start_step,
            wandb=wandb if logged else None,
        )
        self.lm, self.copies, self.has_loss, self.is_main = lm, copies, has_loss, is_main
        self.epoch_step, self.epoch_clock, self.epoch_loss = start_step, 0.0, 0.0
        self.pending: deque[Point] = deque()  # log points whose device values are on their way

    def open(self) -> None:
        """The run's first step has run: the step log's files begun (steplog.py)."""
        self.steplog.open()

    def trained_units(self, step: int) -> float:
        if self.lm:
            return float(self.measure.meter.tokens.item()) * self.copies
        return step * self.schedule.unique_per_step

    def epoch_start(self, step: int, loss_sum: float = 0.0) -> None:
        """loss_sum: where the epoch's sum starts (a resumed epoch's, from its checkpoint): the
        bar and the step log show the losses of this run's steps."""
        clock = self.measure.clock
        self.epoch_step, self.epoch_clock, self.epoch_loss = step, clock.elapsed(), loss_sum
        if self.steplog.enabled:
            self.steplog.start(step, loss_sum, clock.elapsed(), self.trained_units(step))

    def after_step(self, step: int, loss_sum: torch.Tensor, grad_norm=None) -> None:
        """Every step: the bar's count; at a log point its values sent (send()); the points whose
        values have landed shown and written. grad_norm: the step's (trainer/step.py), or None."""
        clock = self.measure.clock
        self.step = step
        due = step % self.every == 0
        bar, log = self.bar and due, self.steplog.enabled and due
        self.progress.update(step)
        if bar or log:
            done = step - self.epoch_step
            elapsed = clock.queued()  # no sync: the host's time as it queued the step
            values = {"loss_sum": loss_sum if self.has_loss else None}
            if log:
                values["units"] = self.measure.meter.tokens if self.lm else self.trained_units(step)
                values["grad_norm"] = grad_norm
                values["loss_scale"] = scale_of(self.scaler)
            values, landed = send(values)
            rate = self.schedule.unique_per_step * done / max(elapsed - self.epoch_clock, 1e-9)
            lr = self.lr(step - 1)
            memory = memory_in_use(self.device) if log else None
            self.pending.append(
                Point(step, done, elapsed, rate, lr, memory, bar, log, values, landed)
            )
        self.flush(wait=False)

    def flush(self, wait: bool) -> None:
        """Show and write the points whose values have landed, in order (all of them: wait)."""
        while self.pending:
            point = self.pending[0]
            if point.landed is not None:
                if not (wait or point.landed.query()):
                    return
                point.landed.synchronize()
            self.pending.popleft()
            self.emit(point)

    def salvage(self) -> None:
        """The points still on their way, written when the run ends by an error (close() has
        written them otherwise); a failure here (the GPU's own error) leaves the first one to
        be reported."""
        try:
            self.flush(wait=True)
        except Exception:  # noqa: BLE001 - the run's error is the one to surface
            self.pending.clear()

    def emit(self, point: Point) -> None:
        v = {key: number(value) for key, value in point.values.items()}
        if point.bar:
            loss = (
                (v["loss_sum"] - self.epoch_loss) / point.done
                if v["loss_sum"] is not None
                else None
            )
            self.progress.update(self.step, point.rate, loss)
        if point.log:
            units = v["units"] * self.copies if self.lm else v["units"]
            self.steplog.point(
                point.step,
                loss_sum=v["loss_sum"],
                seconds=point.seconds,
                units=units,
                unit="tokens" if self.lm else "samples",
                lr=point.lr,
                grad_norm=v["grad_norm"],
                memory_bytes=point.memory_bytes,
                loss_scale=v["loss_scale"],
            )

    def epoch_end(self, record: dict) -> None:
        self.flush(wait=True)  # this epoch's points before its line and the next epoch's sums
        if self.is_main:
            self.progress.print(results.epoch_line(record))

    def close(self) -> dict[str, str]:
        """-> the artifacts the step log left (steps.jsonl, curves.png, tensorboard/)."""
        self.flush(wait=True)
        self.progress.close()
        curves = self.steplog.close()
        artifacts = {}
        if self.steplog.enabled:
            artifacts["steps"] = str(self.steplog.path)
            if curves is not None:
                artifacts["curves"] = str(curves)
            if self.steplog.writer is not None:
                artifacts["tensorboard"] = str(self.out_dir / "tensorboard")
        return artifacts


def log_every(total_steps: int) -> int:
    """log.every_steps left at null: about 20 points a run, every 10 steps at most."""
    return max(1, min(10, total_steps // 20))
