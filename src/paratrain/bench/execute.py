"""Run a sweep: each run in its own process (a crash, OOM or hang takes only that run), its
result stored at once; a failed run is recorded with its error and the sweep goes on."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from paratrain.bench.store import Row, Store, error_line
from paratrain.bench.sweep import RunSpec, Sweep
from paratrain.config import to_yaml
from paratrain.meters.metrics import git_commit
from paratrain.trainer.report import log_every

PEER_MODULES = {
    "plain": "paratrain.bench.peers.plain",
    "accelerate": "paratrain.bench.peers.accelerate_ref",
    "fabric": "paratrain.bench.peers.fabric_ref",
    "sol": "paratrain.bench.peers.sol",
    "hf_lora": "paratrain.bench.peers.hf_lora",
    "torchtitan": "paratrain.bench.peers.torchtitan_ref",
    "unsloth_lora": "paratrain.bench.peers.unsloth_lora",
}
# Started as one process: the speed-of-light program, torchtitan's peer (it launches
# torchtitan's own entry point under torchrun itself), and Unsloth's (one GPU, no torchrun
# variables for it to read as a distributed launch).
ONE_PROCESS = ("sol", "torchtitan", "unsloth_lora")
SKIPPED_EXIT = 3  # a peer whose library is not installed


def command_for(run: RunSpec, run_dir: Path) -> list[str]:
    """The command line of one run. paratrain launches itself (through torchrun); peers are
    started by torchrun directly, the speed-of-light program as one process."""
    config_path = run_dir / "config.yaml"
    config_path.write_text(to_yaml(run.config))
    py = sys.executable
    if run.program == "paratrain":
        cmd = [py, "-m", "paratrain", "run", str(config_path), "--output-dir", str(run_dir)]
        # the run's folder is the sweep's own: a re-run (of a failed run, --rerun) replaces
        # what an earlier attempt left there (a run that resumes a checkpoint continues it)
        return cmd if run.config.checkpoint.resume else [*cmd, "--overwrite"]
    module = PEER_MODULES[run.program]
    if run.program in ONE_PROCESS:
        return [py, "-m", module, str(config_path), str(run_dir)]
    nproc = run.plan.nproc
    return [
        py,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "-m",
        module,
        str(config_path),
        str(run_dir),
    ]


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def tail_lines(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


# torch's prefix before a worker's lines under torchrun ([rank0]: ..., with --tee [default0]:)
_RANK = re.compile(r"^\[(?:rank|default)\d+\]:\s?")
# a tool's own error line where no traceback says more (paratrain peer: error: ..., error: ...)
_TOOL = re.compile(r"^(?:[\w.-]+(?: [\w.-]+)?: )?error: ")


def cause_of(output: str) -> str:
    """The line that says why a run failed: the exception line of its last traceback (the
    first line after it that is not indented: the frames are), but not torchrun's own
    (ChildFailedError, printed after the worker's) nor one Python ignored at shutdown
    ("Exception ignored in"); else the last tool error line; else the last line that is not
    a rule of = or -."""
    lines = [_RANK.sub("", line).rstrip() for line in output.splitlines()]
    cause, in_traceback, ignored = None, False, False
    for line in lines:
        if line.startswith("Traceback (most recent call last)"):
            in_traceback = True
        elif in_traceback and line and not line[0].isspace():
            in_traceback = False
            if not ignored and "ChildFailedError" not in line:
                cause = line
            ignored = False
        elif line.startswith("Exception ignored in"):
            ignored = True
    if cause:
        return cause
    tools = [line.strip() for line in lines if _TOOL.match(line.strip())]
    if tools:
        return tools[-1]
    rest = [line.strip() for line in lines if line.strip().strip("=-")]
    return rest[-1] if rest else "(no output)"


def execute_run(run: RunSpec, run_dir: Path, timeout_s: float) -> Row:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "result.json").unlink(missing_ok=True)
    cmd = command_for(run, run_dir)
    started = _now()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if run.config.launch.cpu_threads:  # peers too: torch reads it when it starts
        env["OMP_NUM_THREADS"] = str(run.config.launch.cpu_threads)
    status, error = "ok", None
    log_path = run_dir / "log.txt"
    with open(log_path, "w") as log:
        log.write(" ".join(cmd) + "\n")
        log.flush()
        try:
            # A new session so that a timeout kills torchrun's workers too, not only the agent.
            proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
            code = None
            status, error = "timeout", f"no result after {timeout_s:.0f} s"
    output = log_path.read_text()
    result_path = run_dir / "result.json"
    result = json.loads(result_path.read_text()) if result_path.is_file() else None
    status, error = verdict(code, output, result, status, error)
    if result is not None:
        curve = loss_curve(run_dir, result)
        if curve:
            result["curve"] = curve
    summary = (result or {}).get("summary") or {}
    return Row(
        run_key=run.key,
        sweep=run.sweep,
        label=run.label,
        program=run.program,
        repeat=run.repeat,
        params=run.params,
        config=run.config.to_dict(),
        hardware=(result or {}).get("hardware") or _host(),
        git_commit=git_commit(),
        started_at=started,
        finished_at=_now(),
        status=status,
        error=error,
        unique_samples_per_s=summary.get("unique_samples_per_s"),
        step_time_s=summary.get("step_time_s"),
        val_accuracy=summary.get("val_accuracy"),
        peak_memory_bytes=summary.get("peak_memory_bytes"),
        metrics=summary or None,
        result=result,
    )


def verdict(
    code: int | None, output: str, result: dict | None, status: str, error: str | None
) -> tuple[str, str | None]:
    """(status, error) of a finished run from its exit code (None: timed out), its log and its
    result.json; `status, error` as the wait left them."""
    # torchrun exits 1 whatever its workers returned, so a skip is also read from the log.
    skip_lines = [line for line in output.splitlines() if line.startswith("skipped: ")]
    if code == SKIPPED_EXIT or (code not in (0, None) and skip_lines):
        return "skipped", (skip_lines or [tail_lines(output, 1)])[0]
    if code not in (0, None):
        return "failed", f"exit {code}: {cause_of(output)}\n" + tail_lines(output)
    if code == 0 and result is None:
        return "failed", f"exited 0 without result.json: {cause_of(output)}\n" + tail_lines(output)
    stopped = first_not_finite((result or {}).get("summary") or {})
    if status == "ok" and stopped:
        # a peer that trained on after its loss stopped being a number: its speed is kept in
        # the metrics, but it is not a training run's (Unsloth at batch 8, 2026-12-07)
        n = len(result["summary"]["losses"])
        return "failed", f"loss not a finite number from step {stopped} of {n}"
    return status, error


def loss_curve(run_dir: Path, result: dict) -> list[list[float]]:
    """[[step, loss], ...] of one run, for the report's loss curves: paratrain's step log
    (steps.jsonl, a point every log.every_steps), or a peer's per-step losses where it keeps
    them (summary.losses), averaged over the same intervals."""
    steps = run_dir / "steps.jsonl"
    if steps.is_file():
        points = []
        for line in steps.read_text().splitlines():
            try:
                point = json.loads(line)
            except json.JSONDecodeError:  # a line cut short by a killed run
                continue
            if point.get("loss") is not None:
                points.append([point["step"], point["loss"]])
        # a restarted or resumed run appends from its checkpoint's step: the latest point of a
        # step stands
        return sorted({step: [step, loss] for step, loss in points}.values())
    losses = (result.get("summary") or {}).get("losses") or []
    # the same points as paratrain's log: the mean of the steps since the last point, every
    # log.every_steps (a per-step curve beside interval means would differ where both agree)
    config = result.get("config") or {}
    every = (config.get("log") or {}).get("every_steps") or log_every(
        int((config.get("train") or {}).get("max_steps") or 0)
    )
    stopped = first_not_finite({"losses": losses})
    losses = losses[: stopped - 1] if stopped else losses  # the curve ends where the loss did
    points = []
    for end in range(every, len(losses) + every, every):
        chunk = losses[end - every : end]
        points.append([end - every + len(chunk), sum(chunk) / len(chunk)])
    return points


def first_not_finite(summary: dict) -> int | None:
    """The first step (from 1) whose loss in a peer's summary.losses is NaN or infinite (JSON
    keeps those as null or NaN), or None."""
    for step, loss in enumerate(summary.get("losses") or [], 1):
        if loss is None or not math.isfinite(loss):
            return step
    return None


def _host() -> dict:
    import torch

    from paratrain.meters.metrics import hardware

    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    return hardware(device, 1)


def run_sweep(
    sweep: Sweep, store: Store, runs_dir: Path, *, rerun: bool = False, progress: bool = True
) -> dict[str, int]:
    store.save_sweep(sweep.name, sweep.table, sweep.spec, _now())
    # with the other bench processes running this sweep on this file now: each run once
    pass_id = store.join_pass(sweep.name)
    todo = [r for r in sweep.runs if rerun or store.status_of(r.key) != "ok"]
    counts = {
        "ok": 0,
        "failed": 0,
        "timeout": 0,
        "skipped": 0,
        "done before": len(sweep.runs) - len(todo),
        "run by another process": 0,
    }
    bar = None
    if progress:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        bar = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[current]}"),
        )
        task = bar.add_task(f"sweep {sweep.name}", total=len(todo), current="")
        bar.start()
    try:
        for i, run in enumerate(todo):
            what = f"{run.label} {_describe(run.params)} #{run.repeat}"
            if bar:
                bar.update(task, current=what)
            limit = run.timeout_s or sweep.timeout_s
            # another process on this file runs it, or ran it in this pass
            if not store.claim(run.key, rerun=rerun, pass_id=pass_id, lease_s=limit + 60):
                counts["run by another process"] += 1
                if bar:
                    bar.advance(task)
                continue
            try:
                row = execute_run(run, runs_dir / sweep.name / run.key, limit)
                store.put(row)  # its claim done: not run again in this pass
            except BaseException:
                store.release(run.key)  # interrupted: another process may run it
                raise
            counts[row.status] += 1
            line = f"[{i + 1}/{len(todo)}] {what}: {row.status}"
            if row.status == "ok" and row.unique_samples_per_s:
                line += f", {row.unique_samples_per_s:,.1f} unique samples/s"
                line += floor_words((row.metrics or {}).get("floor"))
            elif row.error:
                line += f" ({error_line(row.error)[:200]})"
            (bar.console.print(line, highlight=False) if bar else print(line, flush=True))
            if bar:
                bar.advance(task)
    finally:
        store.leave_pass()
        if bar:
            bar.stop()
    return counts


def floor_words(floor: dict | None) -> str:
    """A row run with train.floor: its step beside the floor (its matmuls and attention alone)."""
    if not floor or not floor.get("floor_s") or floor.get("above") is None:
        return ""
    return (
        f"; step {floor['step_s'] * 1e3:,.1f} ms, floor {floor['floor_s'] * 1e3:,.1f} ms "
        f"({floor['above']:+.0%} above it)"
    )


def _describe(params: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in params.items())
