"""The launching command's own mistakes and failures, said in one line: a bad flag value, an
output folder it cannot write (before any worker starts), and a failure report that cannot
save its tracebacks (the workers' error is said on stderr anyway)."""

import json
import time
from pathlib import Path

import pytest
from conftest import RECIPES

from paratrain.cli import main
from paratrain.errors import UserError
from paratrain.launch import job
from paratrain.runner import writable_folder

UNWRITABLE = Path("/proc/paratrain-x")  # even root cannot make a folder here


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("paratrain: error: "), err
    return err


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["run", "--nproc", "two"], "--nproc: 'two' is not a number (e.g. --nproc 2)"),
        (["run", "--nproc", "1.5"], "--nproc: '1.5' is not a whole number (e.g. --nproc 2)"),
        (["plan", "--every", "x"], "--every: 'x' is not a number (e.g. --every 16)"),
        (["run", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    ],
)
def test_a_bad_flag_is_one_line_without_the_usage_block(argv, line, capsys):
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 2
    assert line in one_error_line(capsys)


@pytest.mark.skipif(not Path("/proc/self").exists(), reason="needs Linux's /proc")
def test_an_unwritable_output_dir_is_refused_before_any_worker_starts(tmp_path, capsys):
    with pytest.raises(UserError, match="output_dir: cannot write into /proc"):
        writable_folder(str(UNWRITABLE), "output_dir")
    started = time.monotonic()
    code = main(
        ["run", str(RECIPES / "tiny_cpu.yaml"), "--nproc", "2", "--output-dir", str(UNWRITABLE)]
    )
    assert code == 2
    assert "output_dir: cannot write into /proc" in one_error_line(capsys)
    assert time.monotonic() - started < 20  # refused here, no torchrun, no worker
    writable_folder(str(tmp_path / "a" / "b"), "output_dir")  # a writable one passes...
    assert list(tmp_path.iterdir()) == []  # ...and the probe leaves nothing behind


@pytest.mark.skipif(not Path("/proc/self").exists(), reason="needs Linux's /proc")
@pytest.mark.parametrize("nproc", ["1", "2"])
def test_the_default_run_folder_under_an_unwritable_working_folder_is_one_line(
    nproc, capsys, monkeypatch
):
    monkeypatch.chdir("/proc")  # runs/<name>-<time> would go here
    assert main(["run", str(RECIPES / "tiny_cpu.yaml"), "--nproc", nproc]) == 2
    assert "output_dir: cannot write into /proc" in one_error_line(capsys)


def failure(rank: int, when: float) -> dict:
    return {
        "rank": rank,
        "time": when,
        "type": "RuntimeError",
        "message": "boom",
        "frame": "train.py:3 in step",
        "traceback": f"Traceback (most recent call last):\nRuntimeError: boom on rank {rank}\n",
    }


def test_the_failure_report_says_the_error_when_it_cannot_save_tracebacks(tmp_path, capsys):
    where = tmp_path / "launch"
    where.mkdir()
    for rank, when in ((1, 2.0), (0, 1.0)):
        (where / f"failure_rank_{rank:05d}.json").write_text(json.dumps(failure(rank, when)))
    assert job.outcome(where, str(UNWRITABLE)) == 1  # no traceback of its own
    err = capsys.readouterr().err
    assert "rank 0 failed first: RuntimeError: boom" in err
    assert "full tracebacks: not saved" in err and "1 other rank failed after it" in err
    assert "RuntimeError: boom on rank 0" in err  # the traceback itself, here
    assert job.outcome(where, str(tmp_path / "run")) == 1  # a writable run folder: the files
    assert (tmp_path / "run" / "errors" / "rank1.txt").read_text().endswith("rank 1\n")
    assert "not saved" not in capsys.readouterr().err


def test_the_watchdog_speaks_within_half_the_collective_timeout():
    from paratrain.trainer.watchdog import limit_for

    assert limit_for(60, 600) == 60  # the defaults: as asked
    assert limit_for(60, 30) == 15  # a short collective timeout: the watchdog first
    assert limit_for(0, 30) == 0  # off stays off


def entry(seq: int, op: str = "gloo:all_reduce") -> dict:
    return {
        "process_group": ["0", "default_pg"],
        "collective_seq_id": seq,
        "profiling_name": op,
        "input_sizes": [[1]],
        "state": "started",
        "frames": [{"filename": "/x/interrupts.py", "line": 80, "name": "stop_at"}],
    }


def test_a_hang_names_the_stopped_rank_and_the_collective_rank_0_waits_in(tmp_path, capsys):
    """Rank 0's collective gave up (dist.timeout_s) while rank 1 was stopped: the report names
    rank 1 and, from the flight recorder's dumps (rank 1's absent: it was stopped), the
    collective rank 0 waited in; rank 0's timeout comes after."""
    import pickle

    from paratrain.distributed.flight import note_job
    from paratrain.errors import HANGS

    where, run = tmp_path / "launch", tmp_path / "run"
    where.mkdir()
    (where / "failure_rank_00000.json").write_text(json.dumps(failure(0, 10.0)))
    hang = {"rank": 1, "step": 4, "phase": "between steps", "silent": True, "since": 5.0}
    (where / HANGS).write_text(json.dumps([hang]))
    dumps = run / "flight_recorder"
    note_job(dumps, 2, {"rank": 1})
    dump = {"entries": [entry(45), entry(46)], "pg_config": {"0": {"ranks": "[0, 1]"}}}
    (dumps / "rank_0").write_bytes(pickle.dumps(dump))
    assert job.outcome(where, str(run)) == 1
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == (
        "paratrain: rank 1 stopped sending heartbeats (between steps, step 4); the others "
        "waited for it in gloo:all_reduce #46 [[1]] (interrupts.py:80 stop_at)"
    )
    assert lines[1] == "  then rank 0 gave up: RuntimeError: boom"
    (dumps / "rank_0").unlink()  # no flight recorder (dist.flight_recorder=0): the rank alone
    job.outcome(where, str(run))
    assert capsys.readouterr().err.splitlines()[0].endswith("(between steps, step 4)")
    # a rank stopped only after the first failure is not its cause, nor one that raised
    for other in ({**hang, "since": 11.0}, {**hang, "rank": 0}):
        (where / HANGS).write_text(json.dumps([other]))
        job.outcome(where, str(run))
        assert capsys.readouterr().err.startswith("paratrain: rank 0 failed first: RuntimeError")
