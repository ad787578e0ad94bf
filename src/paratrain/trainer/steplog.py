"""Step-level metrics on rank 0, every log.every_steps: one JSON line per log point in
<output_dir>/steps.jsonl, and the same scalars as TensorBoard events in <output_dir>/tensorboard/
(torch.utils.tensorboard, when the tensorboard package is installed; `tensorboard --logdir
<output_dir>`). What each point holds: the mean loss of the steps since the last point (rank 0's
micro-batches; a pipeline's loss lives on its last stage and is absent here), the learning
rate, the gradient norm (where rank 0 holds whole gradients: one process, DDP; absent under
sharding), throughput over the interval, memory, and the loss scale under fp16; with log.wandb, to Weights & Biases as well."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch


class StepLog:
    def __init__(
        self,
        out_dir: Path,
        enabled: bool,
        tensorboard: bool,
        start_step: int,
        wandb: dict | None = None,
    ):
        """start_step: the step the run starts from (a resumed run's checkpoint's, else 0);
        wandb: wandb.init's arguments (project, name, config) to log there too. Nothing is
        written before open() (the run's first step has run) or the first point."""
        self.enabled = enabled
        self.out_dir, self.tensorboard, self.start_step = out_dir, tensorboard, start_step
        self.wandb_args = wandb
        self.path = out_dir / "steps.jsonl"
        self.writer = None
        self.wandb = None
        self.opened = False
        self.last: tuple[int, float, float, float] | None = None  # step, loss sum, time, units

    def open(self) -> None:
        """Into the run folder: steps.jsonl begun (a resumed run goes on with its own, from its
        checkpoint's step), the TensorBoard writer (its events file) and the wandb run
        started."""
        if not self.enabled or self.opened:
            return
        self.opened = True
        self.out_dir.mkdir(parents=True, exist_ok=True)
        if self.start_step:
            keep_points_to(self.path, self.start_step)
        else:
            self.path.unlink(missing_ok=True)
        if self.tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # the tensorboard package is optional
                self.writer = None
            else:
                # TensorBoard hides the events of the steps a resumed run takes again
                purge = self.start_step + 1 if self.start_step else None
                self.writer = SummaryWriter(
                    log_dir=str(self.out_dir / "tensorboard"), purge_step=purge
                )
        if self.wandb_args is not None:  # checked installed before any process started (runner)
            import wandb as wb

            self.wandb = wb.init(dir=str(self.out_dir), resume="allow", **self.wandb_args)

    def start(self, step: int, loss_sum: float, seconds: float, units: float) -> None:
        """An epoch begins (its sums start from zero) or the run does."""
        self.last = (step, loss_sum, seconds, units)

    def point(
        self,
        step: int,
        *,
        loss_sum: float | None,
        seconds: float,
        units: float,
        unit: str,
        lr: float,
        grad_norm: float | None,
        memory_bytes: int | None,
        loss_scale: float | None,
    ) -> dict | None:
        """loss_sum, seconds, units: running totals since start(); -> the record written."""
        if not self.enabled or self.last is None:
            return None
        self.open()
        step0, loss0, t0, units0 = self.last
        steps = max(step - step0, 1)
        rate = (units - units0) / max(seconds - t0, 1e-9)
        record = {
            "step": step,
            "loss": (loss_sum - loss0) / steps if loss_sum is not None else None,
            "lr": lr,
            "grad_norm": grad_norm,
            f"{unit}_per_s": rate,
            "memory_bytes": memory_bytes,
            "loss_scale": loss_scale,
            "time": time.time(),
        }
        self.last = (step, loss_sum if loss_sum is not None else 0.0, seconds, units)
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
        scalars = {
            f"train/{key}": value
            for key, value in record.items()
            if key not in ("step", "time") and isinstance(value, (int, float))
        }
        if self.writer is not None:
            for key, value in scalars.items():
                self.writer.add_scalar(key, value, step)
        if self.wandb is not None:
            self.wandb.log(scalars, step=step)
        return record

    def close(self) -> Path | None:
        """-> curves.png beside the log (loss and throughput over the steps), when it has
        points."""
        if self.writer is not None:
            self.writer.close()
        if self.wandb is not None:
            self.wandb.finish()
        if not self.enabled or not self.path.is_file():
            return None
        points = [json.loads(x) for x in self.path.read_text().splitlines() if x.strip()]
        return plot_curves(points, self.path.with_name("curves.png")) if points else None


def keep_points_to(path: Path, step: int) -> None:
    """A resumed run's log keeps its points up to the step it resumed from. The points after it
    (a run killed past its last checkpoint, a run resumed from an earlier one) are of steps the
    resumed run takes again: kept, the log would hold those steps twice, and from two runs."""
    if not path.is_file():
        return
    lines = path.read_text().splitlines()
    kept = [line for line in lines if (at := _step(line)) is not None and at <= step]
    if len(kept) < len(lines):
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text("".join(f"{line}\n" for line in kept))
        os.replace(tmp, path)


def _step(line: str) -> int | None:
    """A point's step, or None for a line that is none (one cut short by a killed run)."""
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return None


def plot_curves(points: list[dict], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rate = next(k for k in points[0] if k.endswith("_per_s"))
    steps = [p["step"] for p in points]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.5))
    losses = [(p["step"], p["loss"]) for p in points if p.get("loss") is not None]
    if losses:
        a.plot(*zip(*losses, strict=True), marker=".")
    a.set(xlabel="step", ylabel="training loss", title="loss")
    b.plot(steps, [p[rate] for p in points], marker=".")
    b.set(xlabel="step", ylabel=rate.replace("_", " "), title="throughput")
    for ax in (a, b):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def memory_in_use(device: torch.device) -> int | None:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return None
