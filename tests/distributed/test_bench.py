"""`paratrain bench` and `report` end to end on the CPU."""

import os
import re
import sqlite3

import pytest
from conftest import RECIPES, run_cli

from paratrain.cli import main

pytestmark = [pytest.mark.dist, pytest.mark.slow]


def here(capsys, *args):
    """A `paratrain` command in this process (what it prints to stdout). The one-line exit 2
    of a bad sweep, below, is checked in a process of its own, as a user meets it."""
    capsys.readouterr()
    assert main([*map(str, args)]) == 0
    return capsys.readouterr().out


def test_two_point_sweep_makes_db_table_and_plot(tmp_path, capsys, monkeypatch):
    """The sweep CI runs (1 and 2 processes), from this process as `paratrain bench` does it
    (each run a `paratrain run` process of its own); then the report, plots and formats."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # as run_cli gives its processes
    db = tmp_path / "r.db"
    out = here(
        capsys,
        *("bench", RECIPES / "bench" / "cpu_smoke.yaml", "--db", db),
        *("--runs-dir", tmp_path / "runs", "--no-progress"),
    )
    assert "2 ok" in out, out
    with sqlite3.connect(db) as con:
        rows = con.execute(
            "SELECT status, unique_samples_per_s, hardware, config FROM runs"
        ).fetchall()
    assert len(rows) == 2 and all(r[0] == "ok" and r[1] > 0 and r[2] and r[3] for r in rows)
    report = tmp_path / "report.md"
    here(capsys, "report", "--db", db, "--out", report, "--plot", tmp_path / "plots")
    text = report.read_text()
    assert (
        "Data-parallel modes (seed table 2.2)" in text and "| ddp-ds |" in text and "6.73x" in text
    )
    png = tmp_path / "plots" / "cpu_smoke_speedup.png"
    assert png.is_file() and png.read_bytes()[:4] == b"\x89PNG"
    assert "cpu_smoke_speedup.png" in text  # linked from the report
    for fmt in ("csv", "html"):
        assert "ddp-ds" in here(capsys, "report", "--db", db, "--format", fmt)


def test_failed_and_hung_runs_are_recorded_and_the_sweep_goes_on(tmp_path, capsys, monkeypatch):
    """A run that fails, one that hangs (killed at its own timeout_s) and a good one after
    them. The hung variant has a short time limit of its own (it would sleep far past it,
    and is killed wherever it is by then: starting, or asleep in its builder); the others
    keep the sweep's generous one (a good run takes seconds, more under load). On the second
    sweep the hung run fails at once instead, which shows that a timed-out run is tried again
    (and its row replaced)."""
    second = tmp_path / "second_sweep"  # made by this test between the sweeps
    (tmp_path / "flaky.py").write_text(
        "import pathlib, time\n"
        "def boom(num_classes, in_channels):\n"
        "    raise RuntimeError('model exploded')\n"
        "def hang(num_classes, in_channels):\n"
        f"    if pathlib.Path({str(second)!r}).exists():\n"
        "        raise RuntimeError('hung the first time')\n"
        "    time.sleep(3600)\n"
    )
    sweep = tmp_path / "sweep.yaml"
    # The hung run's limit: short beside the sweep's, a few seconds (it need not reach the
    # builder: this test, not the run, says which sweep is the second one). The second sweep
    # gives it the sweep's limit (a time limit is not part of a run's key): now it fails at
    # once.
    text = f"""
name: flaky
recipe: {RECIPES / "tiny_cpu.yaml"}
table: plain
set: {{train.max_steps: 2, data.limit_samples: 128, train.eval: false, log.progress: false, checkpoint.at_end: false, strategy: single}}
variants:
  - {{label: boom, set: {{model.name: "flaky:boom"}}}}
  - {{label: hang, set: {{model.name: "flaky:hang"}}, timeout_s: 4}}
  - {{label: good, set: {{train.lr: 0.001}}}}
timeout_s: 300
"""
    sweep.write_text(text)
    # The sweep runs here; its runs are processes of their own, which import flaky too.
    monkeypatch.syspath_prepend(tmp_path)
    path = os.environ.get("PYTHONPATH")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), *filter(None, [path])]))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    db = tmp_path / "r.db"
    args = ["bench", sweep, "--db", db, "--runs-dir", tmp_path / "runs", "--no-progress"]
    out = here(capsys, *args)
    assert "1 ok, 1 failed, 1 timeout" in out, out
    with sqlite3.connect(db) as con:
        got = dict(
            con.execute("SELECT label, status || ':' || coalesce(error, '') FROM runs").fetchall()
        )
    assert got["good"] == "ok:"
    assert got["boom"].startswith("failed:") and "model exploded" in got["boom"]
    assert got["hang"].startswith("timeout:") and "after 4 s" in got["hang"]  # its own limit
    # Re-running skips what succeeded and tries the rest again.
    second.touch()
    sweep.write_text(text.replace(", timeout_s: 4", ""))
    out = here(capsys, *args)
    assert "0 ok, 2 failed, 0 timeout" in out and "1 done before" in out, out
    with sqlite3.connect(db) as con:
        (hang,) = con.execute("SELECT status || ':' || error FROM runs WHERE label = 'hang'")
    assert hang[0].startswith("failed:") and "hung the first time" in hang[0]
    assert "Not measured — boom" in here(capsys, "report", "--db", db)


def test_bad_sweep_is_one_line_exit_2(tmp_path):
    sweep = tmp_path / "bad.yaml"
    sweep.write_text("name: x\ngrid: {strategy: [ddp-ds, nope]}\n")
    proc = run_cli(["bench", sweep, "--db", tmp_path / "r.db"], check=False)
    assert (
        proc.returncode == 2
        and "strategy: got 'nope'" in proc.stderr
        and proc.stderr.count("\n") == 1
    )
    assert not (tmp_path / "r.db").exists()


def test_two_bench_processes_on_one_file_run_each_run_once(tmp_path):
    """Two `paratrain bench` processes started together on one results file split the sweep:
    each run runs once, a failed one included (the other process does not retry it); under
    --rerun, runs that succeeded before too. The runs raise in their builder once both
    processes have joined the sweep's pass (else a slow start could leave one process the
    whole sweep, and the other a later invocation, which retries what failed)."""
    import subprocess
    import sys

    db = tmp_path / "r.db"
    (tmp_path / "flaky.py").write_text(
        "import sqlite3, time\n"
        "def boom(num_classes, in_channels):\n"
        "    for _ in range(600):\n"
        f"        with sqlite3.connect({str(db)!r}) as db:\n"
        "            if db.execute('SELECT count(*) FROM passes').fetchone()[0] == 2:\n"
        "                break\n"
        "        time.sleep(0.1)\n"
        "    raise RuntimeError('model exploded')\n"
    )
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(f"""
name: split
recipe: {RECIPES / "tiny_cpu.yaml"}
table: plain
set: {{train.max_steps: 2, model.name: "flaky:boom", log.progress: false, strategy: single}}
variants:
  - {{label: boom}}
  - {{label: bust, set: {{train.lr: 0.5}}}}
timeout_s: 300
""")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp_path), env.get("PYTHONPATH")]))
    args = [sys.executable, "-m", "paratrain", "bench", sweep, "--db", db, "--no-progress"]
    args += ["--runs-dir", tmp_path / "runs"]

    def two_at_once(*more) -> list[str]:
        """-> each run the two processes ran, from their "[i/n] label ... #r: status" lines."""
        procs = [
            subprocess.Popen([*map(str, args), *more], stdout=subprocess.PIPE, text=True, env=env)
            for _ in range(2)
        ]
        outs = [p.communicate(timeout=300)[0] for p in procs]
        assert [p.returncode for p in procs] == [0, 0], outs
        lines = (
            re.match(r"\[\d+/\d+\] (\S+) .*(#\d+): (\w+)", x) for o in outs for x in o.splitlines()
        )
        return sorted(" ".join(m.groups()) for m in lines if m)

    # each run once; with the runs of a finished process no longer claimed, the other one
    # retried every failed run (issue 50)
    assert two_at_once() == ["boom #0 failed", "bust #0 failed"]
    with sqlite3.connect(db) as con:  # as if they had succeeded before
        con.execute("UPDATE runs SET status = 'ok'")
    assert two_at_once("--rerun") == ["boom #0 failed", "bust #0 failed"]  # once each again
