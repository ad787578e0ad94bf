"""Restarts and hangs on 2 CPU processes (gloo): two agents as two nodes, a worker killed with
SIGKILL after step 3 under launch.max_restarts=1, both nodes' workers back, resumed from the
newest checkpoint (step 2), bit-identical to an uninterrupted run (on one node the same is
benchmarks/chaos/kill_resume.py's, 20 trials committed); a stopped rank named by the watchdog,
rank 0 too (by rank 1's), whether the stop ends or outlasts the collective timeout; a worker
killed without restarts named with its signal, before the survivor's connection error, and
none of the run's processes (its DataLoader workers, fork servers) left; a user mistake found
in the workers ending the job once, with exit 2. The stopped rank's run (stalled, not
interrupted) is also the two-node run's uninterrupted reference: one launch fewer."""

import os
import signal
import time
import uuid
from pathlib import Path

import pytest
from conftest import RECIPES, TINY_LM, final_weights, read_result, run_cli

pytestmark = pytest.mark.dist

LM = [
    *TINY_LM,
    *("data.batch_size=4", "lora.enabled=false", "strategy=ddp-ds", "train.deterministic=true"),
    *("checkpoint.every_steps=2", "train.max_steps=6"),
]


def args(out, *settings):
    sets = [a for s in [*LM, *settings] for a in ("--set", s)]
    return ["run", *sets, "--nproc", 2, "--output-dir", out]


def test_a_mistake_found_in_the_workers_is_one_line_once(tmp_path):
    p = run_cli(args(tmp_path / "boom", "train.lr=1e10"), check=False)
    assert p.returncode == 2, p.stderr[-3000:]
    lines = [x for x in p.stderr.splitlines() if x.startswith("paratrain: error:")]
    assert len(lines) == 1 and "non-finite loss or gradient" in lines[0], p.stderr[-3000:]
    assert "Traceback" not in p.stderr, p.stderr[-3000:]


@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
    """The stopped-rank run below: -> (its process, its folder). A stop changes no step's
    arithmetic, so its final weights are an uninterrupted 2-process single-node run's."""
    out = tmp_path_factory.mktemp("restarts") / "stopped"
    p = run_cli(
        args(out, "dist.watchdog_s=2", "checkpoint.every_steps=0"),
        env={"PARATRAIN_FAULTS": "sigstop:rank=1:step=4:s=6"},
    )
    return p, out


def test_a_stopped_rank_is_named_and_its_stall_kept_out_of_throughput(stopped):
    """Rank 1 gets SIGSTOP (every thread of it stops, heartbeat too) for 6 s after step 4.
    Rank 0 waits for it in step 4's stop check (a collective every step while step times are
    unknown, or slow) or in step 5's all-reduce: which, depends on how fast the first steps
    ran; either way the wait is that step's, and the run's throughput leaves it out."""
    p, out = stopped
    assert "watchdog: rank 1 has sent no heartbeat" in p.stderr, p.stderr[-3000:]
    s = read_result(out)["summary"]
    (slow,) = s["stalls"]["slow_steps"]
    assert slow["step"] in (4, 5) and slow["excess_s"] > 4, s
    assert s["stall_s"] == slow["excess_s"] and s["train_s"] < slow["seconds"]
    # the step log's rates stay each step's own (the excess left the clock before logging)
    import json

    steps = [json.loads(x) for x in (out / "steps.jsonl").read_text().splitlines()]
    rates = [x["tokens_per_s"] for x in steps[1:]]
    assert max(rates) < 50 * min(rates), rates
    assert s["stalls"]["stragglers"][0]["rank"] == 1
    # every rank that could wrote its flight recorder; the reader names who did not arrive
    assert "flight recorder dumps in" in p.stderr, p.stderr[-3000:]
    read = run_cli(["flight", out])
    assert "rank 1: no dump" in read.stdout, read.stdout
    assert "was entered by rank 0" in read.stdout and "but not by 1" in read.stdout, read.stdout


def test_rank_0_stopped_past_the_collective_timeout_is_the_jobs_last_word(tmp_path):
    """Rank 0 stopped for longer than dist.timeout_s (3 s): rank 1's collective gives up
    first, yet the job's report names rank 0 (whose own watchdog stopped with it: rank 1's
    watches it), the step it stopped after and the collective rank 1 waited in; the watchdog
    (60 s asked) spoke within half the collective timeout."""
    out = tmp_path / "hung"
    p = run_cli(
        args(out, "dist.timeout_s=3", "checkpoint.every_steps=0"),
        env={"PARATRAIN_FAULTS": "sigstop:rank=0:step=4:s=6"},
        check=False,
    )
    assert p.returncode == 1, p.stderr[-3000:]
    assert "watchdog (rank 1's): rank 0 has sent no heartbeat" in p.stderr, p.stderr[-3000:]
    assert "(last: between steps, step 4): its process is stopped" in p.stderr, p.stderr[-3000:]
    report = p.stderr[p.stderr.index("paratrain: rank 0 was stopped") :].splitlines()
    assert report[0].startswith(
        "paratrain: rank 0 was stopped (SIGSTOP, or Ctrl-Z) (between steps, step 4); the "
        "others waited for it in gloo:"
    ), report
    assert report[1].startswith("  then rank 1 gave up: ") and "Timed out" in report[1], report
    assert "failed first" not in p.stderr and "Traceback" not in p.stderr, p.stderr[-3000:]


TINY_CPU = [
    *("run", RECIPES / "tiny_cpu.yaml", "--nproc", 2),
    *("--set", "log.progress=false", "--set", "train.eval=false"),
]


def test_a_stop_of_rank_0_that_ends_is_recorded(tmp_path):
    """Rank 0 stopped 2.5 s after step 2, then continued: rank 1's watchdog names it while it
    is stopped, and the run's result.json keeps the stop (rank 0's watchdog saw its own time
    lost once it ran again)."""
    out = tmp_path / "paused"
    p = run_cli(
        [*TINY_CPU, "--set", "train.max_steps=4", "--set", "dist.watchdog_s=1"]
        + ["--output-dir", out],
        env={"PARATRAIN_FAULTS": "sigstop:rank=0:step=2:s=2.5"},
    )
    assert "watchdog (rank 1's): rank 0 has sent no heartbeat" in p.stderr, p.stderr[-3000:]
    assert "watchdog: rank 0 did not run for" in p.stderr, p.stderr[-3000:]
    stops = read_result(out)["summary"]["stalls"]["stragglers"]
    # stopped after step 2's update: its position says step 2, or step 3 where the loop had
    # moved on to the next step's start when the signal came
    assert any(
        s["rank"] == 0 and s.get("paused") and s["step"] in (2, 3) and s["seconds"] > 1.5
        for s in stops
    ), stops


def processes_with(entry: str) -> list[int]:
    """The processes whose environment holds `entry` (NAME=value)."""
    found = []
    for p in Path("/proc").iterdir():
        try:
            if p.name.isdigit() and entry.encode() in (p / "environ").read_bytes().split(b"\0"):
                found.append(int(p.name))
        except OSError:
            continue
    return found


@pytest.mark.skipif(not Path("/proc/self").exists(), reason="needs Linux's /proc")
def test_a_killed_rank_is_named_with_its_signal_and_none_of_the_runs_processes_outlive_it(
    tmp_path,
):
    """kill -9 of rank 1 after step 3 (launch.max_restarts=0), DataLoader workers on: the
    report names rank 1, its signal and step, then rank 0's connection error; none of the
    run's processes is left (the killed rank's loader worker and its fork server used to live
    on, holding the command's stdout)."""
    mark = f"PARATRAIN_TEST_RUN={uuid.uuid4()}"
    out = tmp_path / "killed"
    try:
        # (a left process holding its stdout kept the command from ending: a time limit)
        p = run_cli(
            [*TINY_CPU, "--set", "train.max_steps=6", "--set", "launch.max_restarts=0"]
            + ["--set", "data.num_workers=1", "--output-dir", out],
            env={"PARATRAIN_FAULTS": "kill:rank=1:step=3", mark.split("=")[0]: mark.split("=")[1]},
            check=False,
            timeout=120,
        )
        assert p.returncode == 1, p.stderr[-3000:]
        report = p.stderr[p.stderr.index("paratrain: rank 1 ") :].splitlines()
        # (its signal, as torchrun saw it; unknown where torchrun saw rank 0 end first)
        assert report[0].startswith(
            ("paratrain: rank 1 was killed by SIGKILL (kill -9", "paratrain: rank 1 ended without")
        ), report
        assert "(between steps, step 3)" in report[0], report
        # rank 0 failed on the lost connection (unless the agent ended it first)
        assert len(report) == 1 or report[1].startswith("  then rank 0 failed without it: ")
        assert "Traceback" not in p.stderr, p.stderr[-3000:]
        deadline = time.monotonic() + 5  # (multiprocessing's resource tracker ends after it)
        while processes_with(mark) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert processes_with(mark) == []
    finally:
        for pid in processes_with(mark):  # (not left to the rest of the suite)
            os.kill(pid, signal.SIGKILL)


def test_two_agents_as_two_nodes_restart_together_and_resume(tmp_path, stopped):
    """Two torchrun agents on this machine as two nodes (c10d rendezvous, one worker each):
    a worker killed after step 3 brings both nodes' workers back (the other node's agent
    restarts them for the membership change, keeping its own restart count); they resume from
    step 2 and end equal to a 2-process single-node run (the stopped-rank run: stalled, never
    interrupted, the same settings but its checkpoints and watchdog)."""
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "two-nodes"
    cmd = [
        sys.executable,
        "-m",
        "paratrain",
        *map(str, args(out, "launch.max_restarts=1", "log.every_steps=1")),
    ]
    cmd[cmd.index("--nproc") + 1] = "1"
    env = {**__import__("os").environ, "PARATRAIN_FAULTS": "kill:rank=1:step=3"}
    nodes = [
        subprocess.Popen(
            [*cmd, "--nnodes", "2", "--node-rank", str(r), "--rdzv-endpoint", f"127.0.0.1:{port}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        for r in range(2)
    ]
    logs = [n.communicate(timeout=240)[0] for n in nodes]
    assert [n.returncode for n in nodes] == [0, 0], logs[0][-3000:] + logs[1][-3000:]
    assert any("step_00000002 at step 2" in log for log in logs)
    a, b = final_weights(stopped[1]), final_weights(out)
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)
    # the step log of a DDP run: rank 0's gradient norm is the job's (DDP averaged them); the
    # restarted generation appended to it from its checkpoint's step
    import json

    points = [json.loads(x) for x in (out / "steps.jsonl").read_text().splitlines()]
    assert [p["step"] for p in points][-3:] == [4, 5, 6], points
    assert all(p["grad_norm"] > 0 and p["tokens_per_s"] > 0 for p in points), points
    # each step once (step 3, logged before the kill, was taken again), and the result's loss
    # over the whole run, steps 1 and 2 of the first generation included
    assert [p["step"] for p in points] == [1, 2, 3, 4, 5, 6], points
    s, ref = read_result(out)["summary"], read_result(stopped[1])["summary"]
    assert s["train_loss"] == ref["train_loss"] and s["train_loss_steps"] == [1, 6]
