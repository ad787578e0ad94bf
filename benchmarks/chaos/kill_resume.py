"""Chaos trials for fault tolerance (issue 14), bounded: a 2-process ddp-ds run of the tiny Llama
(deterministic, 8 steps, a checkpoint every 2) against one uninterrupted reference.

- kill: SIGKILL a random rank after a random step (PARATRAIN_FAULTS, first generation only)
  under launch.max_restarts=1; the agent restarts both workers, which resume from the newest
  good checkpoint.
- corrupt: a finished run's newest checkpoint gets one file truncated or overwritten; a second
  run with checkpoint.resume=auto and more steps must skip it, resume from the one before and
  end where a run straight to those steps ends.

Prints and writes (--out) a table: trials, resumed, bit-identical, lost steps (steps trained
again after a restart).

    python benchmarks/chaos/kill_resume.py --trials 20 --out benchmarks/results/<date>-cpu/chaos.md
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from conftest import final_weights  # noqa: E402

STEPS = 8
BASE = [
    "data.source=synthetic-text",
    "model.init=random",
    "model.shape=tiny",
    "data.num_workers=0",
    "data.max_length=32",
    "train.warmup_steps=1",
    "log.progress=false",
    "data.batch_size=4",
    "lora.enabled=false",
    "checkpoint.every_steps=2",
    "strategy=ddp-ds",
    "train.deterministic=true",
]


def run(out: Path, *settings: str, env=None, nproc=2, timeout=300) -> tuple[int, str, float]:
    args = [a for s in [*BASE, *settings] for a in ("--set", s)]
    cmd = [sys.executable, "-m", "paratrain", "run", *args, "--nproc", str(nproc)]
    t = time.perf_counter()
    p = subprocess.run(
        [*cmd, "--output-dir", str(out)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )
    return p.returncode, p.stdout + p.stderr, time.perf_counter() - t


def identical(a: Path, b: Path) -> bool:
    wa, wb = final_weights(a), final_weights(b)
    return wa.keys() == wb.keys() and all((wa[k] == wb[k]).all() for k in wa)


def record(rows: list[str], row: str, ok: bool, log_path: Path, log: str) -> None:
    """One trial's table row, printed as it comes; the log kept when the trial failed."""
    rows.append(row)
    print(row, flush=True)
    if not ok:
        log_path.write_text(log)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--corrupt-trials", type=int, default=5)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    work = Path(tempfile.mkdtemp(prefix="chaos-"))
    dev = f"device={a.device}"
    nproc = 1 if a.device == "cuda" else 2
    ref = work / "ref"
    code, log, _ = run(ref, dev, f"train.max_steps={STEPS}", nproc=nproc)
    assert code == 0, log[-2000:]
    rows, kills = [], {"trials": 0, "resumed": 0, "identical": 0, "lost": 0, "exit0": 0}
    for t in range(a.trials):
        rank, step = rng.randrange(nproc), rng.randint(1, STEPS - 1)
        out = work / f"kill{t}"
        code, log, secs = run(
            out,
            dev,
            f"train.max_steps={STEPS}",
            "launch.max_restarts=1",
            env={"PARATRAIN_FAULTS": f"kill:rank={rank}:step={step}"},
            nproc=nproc,
        )
        m = re.search(r"resumed from \S+ at step (\d+)", log)
        at = int(m.group(1)) if m else 0
        newest = step // 2 * 2  # the checkpoint before the kill (none: from the start)
        same = code == 0 and identical(ref, out)
        lost = step - at
        kills["trials"] += 1
        kills["exit0"] += code == 0
        kills["resumed"] += code == 0 and at == newest
        kills["identical"] += same
        kills["lost"] += lost
        row = f"| kill | rank {rank} after step {step} | {code} | {at} | {lost} | {same} | {secs:.0f} |"
        record(rows, row, code == 0 and same, work / f"kill{t}.log", log)
        shutil.rmtree(out, ignore_errors=True)
    # corrupt: the newest of a finished run's checkpoints is damaged; auto resume skips it
    straight = work / "straight"
    code, log, _ = run(straight, dev, f"train.max_steps={STEPS + 2}", nproc=nproc)
    assert code == 0, log[-2000:]
    corrupt = {"trials": 0, "resumed": 0, "identical": 0, "skipped_named": 0}
    for t in range(a.corrupt_trials):
        out = work / f"corrupt{t}"
        code, log, _ = run(out, dev, f"train.max_steps={STEPS}", nproc=nproc)
        newest = sorted((out / "checkpoints").glob("step_*"))[-1]
        victim = rng.choice(sorted(p for p in newest.iterdir() if p.name != "manifest.json"))
        how = rng.choice(["truncate", "overwrite"])
        data = victim.read_bytes()
        if how == "truncate":
            victim.write_bytes(data[: len(data) // 2])
        else:
            pos = rng.randrange(len(data))
            victim.write_bytes(data[:pos] + bytes([data[pos] ^ 0xFF]) + data[pos + 1 :])
        code, log, secs = run(
            out, dev, f"train.max_steps={STEPS + 2}", "checkpoint.resume=auto", nproc=nproc
        )
        m = re.search(r"resumed from \S+step_(\d+) at step", log)
        named = "checkpoint skipped" in log and victim.name in log
        same = code == 0 and identical(straight, out)
        corrupt["trials"] += 1
        corrupt["resumed"] += bool(m)
        corrupt["identical"] += same
        corrupt["skipped_named"] += named
        at = int(m.group(1)) if m else "-"
        row = f"| corrupt | {how} {newest.name}/{victim.name} | {code} | {at} | - | {same} | {secs:.0f} |"
        record(rows, row, code == 0 and same, work / f"corrupt{t}.log", log)
    summary = (
        f"kill -9 trials {kills['trials']}: exit 0 {kills['exit0']}, resumed from the newest "
        f"checkpoint (or the start, before the first) {kills['resumed']}, "
        f"bit-identical {kills['identical']}, lost steps {kills['lost']} in all\n"
        f"corrupt-newest trials {corrupt['trials']}: resumed from the previous "
        f"{corrupt['resumed']}, damaged file named {corrupt['skipped_named']}, bit-identical "
        f"{corrupt['identical']}\n"
    )
    table = (
        "| trial | fault | exit | resumed at step | lost steps | bit-identical | s |\n"
        "|---|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n"
    )
    print(summary)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(
            f"`python benchmarks/chaos/kill_resume.py --trials {a.trials} --corrupt-trials "
            f"{a.corrupt_trials} --device {a.device}`\n\n{summary}\n{table}\nlogs of failed trials: {work}\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
