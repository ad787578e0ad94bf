"""A run's result: the summary over the measured window, result.json's layout, the printed lines.

Throughput counts unique samples (ddp-full's ranks repeat them) and each data-parallel
replica's tokens once (a tensor-parallel group's ranks and a pipeline's stages all see the same
batch). MFU = model FLOPs per token x tokens/s / GPUs / the GPU's dense peak.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from paratrain.config import for_task
from paratrain.data.loader import loader_workers
from paratrain.distributed import process_group as pg
from paratrain.meters import metrics
from paratrain.meters.telemetry import energy_summary
from paratrain.protocols import unwrap
from paratrain.tasks import counts_tokens, get_task


def epoch_line(record: dict[str, Any]) -> str:
    held = "".join(
        f", {k.replace('_', ' ')} {v:.4f}" for k, v in record.items() if k.startswith("val_")
    )
    return (
        f"epoch {record['epoch']}: loss {record['train_loss']:.4f}{held}, "
        f"{record['unique_samples_per_s']:,.0f} unique samples/s"
    )


def step_windows(
    times: list[float] | None, measured: int, excluded: bool = True, k: int = 5
) -> list[float]:
    """The last `measured` step times cut into up to k consecutive windows of (near) equal
    length -> each window's mean step, in seconds (none without a measured window: warm-up
    not `excluded`)."""
    times = times or []
    steps = times[len(times) - measured :] if measured > 0 and excluded else []
    k = min(k, len(steps))
    cuts = [round(i * len(steps) / k) for i in range(k + 1)] if k else []
    return [sum(steps[a:b]) / (b - a) for a, b in zip(cuts, cuts[1:], strict=False)]


@dataclass(frozen=True)
class RunFacts:
    """What a result says of the run beyond its measured window: the plan's summary and the
    counts taken once from the trained objects at the end (facts_of). `build` reads nothing
    else of the run."""

    cfg: Any
    """The run's config as planned (RunPlan.config)."""
    task: str
    label: str
    strategy_doc: str
    task_fp8: bool
    unread: tuple
    sources: dict
    """The plan's model and data sources (RunPlan.to_dict()'s)."""
    device: torch.device
    world_size: int
    backend: str
    parallel: dict
    """dims.describe() with the mesh's label, the data-parallel wrapper and a split's devices."""
    copies: int
    """How many ranks counted each token: a tp group's, a pipeline's stages, ddp-full's replicas."""
    redundant: bool
    split: dict | None
    out_dir: Path
    workload_info: dict
    flops_per_token: float | None
    flops_formula: str | None
    trainable_parameters: int
    model_state: dict
    loss_scale: float | None
    communication: dict | None


def facts_of(built, k: int, steps: int) -> RunFacts:
    """The run's facts for its result, read once (built: trainer.built.Built; k: micro-batches
    a step; steps: the optimizer steps this run took)."""
    plan, dims, work, env = built.plan, built.dims, built.work, built.env
    sources = plan.to_dict()
    return RunFacts(
        cfg=built.cfg,
        task=plan.task,
        label=plan.label,
        strategy_doc=plan.strategy_doc,
        task_fp8=plan.task_spec.fp8,
        unread=tuple(plan.task_spec.unread),
        sources={"model": sources["model"], "data": sources["data"]},
        device=env.device,
        world_size=env.world_size,
        backend=env.backend,
        parallel={
            **dims.describe(),
            "label": dims.label(),
            "data_parallel": built.wrapper,
            "split": built.split,
        },
        copies=dims.tp * dims.pp * (dims.dp_size if built.redundant else 1),
        redundant=built.redundant,
        split=built.split,
        out_dir=built.out_dir,
        workload_info=work.info,
        flops_per_token=work.flops_per_token,
        flops_formula=getattr(work.spec, "flops_formula", None),
        trainable_parameters=sum(p.numel() for p in built.params),
        model_state=model_state(built, k),
        loss_scale=built.scaler.get_scale() if built.scaler is not None else None,
        communication=communication(built, steps),
    )


def build(
    facts: RunFacts,
    schedule,
    state,
    *,
    epochs: list[dict[str, Any]],
    start_step: int,
    window: tuple[int, float, bool, int],
    tokens,
    joules: float | None = None,
    train_s: float,
    wall_s: float,
    telemetry: list,
    profile,
    artifacts: dict,
    phases: dict | None = None,
    stalls: dict | None = None,
    checkpoints: dict | None = None,
    step_times: list[float] | None = None,
) -> dict[str, Any]:
    """facts: the run's (facts_of); schedule: its Schedule; state: the loop's, at the end."""
    cfg, device, world_size = facts.cfg, facts.device, facts.world_size
    # GPUs the run used: one per process, or all that a split spans
    gpus = len(facts.split["devices"]) if facts.split and device.type == "cuda" else world_size
    peak, peak_kind = metrics.peak_memory_bytes(device, facts.split)
    peak = int(pg.all_reduce_max(float(peak), device))
    reserved = metrics.peak_reserved_bytes(device, facts.split)
    reserved = None if reserved is None else int(pg.all_reduce_max(float(reserved), device))
    measured_steps, measured_s, warmup_excluded, first_tokens = window
    measured_s = max(measured_s, 1e-9)
    last = epochs[-1] if epochs else {}
    summary = {
        "wall_s": wall_s,
        "train_s": train_s,
        "optimizer_steps": state.step,
        "steps_this_run": state.step - start_step,
        "skipped_steps": list(state.bad_steps),  # non-finite loss or gradient: not applied
        # steps far slower than usual (their excess is out of train_s and throughput) and the
        # ranks the watchdog found behind
        "stall_s": sum(x["excess_s"] for x in (stalls or {}).get("slow_steps", [])),
        "stalls": stalls,
        # checkpoints this run wrote and the time training waited for them (out of train_s)
        "checkpoint": {"async_mode": cfg.checkpoint.async_mode, **(checkpoints or {})},
        "measured_steps": measured_steps,
        "warmup_excluded": warmup_excluded,
        "step_time_s": measured_s / max(measured_steps, 1),
        # how steady the measured steps were: their mean step in consecutive windows (`paratrain
        # plan` repeats a calibration whose windows spread)
        "step_windows_s": step_windows(step_times, measured_steps, warmup_excluded),
        "unique_samples_per_s": schedule.unique_per_step * measured_steps / measured_s,
        "processed_samples_per_s": schedule.processed_per_step * measured_steps / measured_s,
        # the last epoch's, over all its steps (a resumed run's too: trainer/losses.py), and
        # which steps those are: first and last
        "train_loss": last.get("train_loss"),
        "train_loss_steps": last.get("train_loss_steps"),
        **{k: v for k, v in last.items() if k.startswith("val_")},
        "peak_memory_bytes": peak,
        "peak_memory_kind": peak_kind,
        "peak_reserved_bytes": reserved,  # the allocator's peak hold (GPU), None on the CPU
        # the optimizer's parameters (whole sizes under FSDP / TP; a pipeline stage: its own)
        "trainable_parameters": facts.trainable_parameters,
        "model_state": facts.model_state,  # `paratrain plan`'s calibration reads it
        "loss_scale": facts.loss_scale,
        "gpu_telemetry": telemetry if any(telemetry) else None,  # per rank
        # what this rank handed to the gradient / parameter collectives (parallel/sync.py);
        # None where not counted (one process, FSDP, PowerSGD)
        "communication": facts.communication,
        "profile": profile,  # rank 0's top operators per step, when profiled
        "profile_phases": phases,  # rank 0's step by phase (profiling.phase_times)
    }
    summary.setdefault("val_accuracy", None)
    accuracies = [
        (e["val_accuracy"], e["epoch"]) for e in epochs if e.get("val_accuracy") is not None
    ]
    if accuracies:  # the best epoch beside the last
        summary["best_val_accuracy"], summary["best_epoch"] = max(accuracies)
    if counts_tokens(facts.task):
        (all_tokens,) = pg.all_reduce_sum([float(tokens.item() - first_tokens)], device)
        summary.update(token_rates(facts, all_tokens, measured_steps, measured_s, gpus))
    summary["energy"] = energy(
        joules,
        telemetry,
        world_size,
        gpus=gpus,
        seconds=measured_s,
        samples=schedule.unique_per_step * measured_steps,
        tokens=summary.get("tokens_per_s", 0.0) * measured_s,
        device=device,
    )
    return {
        "paratrain": {"version": _version(), "commit": metrics.git_commit()},
        "name": cfg.name,
        "task": facts.task,
        "strategy": facts.label,
        "strategy_doc": facts.strategy_doc,
        "parallel": facts.parallel,
        "redundant_data": facts.redundant,
        "precision": cfg.precision,
        # the linear layers' float8 recipe (model.fp8), when they compute in float8
        "fp8": cfg.model.fp8 if facts.task_fp8 and cfg.model.fp8 != "none" else None,
        "fp8_lm_head": facts.task_fp8 and cfg.model.fp8_lm_head,
        "world_size": world_size,
        "cpu_threads": torch.get_num_threads(),  # per process
        "dp_gpus": schedule.loader_batch // cfg.data.batch_size,
        "backend": facts.backend,
        "data_real": facts.workload_info.get("data_real", True),
        "effective": {
            "pin_memory": facts.workload_info.get("pin_memory"),
            "loader_batch": schedule.loader_batch,
            "num_workers": loader_workers(cfg.data.num_workers),
        },
        "workload": facts.workload_info,
        "artifacts": artifacts,
        "hardware": metrics.hardware(device, world_size),
        "epochs": epochs,
        "summary": summary,
        "output_dir": str(facts.out_dir),
        "config": for_task(cfg.to_dict(), facts.unread),
        "plan": facts.sources,
    }


def token_rates(facts: RunFacts, all_tokens: float, steps: int, seconds: float, gpus: int) -> dict:
    """Tokens/s and MFU over the measured window."""
    device, flops_per_token = facts.device, facts.flops_per_token
    # every rank of a tp group and every stage counted the same batch
    unique_tokens = all_tokens / facts.copies
    out = {
        "tokens_per_s": unique_tokens / seconds,
        "tokens_per_step": unique_tokens / max(steps, 1),
    }
    peak_flops = metrics.peak_flops(device)
    achieved = flops_per_token * out["tokens_per_s"] / gpus  # per device
    # MFU = achieved model FLOP/s per device / the device's dense bf16 peak; a run whose
    # linear layers compute in float8 is also quoted against the fp8 peak (twice as high)
    out["mfu"] = achieved / peak_flops if peak_flops else None
    peak_fp8 = metrics.peak_fp8_flops(device) if facts.cfg.model.fp8 != "none" else None
    out["mfu_fp8_peak"] = achieved / peak_fp8 if peak_fp8 else None
    out["mfu_basis"] = {
        "formula": facts.flops_formula,
        "model_flops_per_token": flops_per_token,
        "achieved_flops_per_device": achieved,
        "peak_flops_bf16_dense": peak_flops,
        "peak_flops_fp8_dense": peak_fp8,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
    }
    out["flops_per_token"] = flops_per_token
    return out


def precision_label(result: dict[str, Any]) -> str:
    """bf16, or bf16+fp8-rowwise when the linear layers compute in float8 (model.fp8), and
    bf16+fp8-rowwise+lm_head when lm_head does too (model.fp8_lm_head)."""
    fp8 = result.get("fp8")
    if not fp8:
        return result["precision"]
    head = "+lm_head" if result.get("fp8_lm_head") else ""
    return f"{result['precision']}+fp8-{fp8}{head}"


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def _nbytes(t: torch.Tensor) -> int:
    t = _local(t)
    return t.numel() * t.element_size()


def model_state(built, k: int) -> dict[str, Any]:
    """This rank's model state as it sits in memory after training: parameter, gradient and
    optimizer-state bytes counted from the tensors themselves, the largest block (FSDP gathers
    one at a time) and, for a causal LM, the shape tensor parallelism's collectives depend on."""
    model = unwrap(built.eval_model)
    params = list(model.parameters())
    state = [
        t
        for o in (built.optimizer if isinstance(built.optimizer, list) else [built.optimizer])
        for s in o.state.values()
        for t in s.values()
        if torch.is_tensor(t) and t.dim() > 0  # not AdamW's scalar step counters
    ]
    try:
        blocks = built.work.spec.blocks(model)
    except Exception:  # a family without blocks: FSDP then wraps the model whole
        blocks = []
    config = getattr(getattr(model, "base_model", model), "config", None)
    config = getattr(getattr(config, "model", None), "config", config)  # peft wraps once more
    return {
        "parameters": sum(_local(p).numel() for p in params),
        "parameter_bytes": sum(_nbytes(p) for p in params),
        "trainable_parameters": sum(_local(p).numel() for p in built.params),
        "gradient_bytes": sum(_nbytes(p) for p in built.params),  # a gradient per trainable weight
        "optimizer_bytes": sum(_nbytes(t) for t in state),
        "largest_block_parameters": max(
            (sum(_local(p).numel() for p in b.parameters()) for b in blocks), default=0
        ),
        "blocks": len(blocks),
        "hidden_size": getattr(config, "hidden_size", None),
        "layers": getattr(config, "num_hidden_layers", None),
        "attention_heads": getattr(config, "num_attention_heads", None),
        "kv_heads": getattr(config, "num_key_value_heads", None),
        "micro_batch": built.cfg.data.batch_size,
        "sequence_length": built.cfg.data.max_length if counts_tokens(built.plan.task) else None,
        "micro_batches": k,
    }


def communication(built, steps: int) -> dict | None:
    sync = built.sync
    if sync is None or sync.sent is None or built.env.world_size == 1:
        return None
    return {
        "mode": built.cfg.sync.mode,
        "bytes_sent": sync.sent,
        "bytes_per_step": sync.sent / max(steps, 1),
        # averagings for checkpoints and evaluations (local SGD / DiLoCo): not in the above
        "extra_bytes": sync.extra,
        "compression": built.cfg.ddp.gradient_compression,
        # a simulated link's rate (sync.simulated_gbps): step times then include its delays
        "simulated_gbps": built.cfg.sync.simulated_gbps or None,
    }


def energy(
    joules: float | None,
    telemetry: list,
    world_size: int,
    *,
    gpus: int,
    seconds: float,
    samples: float,
    tokens: float,
    device: torch.device,
) -> dict | None:
    """Every rank's GPU joules over the measured window, summed (a collective: every rank calls
    it). Where the GPUs lack NVML's energy counter: mean power x time from the telemetry."""
    total, counted = pg.all_reduce_sum([joules or 0.0, float(joules is not None)], device)
    method = "nvml_total_energy"
    if counted < world_size:
        powers = [t["power_w_mean"] for t in telemetry if t and "power_w_mean" in t]
        if counted or not powers:  # only some ranks have a counter, or no readings at all
            return None
        # a split's rank samples only its first GPU: scale to the GPUs used
        total = sum(powers) / len(powers) * gpus * seconds
        method = "mean_power_x_time"
    return energy_summary(
        total, method, gpus=gpus, seconds=seconds, samples=samples, tokens=tokens or None
    )


def print_summary(result: dict[str, Any]) -> None:
    s = result["summary"]
    redundant = " (redundant data: every rank saw every sample)" if result["redundant_data"] else ""
    if counts_tokens(result["task"]):
        mfu = f", MFU {s['mfu']:.1%}" if s.get("mfu") else ""
        if s.get("mfu_fp8_peak"):
            mfu += f" of the bf16 peak, {s['mfu_fp8_peak']:.1%} of the fp8 peak"
        rate = (
            f"{s['tokens_per_s']:,.0f} tokens/s ({s['tokens_per_step']:,.0f} per step), "
            f"{s['step_time_s']:.3f} s/it{mfu}"
        )
        held = (
            f"held-out loss {s['val_loss']:.4f}"
            if s.get("val_loss") is not None
            else "no held-out set"
        )
    elif get_task(result["task"]).held_out_line:  # the task's own metrics (the GAN's losses)
        rate = f"{s['unique_samples_per_s']:,.1f} unique samples/s"
        held = get_task(result["task"]).held_out_line(result)
    else:
        rate = f"{s['unique_samples_per_s']:,.1f} unique samples/s"
        held = (
            f"held-out accuracy {s['val_accuracy']:.4f}"
            if s["val_accuracy"] is not None
            else f"held-out loss {s['val_loss']:.4f}"  # a custom task's regression
            if s.get("val_loss") is not None
            else "held-out accuracy n/a"
        )
    layout = result["parallel"]["label"]
    shown = f" ({layout})" if result["world_size"] > 1 and "=" in layout else ""
    print(
        f"paratrain: {result['strategy']}{shown} x{result['world_size']} "
        f"{precision_label(result)}{redundant}: "
        f"{s['optimizer_steps']} steps, {s['train_s']:.1f} s training, {rate}, {held}, "
        f"peak memory {s['peak_memory_bytes'] / 2**20:,.0f} MiB ({s['peak_memory_kind']})"
        f"{reserved_words(s.get('peak_reserved_bytes'))}"
        f"{energy_line(s.get('energy'))}{floor_words(s.get('floor'))}\n"
        f"paratrain: results in {result['output_dir']}/result.json",
        flush=True,
    )


def energy_line(e: dict | None) -> str:
    """', 0.412 J/sample (8.7M samples/kWh, 655 W per GPU)': a token count where there is one."""
    if not e:
        return ""
    if e.get("joules_per_token"):
        per, rate = f"{e['joules_per_token'] * 1000:.3g} mJ/token", f"{e['tokens_per_kwh']:.3g}"
        unit = "tokens"
    else:
        per, rate = f"{e['joules_per_sample']:.3g} J/sample", f"{e['samples_per_kwh']:.3g}"
        unit = "samples"
    return f", {per} ({rate} {unit}/kWh, {e['mean_power_w_per_gpu']:.0f} W per GPU)"


def _version() -> str:
    from paratrain.version import __version__

    return __version__


def floor_of(built, k: int, result: dict[str, Any]) -> dict[str, Any]:
    """train.floor: the matmuls and attention of one optimizer step (k micro-batches) timed
    alone on this device in the run's compute dtype, beside the measured step. Whole models
    only (one process, or DDP's replicas): a sharded or split model's shapes are not its
    ranks' (said so instead)."""
    whole = built.wrapper in (None, "ddp") and built.dims.tp == 1 and built.dims.pp == 1
    if not whole or built.split:
        return {"skipped": "a sharded or split model's ranks run other shapes than the model's"}
    from paratrain.meters import floor as floors

    dtype = built.policy.autocast_dtype or torch.float32  # the run's compute dtype (fp64: fp32)
    found = floors.floor(built.work.floor, built.env.device, dtype)
    found = {key: value * k for key, value in found.items()}
    step = result["summary"]["step_time_s"]
    return {**found, "dtype": str(dtype).removeprefix("torch."), "step_s": step,
            "above": step / found["floor_s"] - 1 if found["floor_s"] else None}  # fmt: skip


def floor_or_why(built, k: int, result: dict[str, Any]) -> dict[str, Any]:
    """floor_of, or why it was not timed: the run is over and its result must be written, so a
    floor that does not fit beside the trained model (a GEMM as big as the whole logits, which a
    chunked loss never makes) is said, not raised."""
    try:
        return floor_of(built, k, result)
    except (torch.OutOfMemoryError, RuntimeError) as e:
        if built.env.device.type == "cuda":
            torch.cuda.empty_cache()
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return {"skipped": f"timing it failed beside the trained model: {first[:200]}"}


def floor_words(floor: dict[str, Any] | None) -> str:
    """The summary's floor line, or nothing."""
    if not floor:
        return ""
    if "skipped" in floor:
        return f"\nparatrain: floor not timed ({floor['skipped']})"
    from paratrain.meters.floor import words

    return f"\nparatrain: {words(floor)}"


def reserved_words(reserved: int | None) -> str:
    """The words ", N MiB reserved" where the allocator's hold was measured (a GPU run)."""
    return "" if reserved is None else f", {reserved / 2**20:,.0f} MiB reserved"
