"""Reporter: what rank 0 shows and logs while training: the progress bar (rate, loss, ETA), the
step log (steps.jsonl, TensorBoard, Weights & Biases) every log.every_steps, a line per epoch."""

from __future__ import annotations

import torch

from paratrain import metrics
from paratrain.tasks import counts_tokens
from paratrain.trainer import result as results
from paratrain.trainer.measure import lr_at
from paratrain.trainer.steplog import StepLog, memory_in_use


class Reporter:
    def __init__(self, run, measure):
        cfg, env, state = run.cfg, run.env, run.state
        self.run, self.measure = run, measure
        self.every = cfg.log.every_steps or log_every(run.total_steps)
        label = f"{run.plan.label} x{env.world_size} {cfg.precision}"
        label += " [redundant data]" if run.redundant else ""
        self.progress = metrics.Progress(env.is_main and cfg.log.progress, run.total_steps, label)
        self.progress.update(state.step)
        self.bar = env.is_main and cfg.log.progress
        logged = env.is_main and cfg.log.steps
        wandb = {"project": cfg.log.wandb_project, "name": cfg.name, "config": cfg.to_dict()}
        self.steplog = StepLog(
            run.out_dir,
            logged,
            cfg.log.tensorboard,
            resumed=state.step > 0,
            wandb=wandb if logged and cfg.log.wandb else None,
        )
        self.lm = counts_tokens(run.plan.task)
        self.copies = 1 if run.redundant else run.dims.dp_size  # tokens: rank 0's x replicas
        self.has_loss = run.pipe is None or run.pipe.last  # a pipeline's: on its last stage
        self.epoch_step, self.epoch_clock = state.step, 0.0

    def trained_units(self) -> float:
        if self.lm:
            return float(self.measure.meter.tokens.item()) * self.copies
        return self.run.state.step * self.run.unique_per_step

    def epoch_start(self) -> None:
        clock = self.measure.clock
        self.epoch_step, self.epoch_clock = self.run.state.step, clock.elapsed()
        if self.steplog.enabled:
            self.steplog.start(self.run.state.step, 0.0, clock.elapsed(), self.trained_units())

    def after_step(self, loss_sum: torch.Tensor) -> None:
        step, clock = self.run.state.step, self.measure.clock
        if self.bar and step % self.every == 0:
            done = step - self.epoch_step
            rate = self.run.unique_per_step * done / max(clock.elapsed() - self.epoch_clock, 1e-9)
            self.progress.update(step, rate, loss_sum.item() / done if self.has_loss else None)
        else:
            self.progress.update(step)
        if self.steplog.enabled and step % self.every == 0:
            self.point(loss_sum)

    def point(self, loss_sum: torch.Tensor) -> None:
        run, tc = self.run, self.run.cfg.train
        step = run.state.step
        self.steplog.point(
            step,
            loss_sum=loss_sum.item() if self.has_loss else None,
            seconds=self.measure.clock.elapsed(),
            units=self.trained_units(),
            unit="tokens" if self.lm else "samples",
            lr=lr_at(step - 1, run.total_steps, tc),
            grad_norm=float(run.grad_norm) if run.grad_norm is not None else None,
            memory_bytes=memory_in_use(run.env.device),
            loss_scale=run.scaler.get_scale() if run.scaler is not None else None,
        )

    def epoch_end(self, record: dict) -> None:
        if self.run.env.is_main:
            self.progress.print(results.epoch_line(record))

    def close(self) -> dict[str, str]:
        """-> the artifacts the step log left (steps.jsonl, curves.png, tensorboard/)."""
        self.progress.close()
        curves = self.steplog.close()
        artifacts = {}
        if self.steplog.enabled:
            artifacts["steps"] = str(self.steplog.path)
            if curves is not None:
                artifacts["curves"] = str(curves)
            if self.steplog.writer is not None:
                artifacts["tensorboard"] = str(self.run.out_dir / "tensorboard")
        return artifacts


def log_every(total_steps: int) -> int:
    """log.every_steps left at null: about 20 points a run, every 10 steps at most."""
    return max(1, min(10, total_steps // 20))
