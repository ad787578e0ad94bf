"""Where a failure began, as the launching command says it (job.py): a rank a signal killed is
named first, with its signal, the OOM killer told apart from kill -9 where its count can be
read, and the place the rank's loop last was (a rank killed while writing a checkpoint left no
error at all); the others' errors come after it. And procs.none_outlive: what a launch
orphaned is ended with it."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from paratrain.errors import position_file
from paratrain.launch import job, procs


def launch_folder(tmp_path, step=4, phase="checkpoint"):
    where = tmp_path / "launch"
    where.mkdir()
    for rank in (0, 1):
        (where / f"pid_rank_{rank:05d}").write_text(str(1000 + rank))
    position_file(where, 1).write_text(json.dumps([step, phase]).ljust(64))
    return where


def failure(rank: int, when: float, message: str) -> dict:
    return {
        "rank": rank,
        "time": when,
        "type": "RuntimeError",
        "message": message,
        "frame": "step.py:76 in micro_batches",
        "traceback": f"Traceback (most recent call last):\nRuntimeError: {message}\n",
    }


def test_a_rank_killed_while_saving_is_named_though_no_rank_said_a_word(tmp_path, capsys):
    """kill -9 of rank 1 while it wrote a checkpoint: torchrun saw its exit (-9), the agent
    ended rank 0 (-15) before it failed; nobody left an error."""
    where = launch_folder(tmp_path)
    exits = {1: (-9, 100.0), 0: (-15, 100.0)}
    assert job.outcome(where, str(tmp_path / "run"), exits, None) == 1
    assert capsys.readouterr().err.splitlines() == [
        "paratrain: rank 1 was killed by SIGKILL (kill -9, or the kernel's OOM killer) "
        "(checkpoint, step 4)"
    ]


def test_the_oom_killer_is_told_apart_and_the_survivors_error_follows(
    tmp_path, capsys, monkeypatch
):
    where = launch_folder(tmp_path, 3, "step")
    lost = failure(0, 100.2, "Connection reset by peer")
    (where / "failure_rank_00000.json").write_text(json.dumps(lost))
    monkeypatch.setattr(job, "oom_kills", lambda: 8)
    assert job.outcome(where, str(tmp_path / "run"), {1: (-9, 100.0)}, 7) == 1
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == (
        "paratrain: rank 1 was killed by the kernel's OOM killer (SIGKILL: out of memory) "
        "(in step 3)"
    )
    assert lines[1] == "  then rank 0 failed without it: RuntimeError: Connection reset by peer"
    # the count unchanged: kill -9
    assert job.outcome(where, str(tmp_path / "run"), {1: (-9, 100.0)}, 8) == 1
    assert "SIGKILL (kill -9; not the OOM killer)" in capsys.readouterr().err


def test_a_rank_lost_without_its_signal_is_still_named_first(tmp_path, capsys, monkeypatch):
    """torchrun saw rank 0's exit first (both had ended by its look): rank 0's error says it
    lost a peer, rank 1 left no word at all."""
    where = launch_folder(tmp_path, 3, "step")
    lost = failure(0, 100.2, "Read error [127.0.0.1]:4832: Connection reset by peer")
    (where / "failure_rank_00000.json").write_text(json.dumps(lost))
    monkeypatch.setattr(job, "oom_kills", lambda: None)
    assert job.outcome(where, str(tmp_path / "run"), {0: (1, 100.0)}, None) == 1
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == (
        "paratrain: rank 1 ended without a word: killed by a signal (SIGKILL: kill -9 or the "
        "OOM killer), or a crash in native code (in step 3)"
    )
    assert lines[1].startswith("  then rank 0 failed without it: RuntimeError: Read error")


def test_ranks_the_agent_ended_after_a_failure_are_not_its_origin(tmp_path, capsys):
    """Rank 0 raised; torchrun's agent then ended rank 1 (SIGTERM): rank 0 failed first."""
    where = launch_folder(tmp_path)
    (where / "failure_rank_00000.json").write_text(json.dumps(failure(0, 100.0, "boom")))
    assert job.outcome(where, str(tmp_path / "run"), {0: (1, 100.0), 1: (-15, 100.0)}) == 1
    assert capsys.readouterr().err.startswith("paratrain: rank 0 failed first: RuntimeError: boom")


@pytest.mark.skipif(not procs.PROC.is_dir(), reason="needs Linux's /proc")
def test_what_a_launch_orphaned_is_ended_with_it():
    """A child that leaves a grandchild behind (as a killed rank leaves its DataLoader
    workers): the grandchild stays this process's descendant and ends with the launch; a
    process of this one started before is left alone."""
    before = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        with procs.none_outlive(None):
            out = subprocess.run(
                ["sh", "-c", "sleep 30 >/dev/null 2>&1 & echo $!"],
                capture_output=True,
                text=True,
                check=True,
            )
            orphan = int(out.stdout)
            assert orphan in procs.descendants()  # adopted, not init's
        deadline = time.monotonic() + 5
        while procs.state(orphan) is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert procs.state(orphan) is None  # ended, and reaped (no zombie)
        assert before.poll() is None
    finally:
        before.kill()
        before.wait()


@pytest.mark.skipif(not procs.PROC.is_dir(), reason="needs Linux's /proc")
def test_a_stopped_process_is_seen_stopped():
    p = subprocess.Popen(["sleep", "30"])
    try:
        os.kill(p.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 5
        while not procs.stopped(p.pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert procs.stopped(p.pid)
    finally:
        p.kill()
        p.wait()


def test_losing_the_rendezvous_host_reads_the_run_folder_or_says_what_happened(tmp_path, capsys):
    """A node whose agent lost the store mid-run with no failure of its own: the traceback
    another node saved in the (shared) run folder during the launch names the failure; an
    earlier attempt's file there does not; without one, the line says what happened and where
    to look; this node's ranks that only lost their peers come after it, not first. Before any
    worker started it is not this case (None: the agent's error is said as it is)."""
    lost = ConnectionError("store gone")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert job.lost_rendezvous(empty, None, "head:29400", {}, lost, wait_s=0) is None

    where, run = launch_folder(tmp_path), tmp_path / "run"
    (run / "errors").mkdir(parents=True)
    old = run / "errors" / "rank3.txt"  # an earlier attempt's, there as the launch began
    old.write_text("Traceback (most recent call last):\nValueError: last week\n")
    before = job.saved_before(str(run))
    assert job.lost_rendezvous(where, str(run), "head:29400", before, lost, wait_s=0) == 1
    said = capsys.readouterr().err
    assert "lost the launch's rendezvous (head:29400) mid-run" in said
    assert "last week" not in said and "that node's output names the failure" in said

    # this node's rank 1 only lost its peer: not the news
    peer = failure(1, time.time(), "Connection closed by peer")
    (where / "failure_rank_00001.json").write_text(json.dumps(peer))
    text = "Traceback (most recent call last):\n  ...\nRuntimeError: odd batch\n"
    (run / "errors" / "rank0.txt").write_text(text)
    assert job.lost_rendezvous(where, str(run), "head:29400", before, lost, wait_s=0) == 1
    said = capsys.readouterr().err.splitlines()
    assert said[0] == "paratrain: rank 0 failed first: RuntimeError: odd batch", said
    assert str(run / "errors" / "rank0.txt") in said[1] and "(ConnectionError)" in said[1]
    assert "lost their peers after it" in said[2] and "rank1.txt" in said[2], said

    # a failure that began on this node is the news, as the report of any failure says it
    (where / "failure_rank_00001.json").write_text(json.dumps(failure(1, time.time(), "odd")))
    assert job.lost_rendezvous(where, str(run), "head:29400", before, lost, wait_s=0) == 1
    said = capsys.readouterr().err.splitlines()
    assert said[0] == "paratrain: rank 1 failed first: RuntimeError: odd", said
    assert said[-1].startswith("  then this node lost the launch's rendezvous"), said


def test_a_mistake_on_record_is_said_as_a_mistake_when_the_rendezvous_is_lost(tmp_path):
    from paratrain.errors import UserError

    where = launch_folder(tmp_path)
    (where / "rank_00001.txt").write_text("data.path: no such folder")
    with pytest.raises(UserError, match="no such folder"):
        job.lost_rendezvous(where, None, "head:29400", {}, ConnectionError(), wait_s=0)


def test_a_rendezvous_never_reached_says_what_to_check():
    line = job.unreached("head:29400", ConnectionError())
    assert line.startswith("paratrain: could not reach the rendezvous at head:29400")
    assert "\n" not in line and "address and port" in line
