"""`paratrain bench` and `report` end to end on the CPU."""

import sqlite3

import pytest
from conftest import RECIPES, run_cli

pytestmark = [pytest.mark.dist, pytest.mark.slow]


def test_two_point_sweep_makes_db_table_and_plot(tmp_path):
    db = tmp_path / "r.db"
    proc = run_cli(
        [
            "bench",
            RECIPES / "bench" / "cpu_smoke.yaml",
            "--db",
            db,
            "--runs-dir",
            tmp_path / "runs",
            "--no-progress",
        ]
    )
    assert "2 ok" in proc.stdout
    with sqlite3.connect(db) as con:
        rows = con.execute(
            "SELECT status, unique_samples_per_s, hardware, config FROM runs"
        ).fetchall()
    assert len(rows) == 2 and all(r[0] == "ok" and r[1] > 0 and r[2] and r[3] for r in rows)
    report = tmp_path / "report.md"
    run_cli(["report", "--db", db, "--out", report, "--plot", tmp_path / "plots"])
    text = report.read_text()
    assert (
        "Data-parallel modes (seed table 2.2)" in text and "| ddp-ds |" in text and "6.73x" in text
    )
    png = tmp_path / "plots" / "cpu_smoke_speedup.png"
    assert png.is_file() and png.read_bytes()[:4] == b"\x89PNG"
    for fmt in ("csv", "html"):
        out = run_cli(["report", "--db", db, "--format", fmt]).stdout
        assert "ddp-ds" in out


def test_failed_and_hung_runs_are_recorded_and_the_sweep_goes_on(tmp_path):
    (tmp_path / "flaky.py").write_text(
        "import time, torch\n"
        "from paratrain.models.vision import build_tiny_cnn\n"
        "def boom(num_classes, in_channels):\n"
        "    raise RuntimeError('model exploded')\n"
        "def hang(num_classes, in_channels):\n"
        "    time.sleep(120)\n"
    )
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(f"""
name: flaky
recipe: {RECIPES / "tiny_cpu.yaml"}
table: plain
set: {{train.max_steps: 3, data.limit_samples: 256, log.progress: false, checkpoint.at_end: false, strategy: single}}
variants:
  - {{label: good}}
  - {{label: boom, set: {{model.name: "flaky:boom"}}}}
  - {{label: hang, set: {{model.name: "flaky:hang"}}}}
  - {{label: good too, set: {{train.lr: 0.001}}}}
timeout_s: 15
""")
    db = tmp_path / "r.db"
    args = ["bench", sweep, "--db", db, "--runs-dir", tmp_path / "runs", "--no-progress"]
    env = {"PYTHONPATH": str(tmp_path)}
    proc = run_cli(args, env=env)
    assert "2 ok, 1 failed, 1 timeout" in proc.stdout
    with sqlite3.connect(db) as con:
        got = dict(
            con.execute("SELECT label, status || ':' || coalesce(error, '') FROM runs").fetchall()
        )
    assert got["good"] == "ok:" and got["good too"] == "ok:"
    assert got["boom"].startswith("failed:") and "model exploded" in got["boom"]
    assert got["hang"].startswith("timeout:")
    # Re-running skips what succeeded and tries the rest again.
    proc = run_cli(args, env=env)
    assert "2 done before" in proc.stdout and "1 failed, 1 timeout" in proc.stdout
    text = run_cli(["report", "--db", db]).stdout
    assert "Not measured — boom" in text


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
