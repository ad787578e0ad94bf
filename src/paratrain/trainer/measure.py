"""What the loop measures and how it keeps the measurement honest: the training clock (evaluation
and checkpointing paused out of it), the warm-up mark (throughput counts from there), token
counts, the learning-rate schedule, garbage-collection timing and the attention kernel order."""

from __future__ import annotations

import contextlib
import gc
import math
import random
import time

import numpy as np
import torch

from paratrain.meters import metrics


class TrainClock:
    """Seconds spent training, with evaluation and checkpointing paused out of it; and, where
    `energy` reads a counter of joules (the GPUs' NVML counter), the joules of those seconds;
    the GPU telemetry (`sampler`) reads only while it runs."""

    def __init__(self, device: torch.device, energy=None, sampler=None):
        self.device, self.total, self.started = device, 0.0, None
        self.energy, self.joules_total, self.joules_started = energy, 0.0, 0.0
        self.sampler = sampler  # the GPU telemetry pauses with the clock

    def resume(self) -> None:
        if self.started is None:
            self.started = metrics.now(self.device)
            if self.energy is not None:
                self.joules_started = self.energy()
            if self.sampler is not None:
                self.sampler.resume()

    def pause(self) -> None:
        if self.started is not None:
            self.total += metrics.now(self.device) - self.started
            if self.energy is not None:
                self.joules_total += self.energy() - self.joules_started
            if self.sampler is not None:
                self.sampler.pause()
            self.started = None

    def joules(self) -> float | None:
        """Joules used while the clock ran (a stall's energy stays in: the GPU drew it), or None
        without a counter. Read after a sync (pause, or elapsed() just before)."""
        if self.energy is None:
            return None
        running = self.energy() - self.joules_started if self.started is not None else 0.0
        return self.joules_total + running

    def exclude(self, seconds: float) -> None:
        """Take a stall's excess out of the training time (reported apart, not as slowness)."""
        self.total -= seconds

    def elapsed(self) -> float:
        """Seconds trained so far, the device's queued work included (waits for it)."""
        metrics.sync(self.device)
        return self.queued()

    def queued(self) -> float:
        """elapsed() by the host's clock alone, without waiting for the device: when the work
        queued so far was issued (the device lags it by the queue, a step or two). For the step
        log's points: elapsed()'s sync there left the GPU idle while the host launched the next
        step (MobileNetV2 at 500 px on one H200: a sync every 3 steps of 26 ms)."""
        running = time.perf_counter() - self.started if self.started is not None else 0.0
        return self.total + running


class Meter:
    """The measured window: steps and tokens after warm-up (and after profiled steps)."""

    def __init__(self, device: torch.device, start_step: int, warmup: int, profiled: int):
        self.start_step, self.first_measured = start_step, warmup + profiled
        self.warm_step: int | None = None
        self.warm_clock = 0.0
        self.warm_joules: float | None = 0.0
        # language models: non-padding tokens, counted on the device (no sync per step)
        self.tokens = torch.zeros((), device=device, dtype=torch.int64)
        self.tokens_at_warm = self.tokens

    def at_warm_mark(self, step: int) -> bool:
        return self.warm_step is None and step - self.start_step == self.first_measured

    def mark(self, step: int, clock: TrainClock) -> None:
        self.warm_step, self.warm_clock = step, clock.elapsed()
        self.warm_joules = clock.joules()
        self.tokens_at_warm = self.tokens.clone()

    def window(self, step: int, clock: TrainClock) -> tuple[int, float, bool, int]:
        """-> (measured steps, seconds, warm-up excluded, tokens counted before the window)."""
        if self.warm_step is not None and step > self.warm_step:
            first = int(self.tokens_at_warm.item())
            return step - self.warm_step, clock.elapsed() - self.warm_clock, True, first
        return step - self.start_step, clock.elapsed(), False, 0

    def joules(self, step: int, clock: TrainClock) -> float | None:
        """The energy of the same window as window(): this rank's GPUs, None without a counter."""
        total = clock.joules()
        if total is None:
            return None
        if self.warm_step is not None and step > self.warm_step:
            return total - (self.warm_joules or 0.0)
        return total


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def lr_at(step: int, total_steps: int, tc) -> float:
    """A pure function of the step, so a resumed run needs no scheduler state."""
    if tc.lr_schedule == "constant":
        return tc.lr
    return 0.5 * tc.lr * (1 + math.cos(math.pi * step / max(total_steps, 1)))


def set_lr(optimizer, lr: float) -> None:
    """optimizer: one, or a list (a task of several models, each with its own)."""
    optimizers = optimizer if isinstance(optimizer, list) else [optimizer]
    for group in (g for o in optimizers for g in o.param_groups):
        if isinstance(group["lr"], torch.Tensor):  # torchao's optimizers keep it a tensor
            group["lr"].fill_(lr)
        else:
            group["lr"] = lr


@contextlib.contextmanager
def gc_schedule(every: int):
    """train.gc_every_steps: the loop turns Python's automatic garbage collection off (gc_pause)
    and collects at fixed steps instead (gc_tick); it is back as it was after the run, also
    after an error."""
    was_enabled = gc.isenabled()
    try:
        yield
    finally:
        if every > 0 and was_enabled:
            gc.enable()


def gc_pause(every: int) -> None:
    if every > 0:
        gc.collect()  # what setup (model, compile, loaders) left behind, before the first step
        gc.disable()


def gc_tick(every: int, step: int) -> None:
    if every > 0 and step % every == 0:
        gc.collect(1)  # the young generations: what a few steps allocate


def sdpa_priority(name: str) -> contextlib.AbstractContextManager:
    """scaled_dot_product_attention tries kernel `name` first and the others after it, so a shape
    the chosen kernel cannot take still runs (on another kernel) instead of failing."""
    if name == "auto":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    kernels = {
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "flash": SDPBackend.FLASH_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "math": SDPBackend.MATH,
    }
    first = kernels[name]
    return sdpa_kernel([first] + [k for k in kernels.values() if k != first], set_priority=True)


class Measure:
    """What the trainer measures, in one component: the training clock (evaluation and
    checkpoints paused out of it), the warm-up mark from which throughput counts, the
    profiled steps right after warm-up, the GPU telemetry over the measured steps, tokens
    counted on the device, and steps far slower than usual (out of throughput)."""

    def __init__(
        self,
        env,
        tc,
        *,
        start_step: int,
        out_dir,
        watchdog_s: float,
        devices: list[torch.device],
    ):
        """tc: train.*; devices: those this rank drives (run_devices), whose energy counts."""
        from paratrain.meters.profiling import StepProfiler
        from paratrain.meters.telemetry import GpuSampler, energy_counter
        from paratrain.trainer.watchdog import StallMeter

        device = env.device
        self.start_step = start_step
        self.warmup = tc.warmup_steps
        self.gpu = GpuSampler(device)  # clocks, power, temperature over the measured steps
        self.clock = TrainClock(device, energy_counter(devices), self.gpu)
        self.meter = Meter(device, start_step, tc.warmup_steps, tc.profile_steps)
        self.profiler = StepProfiler(device, tc.profile_steps, out_dir, env.is_main)
        self.stalls = StallMeter(watchdog_s)
        metrics.reset_peak_memory(device)

    def before_step(self, step: int) -> None:
        if step - self.start_step == self.warmup:
            self.profiler.start()  # when asked for: the steps right after warm-up
        if self.meter.at_warm_mark(step):
            self.profiler.stop()
            self.meter.mark(step, self.clock)  # throughput counts from here
            self.gpu.start()

    def count(self, tokens) -> None:
        if tokens is not None:
            self.meter.tokens += tokens

    def after_step(self, step: int, seconds: float) -> None:
        """The step's real time (the loss check's sync makes it so, also on a GPU), without
        the checkpoint it waited for: a stall's excess leaves the clock."""
        self.clock.exclude(self.stalls.step(step, seconds))

    def finish(self) -> list:
        """-> every rank's GPU telemetry (a collective)."""
        from paratrain.distributed import process_group as pg

        self.profiler.stop()  # a run too short to reach its measured steps
        return pg.all_gather_object(self.gpu.stop())


def run_devices(split: dict | None, device: torch.device) -> list[torch.device]:
    """The devices this rank drives: every GPU a layer split spans, else its own."""
    if split and device.type == "cuda":
        return [torch.device(d) for d in split["devices"]]
    return [device]
