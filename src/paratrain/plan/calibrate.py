"""`paratrain plan`'s measurements on the machine at hand: one device's step (a short run of the
recipe as one process, profiled after its warm-up) and the link's bus bandwidth (`paratrain
comm`'s all-reduce at DDP's bucket size, where there are several devices to measure it on).

Each runs in its own process, as `paratrain run` and `paratrain comm` do, so its threads and
memory are those a training process would have."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from paratrain.bench.execute import _tail
from paratrain.config import RunConfig, from_dict, parse_override, set_dotted, to_yaml
from paratrain.errors import UserError
from paratrain.plan import spread
from paratrain.plan.model import Calibration

PROFILED = 5  # steps profiled for the phases; out of the measured window


def calibration_config(
    cfg: RunConfig,
    steps: int,
    threads: int | None,
    run_as: list[str] | None = None,
    wrapper: str = "single",
) -> RunConfig:
    """The recipe as one process on one device: the same per-device batch, accumulation,
    precision, compile and memory levers; a fixed short run, no evaluation or checkpoint.
    `run_as`: the settings of a measured run instead (a strategy on N processes, the same
    steps, not profiled)."""
    overrides = [
        *(run_as or [f"strategy={wrapper}", "launch.nproc=1", f"train.profile_steps={PROFILED}"]),
        f"train.max_steps={cfg.train.warmup_steps + PROFILED + steps}",
        "train.eval=false",
        "checkpoint.at_end=false",
        "checkpoint.every_steps=0",
        "log.progress=false",
        "sync.mode=every_step",
    ]
    if threads is not None:
        overrides.append(f"launch.cpu_threads={threads}")
    raw = cfg.to_dict()
    raw.pop("output_dir", None)
    for item in overrides:
        key, value = parse_override(item)
        set_dotted(raw, key, value)
    return from_dict(RunConfig, raw)


def _start(cmd: list[str], log: Path, threads: int | None) -> subprocess.Popen:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    with open(log, "w") as f:
        return subprocess.Popen(
            cmd, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )


def _wait(proc: subprocess.Popen, timeout_s: float) -> int:
    """The exit code; at the timeout the whole process group is killed (torchrun's workers
    too, not only the agent)."""
    import signal

    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return -9


def _run(cmd: list[str], log: Path, threads: int | None, timeout_s: float) -> int:
    return _wait(_start(cmd, log, threads), timeout_s)


def _log_tail(path: Path) -> str:
    return " | ".join(_tail(path.read_text() if path.is_file() else "", 5).splitlines())


def measure_step(
    cfg: RunConfig,
    out: Path,
    *,
    steps: int = 20,
    threads: int | None = None,
    run_as: list[str] | None = None,
    wrapper: str = "single",
    copies: int = 1,
    timeout_s: float = 900,
) -> dict:
    """Run the calibration (or with `run_as`, a measured run of a strategy); -> its
    result.json, its step time the median of its measured windows and `spread` their
    coefficient of variation (plan/spread.py). `copies` > 1: that many identical calibrations
    at once (CPU processes that will share this machine's cores, caches and memory bandwidth
    measured sharing them); the step time is their medians' mean, the rest copy 0's."""
    out.mkdir(parents=True, exist_ok=True)
    cal_cfg = calibration_config(cfg, steps, threads, run_as, wrapper)
    (out / "config.yaml").write_text(to_yaml(cal_cfg))
    folders = [out] + [out / f"copy_{i}" for i in range(1, copies)]
    procs = []
    for folder in folders:
        folder.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "paratrain", "run", str(out / "config.yaml")]
        # --overwrite: a later `paratrain plan` into the same --out calibrates again in it
        cmd += ["--output-dir", str(folder), "--overwrite"]
        procs.append(_start(cmd, folder / "log.txt", threads))
    codes = [_wait(proc, timeout_s) for proc in procs]
    results = []
    for code, folder in zip(codes, folders, strict=True):
        result = folder / "result.json"
        if code != 0 or not result.is_file():
            what = "the calibration run" if run_as is None else f"the run {' '.join(run_as)}"
            raise UserError(
                f"plan: {what} failed (exit {code}); its log {folder / 'log.txt'}: "
                + _log_tail(folder / "log.txt")
            )
        results.append(json.loads(result.read_text()))
    first = results[0]
    steadiness = [spread.of_windows(r["summary"].get("step_windows_s") or []) for r in results]
    first["summary"]["mean_step_time_s"] = first["summary"]["step_time_s"]
    # the median window: a few steps that waited for another process move it least; the
    # spread: the least steady copy's
    first["summary"]["spread"] = max(cv for _, cv in steadiness)
    first["summary"]["step_time_s"] = steadiness[0][0]
    if copies > 1:
        times = [median for median, _ in steadiness]
        first["summary"]["copies_step_time_s"] = times
        first["summary"]["step_time_s"] = sum(times) / len(times)
    return first


def ddp_wire_bytes(config: dict) -> float | None:
    """A gradient's bytes in DDP's all-reduce where they are not its own size: train.bf16_weights'
    bf16 gradients travel as parallel/ddp.py's wire_bytes says (fp32 unless compressed)."""
    if (config.get("train") or {}).get("bf16_weights") is not True:  # a run's: settled
        return None
    import torch

    from paratrain.config.parallel import DDPConfig
    from paratrain.parallel.ddp import wire_bytes

    kind = (config.get("ddp") or {}).get("gradient_compression", "none")
    return wire_bytes(DDPConfig(gradient_compression=kind), torch.bfloat16, fp32_sum=True)


def from_result(result: dict) -> Calibration:
    """A calibration from one run's result.json: the measured step split by the profiled
    phases (their GPU kernel time on GPUs, host time on the CPU), the model state's bytes as
    counted, the activations as the peak memory above that state."""
    s = result["summary"]
    state = s["model_state"]
    step = s["step_time_s"]
    phases = (s.get("profile_phases") or {}).get("phases") or {}
    key = "gpu_ms" if any("gpu_ms" in v for v in phases.values()) else "cpu_ms"
    ms = {
        name: phases.get(name, {}).get(key, 0.0) / 1000.0
        for name in ("forward", "backward", "optimizer")
    }
    if sum(ms.values()) <= 0:
        raise UserError("plan: the calibration run recorded no step phases to split its step by")
    scale = min(1.0, step / sum(ms.values()))  # profiling's own overhead: fit inside the step
    fwd, bwd, opt = (ms[n] * scale for n in ("forward", "backward", "optimizer"))
    params, trainable = state["parameters"], state["trainable_parameters"]
    weights = state["parameter_bytes"]
    kept = weights + state["gradient_bytes"] + state["optimizer_bytes"]
    precision = result.get("precision", "fp32")
    return Calibration(
        forward_s=fwd,
        backward_s=bwd,
        optimizer_s=opt,
        other_s=max(step - fwd - bwd - opt, 0.0),
        params=params,
        param_bytes=weights / max(params, 1),
        grad_bytes=state["gradient_bytes"] / max(trainable, 1),
        wire_bytes=ddp_wire_bytes(result.get("config") or {}),
        optim_bytes=state["optimizer_bytes"] / max(trainable, 1),
        activation_bytes=max(s["peak_memory_bytes"] - kept, 0.0),
        largest_block_params=state["largest_block_parameters"],
        trainable=trainable,
        layers=state.get("layers") or 0,
        hidden=state.get("hidden_size") or 0,
        tokens_per_micro=(state.get("micro_batch") or 0) * (state.get("sequence_length") or 0),
        micro_batches=state.get("micro_batches") or 1,
        act_elem_bytes=2.0
        if precision in ("bf16", "fp16")
        else 4.0
        if precision != "fp64"
        else 8.0,
    )


def measure_bus(n: int, nbytes: int, device: str, out: Path, timeout_s: float = 300) -> float:
    """`paratrain comm`'s all-reduce bus bandwidth (GB/s) on n local processes at nbytes."""
    out.mkdir(parents=True, exist_ok=True)
    size = f"{max(int(nbytes), 1024)}"
    cmd = [
        sys.executable,
        "-m",
        "paratrain",
        "comm",
        "--nproc",
        str(n),
        "--device",
        device,
        "--ops",
        "all_reduce",
        "--min-bytes",
        size,
        "--max-bytes",
        size,
        "--dtype",
        "fp32",
        "--iters",
        "10",
        "--warmup",
        "3",
        "--out",
        str(out),
    ]
    code = _run(cmd, out / "log.txt", None, timeout_s)
    result = out / "result.json"
    if code != 0 or not result.is_file():
        raise UserError(
            f"plan: measuring the all-reduce on {n} processes failed (exit {code}): "
            + _log_tail(out / "log.txt")
        )
    rows = json.loads(result.read_text())["rows"]
    return float(rows[-1]["busbw_gbps"])
