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

from paratrain.bench.execute import tail_lines
from paratrain.config import RunConfig, from_dict, parse_override, set_dotted, to_yaml
from paratrain.errors import UserError
from paratrain.forecast.calibrated import spread
from paratrain.forecast.calibrated.model import Calibration

PROFILED = 5  # steps profiled for the phases; out of the measured window


WINDOWS = 5  # the measured steps cut into this many windows (result.json's step_windows_s)


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
    steps, not profiled). The step log writes a point a window (watched: watch_windows)."""
    overrides = [
        *(run_as or [f"strategy={wrapper}", "launch.nproc=1", f"train.profile_steps={PROFILED}"]),
        f"train.max_steps={cfg.train.warmup_steps + PROFILED + steps}",
        "train.eval=false",
        "checkpoint.at_end=false",
        "checkpoint.every_steps=0",
        "log.progress=false",
        "log.steps=true",
        f"log.every_steps={window_steps(steps)}",
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


def window_steps(steps: int) -> int:
    return max(1, steps // WINDOWS)


def live_windows(path: Path, start: int) -> list[float]:
    """A running calibration's step log (steps.jsonl) so far -> the mean step (s) between each
    two consecutive points at or after step `start` (the warm-up and profiled steps before)."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    points = []
    for line in lines:
        try:
            point = json.loads(line)
            points.append((int(point["step"]), float(point["time"])))
        except (ValueError, KeyError, TypeError):
            continue  # the line being written
    points = [(s, t) for s, t in points if s >= start]
    pairs = zip(points, points[1:], strict=False)
    return [(t1 - t0) / (s1 - s0) for (s0, t0), (s1, t1) in pairs if s1 > s0]


def watch_windows(
    procs: list[subprocess.Popen],
    folders: list[Path],
    start: int,
    total: int,
    limit: float,
    timeout_s: float,
) -> tuple[list[float], int] | None:
    """Wait for the runs, reading their step logs as they grow: at the first window after
    which a run's windows spread above `limit` whatever the rest measure (spread.certain_noisy
    of `total` windows), every run is stopped -> (its windows, total); None when they ended."""
    import time

    deadline = time.monotonic() + timeout_s
    while any(proc.poll() is None for proc in procs) and time.monotonic() < deadline:
        time.sleep(0.25)
        for folder in folders:
            windows = live_windows(folder / "steps.jsonl", start)
            if spread.certain_noisy(windows, total, limit):
                for proc in procs:
                    _wait(proc, 0)  # its whole process group killed
                return windows, total
    return None


def _run(cmd: list[str], log: Path, threads: int | None, timeout_s: float) -> int:
    return _wait(_start(cmd, log, threads), timeout_s)


def _log_tail(path: Path) -> str:
    return " | ".join(tail_lines(path.read_text() if path.is_file() else "", 5).splitlines())


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
    noisy_above: float | None = None,
) -> dict:
    """Run the calibration (or with `run_as`, a measured run of a strategy); -> its
    result.json, its step time the median of its measured windows and `spread` their
    coefficient of variation (forecast/calibrated/spread.py). `copies` > 1: that many identical calibrations
    at once (CPU processes that will share this machine's cores, caches and memory bandwidth
    measured sharing them); the step time is their medians' mean, the rest copy 0's.
    `noisy_above`: the runs are watched, and stopped at the first window after which their
    spread is above it whatever the rest measure -> then only the summary's spread, windows
    and `stopped_at` ([windows measured, of how many])."""
    out.mkdir(parents=True, exist_ok=True)
    cal_cfg = calibration_config(cfg, steps, threads, run_as, wrapper)
    (out / "config.yaml").write_text(to_yaml(cal_cfg))
    folders = [out] + [out / f"copy_{i}" for i in range(1, copies)]
    procs = []
    for folder in folders:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "steps.jsonl").unlink(missing_ok=True)  # an earlier plan's, in the same --out
        cmd = [sys.executable, "-m", "paratrain", "run", str(out / "config.yaml")]
        # --overwrite: a later `paratrain plan` into the same --out calibrates again in it
        cmd += ["--output-dir", str(folder), "--overwrite"]
        procs.append(_start(cmd, folder / "log.txt", threads))
    if noisy_above is not None:
        start = cal_cfg.train.max_steps - steps  # the measured steps' first
        every = window_steps(steps)
        total = len(range(-(-start // every) * every, cal_cfg.train.max_steps + 1, every)) - 1
        noisy = watch_windows(procs, folders, start, total, noisy_above, timeout_s)
        if noisy:
            windows, total = noisy
            median, cv = spread.of_windows(windows)
            summary = {"spread": cv, "step_windows_s": windows, "step_time_s": median}
            return {"summary": summary | {"stopped_at": [len(windows), total]}}
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
