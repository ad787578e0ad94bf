"""`paratrain plan` through the real CLI on CPU processes: the calibrations, the link measured by
`paratrain comm` on 2 gloo processes, and DDP on 2 processes run beside its prediction."""

import json
import subprocess
import sys

import pytest

from paratrain.cli import main

pytestmark = pytest.mark.dist


def plan(tmp_path, *args):
    cmd = [sys.executable, "-m", "paratrain", "plan", "recipes/tiny_cpu.yaml", "--out",
           str(tmp_path / "plan"), *args]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=400)


def test_plan_predicts_and_measures_ddp_on_two_processes(tmp_path):
    # one thread a process (the suite shares 2 cores: two threads would wait for each other),
    # measured once whatever the spread (its repeats and refusal: tests/unit/test_plan_spread.py)
    done = plan(
        tmp_path, "--gpus", "1,2", "--measure", "2", "--strategies", "ddp", "--steps", "5",
        "--window", "2", "--set", "launch.cpu_threads=1", "--tries", "1", "--allow-noisy",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    found = json.loads((tmp_path / "plan" / "forecast.json").read_text())
    rows = {(r["strategy"], r["gpus"]): r for r in found["rows"]}
    assert set(rows) == {("ddp", 1), ("ddp", 2)}
    two = rows[("ddp", 2)]
    # the link was measured (not stated) and the gradients' all-reduce priced with it
    assert found["links"]["measured"]["2"] > 0 and two["comm_s"] > 0
    assert two["bus_gbps"] == pytest.approx(found["links"]["measured"]["2"])
    (measured,) = found["measured"]
    assert measured["gpus"] == 2 and measured["step_s"] > 0
    assert measured["step_error"] == pytest.approx(two["step_s"] / measured["step_s"] - 1)
    # 2 processes were calibrated as 2 copies at once at 1 thread each
    assert any("1 threads, 2 at once" in k for k in found["calibrations"])
    # each calibration's step: the median of its measured windows, their spread recorded
    for key, steady in found["calibration_spread"].items():
        assert steady["tries"] == 1 and steady["spread"] >= 0 and steady["step_windows_s"]
        windows = sorted(steady["step_windows_s"])
        if "1 at once" in key:
            assert found["calibrations"][key] == pytest.approx(windows[len(windows) // 2])
    assert "prediction error over 1 measured rows" in done.stdout


def test_plan_refuses_bad_input_once(tmp_path, capsys):
    out = str(tmp_path / "plan")
    for args, says in ((["--strategies", "zero3"], "zero3"), (["--gpus", "0,2"], "--gpus"),
                       (["--window", "0"], "--window")):  # fmt: skip
        assert main(["plan", "recipes/tiny_cpu.yaml", "--out", out, *args]) == 2
        err = capsys.readouterr().err
        assert err.count("error") == 1 and says in err and "Traceback" not in err
    assert not (tmp_path / "plan").exists()
