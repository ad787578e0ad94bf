"""The training loop. Read `train` top to bottom: set-up, the step (forward, loss, backward,
optimizer step, with DDP's all-reduce happening inside backward), evaluation, result.

Every rank runs this function; rank 0 alone prints, shows the bar and writes files.
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
import random
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel

from paratrain import dist as pdist
from paratrain import metrics
from paratrain.checkpoint import LoopState, load_checkpoint, resolve_resume, save_checkpoint
from paratrain.errors import UserError
from paratrain.lm.model import peak_flops as lm_peak_flops
from paratrain.parallel import STRATEGIES
from paratrain.parallel.activation_checkpointing import apply_activation_checkpointing
from paratrain.parallel.data_parallel import average_buffers, gradient_sync, unwrap
from paratrain.parallel.pipeline import build_pipeline
from paratrain.precision import build_policy, build_scaler
from paratrain.profiling import StepProfiler
from paratrain.tasks import image as image_task
from paratrain.tasks import lm as lm_task
from paratrain.tasks import task_of
from paratrain.telemetry import GpuSampler
from paratrain.train_config import build_optimizer

if TYPE_CHECKING:
    from paratrain.config import RunConfig
    from paratrain.train_config import TrainConfig


def default_output_dir(name: str) -> str:
    return str(Path("runs") / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}")


def train(cfg: RunConfig) -> dict[str, Any]:
    spec = STRATEGIES[cfg.strategy]
    if cfg.train.deterministic:
        # cuBLAS needs this before its first handle is made to be deterministic.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    env = pdist.init_distributed(cfg.device, spec.multiprocess)
    try:
        with sdpa_priority(cfg.train.sdpa_backend), gc_schedule(cfg.train.gc_every_steps):
            return _train(cfg, spec, env)
    finally:
        pdist.shutdown()


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


def _train(cfg: RunConfig, spec, env: pdist.DistEnv) -> dict[str, Any]:
    device, tc = env.device, cfg.train
    out_dir = Path(pdist.broadcast_object(cfg.output_dir or default_output_dir(cfg.name)))
    ckpt_dir = Path(cfg.checkpoint.dir) if cfg.checkpoint.dir else out_dir / "checkpoints"
    if env.is_main:
        from paratrain.config import to_yaml

        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "config.yaml").write_text(to_yaml(cfg))

    # ---- determinism and kernels
    seed_all(cfg.seed)  # same seed everywhere: identical initial weights on every rank
    # warn_only: a few ops have no deterministic CUDA kernel, among them adaptive average
    # pooling's backward, which every torchvision classifier has; they run with torch's warning
    # instead of stopping the run (the rest of the step stays deterministic).
    torch.use_deterministic_algorithms(tc.deterministic, warn_only=True)
    torch.backends.cudnn.benchmark = tc.cudnn_benchmark and not tc.deterministic

    # ---- the workload: model and data (dp scatters one loader batch over all GPUs)
    dp_gpus = torch.cuda.device_count() if (cfg.strategy == "dp" and device.type == "cuda") else 1
    loader_batch = cfg.data.batch_size * dp_gpus
    policy = build_policy(cfg.precision, device)
    task = task_of(cfg.data.source)
    build = image_task.build if task == "image" else lm_task.build
    work = build(cfg, env, spec.sampler, policy, loader_batch)

    # ---- applied from outside the model, in a fixed order: (dtype, LoRA: in the workload)
    #      activation checkpointing -> torch.compile -> DP / DDP / FSDP last (it must see the final module)
    model = work.model
    if tc.activation_checkpointing:
        apply_activation_checkpointing(model)
    inner = model
    if tc.compile and work.blocks:
        # Regional compilation (as torchtitan does): each decoder layer compiled in place; the
        # layers share one graph, so compile time does not grow with depth, and peft's wrappers
        # and the loss run eagerly around them. FSDP then shards the compiled layers.
        for block in work.blocks:
            block.compile(**tc.compile_kwargs())
    elif tc.compile:
        inner = torch.compile(model, **tc.compile_kwargs())
    model = spec.apply(inner, device, policy, cfg)
    eval_model = inner if spec.multiprocess else model  # DDP's forward is a collective: skip it
    # strategy=pipeline: this rank keeps its stage of the model; a schedule runs the micro-batches
    pipe = build_pipeline(model, device, cfg) if spec.pipelined else None
    seed_all(cfg.seed + env.rank)  # from here, dropout and friends differ per rank

    params = [p for p in unwrap(model).parameters() if p.requires_grad]  # LoRA: the adapters only
    optimizer = build_optimizer(params, tc)
    scaler = build_scaler(cfg.precision, cfg.scaler, device)
    k = tc.grad_accum_steps
    steps_per_epoch = len(work.train) // k
    if steps_per_epoch == 0:
        raise UserError(
            f"train.grad_accum_steps: {k} micro-batches exceed the {len(work.train)} of an epoch"
        )
    # max_steps, when set, decides the length alone (as many epochs as it takes).
    total_steps = tc.max_steps if tc.max_steps is not None else tc.epochs * steps_per_epoch

    state = LoopState()
    if cfg.checkpoint.resume:
        path = resolve_resume(cfg.checkpoint.resume)
        state = load_checkpoint(
            path,
            model=unwrap(model),
            optimizer=optimizer,
            scaler=scaler,
            device=device,
            pipelined=spec.pipelined,
        )
        log(env, f"resumed from {path} at step {state.step} (epoch {state.epoch})")

    # Samples per optimizer step: processed by all ranks, and unique (ddp-full repeats them). A
    # pipeline's ranks are one model: they process each batch together, once.
    replicas = 1 if spec.pipelined else env.world_size
    processed_per_step = loader_batch * k * replicas
    unique_per_step = loader_batch * k * (1 if spec.redundant else replicas)
    val = work.val if tc.eval else None
    label = f"{cfg.strategy} x{env.world_size} {cfg.precision}" + (
        " [redundant data]" if spec.redundant else ""
    )
    progress = metrics.Progress(env.is_main and cfg.log.progress, total_steps, label)
    progress.update(state.step)
    metrics.reset_peak_memory(device)
    clock = TrainClock(device)
    gpu = GpuSampler(device)  # clocks, power, temperature over the measured steps
    profiler = StepProfiler(device, tc.profile_steps, out_dir, env.is_main)
    start_step, warm_mark = state.step, None
    tokens = torch.zeros(
        (), device=device, dtype=torch.int64
    )  # language models: non-padding tokens
    tokens_at_warm = tokens.clone()
    epochs: list[dict[str, Any]] = []
    run_start = time.perf_counter()

    # ddp.broadcast_buffers=false: each rank's BatchNorm statistics drift apart during training;
    # they are averaged over the ranks whenever the model is evaluated or saved.
    own_buffers = isinstance(model, DistributedDataParallel) and not cfg.ddp.broadcast_buffers

    def sync_buffers() -> None:
        if own_buffers:
            average_buffers(model)

    def save() -> None:  # every N steps and at the end: the same state, the same files
        save_checkpoint(
            ckpt_dir,
            model=unwrap(model),
            optimizer=optimizer,
            scaler=scaler,
            state=state,
            device=device,
            keep=cfg.checkpoint.keep,
            pipelined=spec.pipelined,
        )

    # ================================================================ the loop
    gc_pause(tc.gc_every_steps)
    while state.step < total_steps:
        work.sampler.set_epoch(state.epoch, skip=state.step_in_epoch * k * loader_batch)
        model.train()
        epoch_first_step, epoch_clock, epoch_wall = state.step, clock.elapsed(), time.perf_counter()
        loss_sum = torch.zeros((), device=device, dtype=torch.float64)
        batches = iter(work.train)
        clock.resume()
        while state.step_in_epoch < steps_per_epoch and state.step < total_steps:
            since_start = state.step - start_step
            if since_start == tc.warmup_steps:
                profiler.start()  # when asked for: the steps right after warm-up
            if warm_mark is None and since_start == tc.warmup_steps + tc.profile_steps:
                profiler.stop()
                warm_mark = (state.step, clock.elapsed())  # throughput counts from here
                tokens_at_warm = tokens.clone()
                gpu.start()
            set_lr(optimizer, lr_at(state.step, total_steps, tc))
            if pipe is not None:  # forward and backward of every micro-batch, stage by stage
                with policy.autocast():
                    loss = pipe.train_step(next(batches))
                if loss is not None:  # the last stage's
                    loss_sum += loss
            else:
                for micro in range(k):
                    batch = next(batches)
                    # Gradient accumulation: only the last micro-batch all-reduces (DDP's no_sync)
                    # or reduce-scatters (FSDP).
                    with gradient_sync(model, enabled=micro == k - 1):
                        with policy.autocast():
                            loss, n_tokens = work.loss(model, batch)
                            if k > 1:  # the mean over micro-batches; k = 1 needs no kernel for it
                                loss = loss / k
                        # backward: DDP all-reduces gradient buckets here, overlapped with compute
                        (scaler.scale(loss) if scaler else loss).backward()
                    loss_sum += loss.detach()
                    if n_tokens is not None:
                        tokens += n_tokens
            if scaler is not None:
                scaler.step(optimizer)  # skipped when the gradients hold inf/NaN
                scaler.update()  # ... and then the scale backs off
            else:
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            state.step += 1
            state.step_in_epoch += 1
            gc_tick(tc.gc_every_steps, state.step)

            if env.is_main and cfg.log.progress and state.step % cfg.log.every_steps == 0:
                done = state.step - epoch_first_step
                rate = unique_per_step * done / max(clock.elapsed() - epoch_clock, 1e-9)
                # a pipeline's loss lives on its last stage, not on rank 0 which draws the bar
                shown = loss_sum.item() / done if pipe is None or pipe.last else None
                progress.update(state.step, rate, shown)
            else:
                progress.update(state.step)
            if (
                cfg.checkpoint.every_steps
                and state.step % cfg.checkpoint.every_steps == 0
                and state.step < total_steps
            ):
                clock.pause()
                sync_buffers()
                save()
                clock.resume()
        clock.pause()

        epoch_steps = state.step - epoch_first_step
        train_s = clock.elapsed() - epoch_clock
        (loss_total,) = pdist.all_reduce_sum([loss_sum.item()], device)
        record = {
            "epoch": state.epoch,
            "steps": epoch_steps,
            "train_s": train_s,
            "train_loss": loss_total / replicas / max(epoch_steps, 1),
            "unique_samples_per_s": unique_per_step * epoch_steps / max(train_s, 1e-9),
        }
        if state.step_in_epoch >= steps_per_epoch:
            state.epoch += 1
            state.step_in_epoch = 0
        if val is not None:
            sync_buffers()
            if pipe is not None:
                record.update(pipe.evaluate(eval_model, val, policy.autocast, loader_batch))
            else:
                record.update(work.evaluate(eval_model, val))
        record["wall_s"] = time.perf_counter() - epoch_wall  # training + evaluation
        epochs.append(record)
        if env.is_main:
            held = "".join(
                f", {k_.replace('_', ' ')} {v:.4f}"
                for k_, v in record.items()
                if k_.startswith("val_")
            )
            progress.print(
                f"epoch {record['epoch']}: loss {record['train_loss']:.4f}{held}, "
                f"{record['unique_samples_per_s']:,.0f} unique samples/s"
            )
    # ================================================================ end of loop

    progress.close()
    profiler.stop()  # a run too short to reach its measured steps
    telemetry = pdist.all_gather_object(gpu.stop())
    sync_buffers()  # the final state, for the checkpoint and the run's artifacts
    if cfg.checkpoint.at_end and state.step > start_step:
        save()
    artifacts = work.finish(model, out_dir) if work.finish is not None else {}
    peak, peak_kind = metrics.peak_memory_bytes(device)
    peak = int(pdist.all_reduce_max(float(peak), device))

    measured_steps, measured_s, first_tokens = state.step - start_step, clock.elapsed(), 0
    warmup_excluded = warm_mark is not None and state.step > warm_mark[0]
    if warmup_excluded:
        measured_steps, measured_s = state.step - warm_mark[0], clock.elapsed() - warm_mark[1]
        first_tokens = tokens_at_warm.item()
    measured_s = max(measured_s, 1e-9)
    summary = {
        "wall_s": time.perf_counter() - run_start,
        "train_s": clock.elapsed(),
        "optimizer_steps": state.step,
        "steps_this_run": state.step - start_step,
        "measured_steps": measured_steps,
        "warmup_excluded": warmup_excluded,
        "step_time_s": measured_s / max(measured_steps, 1),
        "unique_samples_per_s": unique_per_step * measured_steps / measured_s,
        "processed_samples_per_s": processed_per_step * measured_steps / measured_s,
        "train_loss": epochs[-1]["train_loss"] if epochs else None,
        **{k_: v for k_, v in (epochs[-1] if epochs else {}).items() if k_.startswith("val_")},
        "peak_memory_bytes": peak,
        "peak_memory_kind": peak_kind,
        "loss_scale": scaler.get_scale() if scaler is not None else None,
        "gpu_telemetry": telemetry if any(telemetry) else None,  # per rank
        "profile": profiler.summary,  # rank 0's top operators per step, when profiled
    }
    summary.setdefault("val_accuracy", None)
    if task == "lm":
        (all_tokens,) = pdist.all_reduce_sum([float(tokens.item() - first_tokens)], device)
        unique_tokens = all_tokens / (env.world_size if spec.redundant else 1)
        summary["tokens_per_s"] = unique_tokens / measured_s
        summary["tokens_per_step"] = unique_tokens / max(measured_steps, 1)
        peak_flops = lm_peak_flops(device)
        # MFU = achieved model FLOP/s per device / the device's dense peak (formula: lm/model.py)
        summary["mfu"] = (
            work.flops_per_token * summary["tokens_per_s"] / env.world_size / peak_flops
            if peak_flops
            else None
        )
        summary["flops_per_token"] = work.flops_per_token
    result = {
        "paratrain": {"version": _version(), "commit": metrics.git_commit()},
        "name": cfg.name,
        "task": task,
        "strategy": cfg.strategy,
        "strategy_doc": spec.doc,
        "redundant_data": spec.redundant,
        "precision": cfg.precision,
        "world_size": env.world_size,
        "dp_gpus": dp_gpus,
        "backend": env.backend,
        "data_real": work.info.get("data_real", True),
        "effective": {"pin_memory": work.info.get("pin_memory"), "loader_batch": loader_batch},
        "workload": work.info,
        "artifacts": artifacts,
        "hardware": metrics.hardware(device, env.world_size),
        "epochs": epochs,
        "summary": summary,
        "output_dir": str(out_dir),
        "config": cfg.to_dict(),
    }
    if env.is_main:
        metrics.write_json(out_dir / "result.json", result)
        print_summary(result)
    pdist.barrier()
    return result


# ---------------------------------------------------------------- helpers the loop reads


class TrainClock:
    """Seconds spent training, with evaluation and checkpointing paused out of it."""

    def __init__(self, device: torch.device):
        self.device, self.total, self.started = device, 0.0, None

    def resume(self) -> None:
        if self.started is None:
            self.started = metrics.now(self.device)

    def pause(self) -> None:
        if self.started is not None:
            self.total += metrics.now(self.device) - self.started
            self.started = None

    def elapsed(self) -> float:
        running = metrics.now(self.device) - self.started if self.started is not None else 0.0
        return self.total + running


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def lr_at(step: int, total_steps: int, tc: TrainConfig) -> float:
    """A pure function of the step, so a resumed run needs no scheduler state."""
    if tc.lr_schedule == "constant":
        return tc.lr
    return 0.5 * tc.lr * (1 + math.cos(math.pi * step / max(total_steps, 1)))


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def log(env: pdist.DistEnv, message: str) -> None:
    if env.is_main:
        print(f"paratrain: {message}", flush=True)


def print_summary(result: dict[str, Any]) -> None:
    s = result["summary"]
    redundant = " (redundant data: every rank saw every sample)" if result["redundant_data"] else ""
    if result["task"] == "lm":
        mfu = f", MFU {s['mfu']:.1%}" if s.get("mfu") else ""
        rate = f"{s['tokens_per_s']:,.0f} tokens/s ({s['tokens_per_step']:,.0f} per step), {s['step_time_s']:.3f} s/it{mfu}"
        held = (
            f"held-out loss {s['val_loss']:.4f}"
            if s.get("val_loss") is not None
            else "no held-out set"
        )
    else:
        rate = f"{s['unique_samples_per_s']:,.1f} unique samples/s"
        held = (
            f"held-out accuracy {s['val_accuracy']:.4f}"
            if s["val_accuracy"] is not None
            else "held-out accuracy n/a"
        )
    print(
        f"paratrain: {result['strategy']} x{result['world_size']} {result['precision']}{redundant}: "
        f"{s['optimizer_steps']} steps, {s['train_s']:.1f} s training, {rate}, {held}, "
        f"peak memory {s['peak_memory_bytes'] / 2**20:,.0f} MiB ({s['peak_memory_kind']})\n"
        f"paratrain: results in {result['output_dir']}/result.json",
        flush=True,
    )


def _version() -> str:
    from paratrain import __version__

    return __version__
