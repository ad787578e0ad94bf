"""plan on a noisy or loaded machine (issue 50, item 3), on fake calibration timings: a spread
calibration is measured again, then refused or (--allow-noisy) planned from the steadiest try;
a scaling above 100% is flagged, and one device's threads starved by other processes are named."""

import copy
import statistics

import pytest
from test_plan_predict import RESULT  # a recorded calibration (tests/unit on the path)

from paratrain.config import load_config
from paratrain.errors import UserError
from paratrain.forecast import command
from paratrain.forecast.calibrated import calibrate, spread
from paratrain.trainer.result import step_windows


def test_step_windows_cut_the_measured_steps():
    # 2 warm-up steps, then 7 measured: 5 windows of 1-2 steps, each its mean
    times = [9.0, 9.0, 1.0, 1.0, 2.0, 2.0, 3.0, 4.0, 5.0]
    assert step_windows(times, 7) == [1.0, 1.5, 2.0, 3.5, 5.0]
    assert step_windows(times, 2) == [4.0, 5.0]
    assert step_windows(times, 0) == []  # no measured window


def test_median_and_coefficient_of_variation():
    median, cv = spread.of_windows([0.010, 0.011, 0.009, 0.030])
    assert median == pytest.approx(0.0105)
    assert cv == pytest.approx(statistics.pstdev([10, 11, 9, 30]) / 15.0)
    assert spread.of_windows([0.2]) == (0.2, 0.0)
    with pytest.raises(UserError, match="no steps after its warm-up"):
        spread.of_windows([])


def fake(spreads):
    """measure(attempt) answering one result per try with these spreads; records the tries."""
    tried = []

    def measure(attempt):
        tried.append(attempt)
        result = copy.deepcopy(RESULT)
        result["summary"]["spread"] = spreads[attempt - 1]
        result["summary"]["step_time_s"] = 0.1 * attempt
        return result

    return measure, tried


def test_a_steady_calibration_is_measured_once():
    measure, tried = fake([0.03])
    said = []
    got = spread.steady(measure, "one device", say=said.append)
    assert tried == [1] and not said
    assert got["summary"]["tries"] == 1 and got["summary"]["noisy"] is False


def test_a_noisy_calibration_is_measured_again_until_steady():
    measure, tried = fake([0.66, 0.20])
    said = []
    got = spread.steady(measure, "one device", say=said.append)
    assert tried == [1, 2] and got["summary"]["step_time_s"] == pytest.approx(0.2)
    assert got["summary"]["tries"] == 2 and not got["summary"]["noisy"]
    assert said == [
        "plan: one device: its step spread 66% over its windows (above 25%): measuring again (2/3)"
    ]


def test_a_machine_noisy_in_every_try_is_refused_or_planned_from_the_steadiest():
    measure, tried = fake([0.66, 1.17, 0.40])
    with pytest.raises(UserError) as refused:
        spread.steady(measure, "one device", say=lambda x: 0)
    line = str(refused.value)
    assert tried == [1, 2, 3] and "\n" not in line
    assert "too noisy" in line and "40% or more in each of 3 tries" in line
    assert "--allow-noisy" in line
    measure, tried = fake([0.66, 1.17, 0.40])
    said = []
    got = spread.steady(measure, "one device", allow_noisy=True, say=said.append)
    assert got["summary"]["step_time_s"] == pytest.approx(0.3)  # the steadiest: try 3
    assert got["summary"]["noisy"] is True and "--allow-noisy" in said[-1]


def test_threads_waiting_for_cores_are_named():
    # the machine: 330 ms at 2 threads against a few ms at 1
    line = spread.starved(0.330, 0.0056, 2, "load average 2.3 on 2 cores")
    assert "330.0 ms at 2 threads and 5.6 ms at 1" in line and "launch.cpu_threads=1" in line
    assert spread.starved(0.012, 0.010, 2, None) is None  # a small model's threads: no starving


def planned(tmp_path, monkeypatch, one_thread_s, **kw):
    """run_plan of tiny_cpu on a fake 2-core CPU: one process at 2 threads steps in 100 ms,
    two copies at 1 thread each in 20 ms (5x faster each: 499% scaling with the all-reduce), one process at 1
    thread in one_thread_s."""

    def fake_step(cfg, out, *, steps, threads=None, run_as=None, wrapper="single", copies=1, **kw):
        result = copy.deepcopy(RESULT)
        result["summary"]["profile_phases"]["phases"] = {
            k: {"cpu_ms": v["gpu_ms"]}
            for k, v in RESULT["summary"]["profile_phases"]["phases"].items()
        }
        if threads == 1:
            result["summary"]["step_time_s"] = 0.020 if copies == 2 else one_thread_s
        return result

    monkeypatch.setattr(calibrate, "measure_step", fake_step)
    monkeypatch.setattr(calibrate, "measure_bus", lambda n, nbytes, device, out: 1000.0)
    monkeypatch.setattr(command, "_on_cpu", lambda cfg: True)
    monkeypatch.setattr("paratrain.launch.torchrun.cores", lambda: 2)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # the cores decide (conftest sets 1)
    cfg = load_config("recipes/tiny_cpu.yaml")
    args = command.PlanArgs(gpus=[1, 2], strategies=["ddp"], out=tmp_path, **kw)
    return command.run_plan(cfg, args)


def test_scaling_above_ideal_is_flagged_and_explained(tmp_path, monkeypatch, capsys):
    # one thread as slow as two: not starved, so the plan goes on with the rows flagged
    found = planned(tmp_path, monkeypatch, one_thread_s=0.100)
    two = next(r for r in found["rows"] if r["gpus"] == 2)
    assert two["scaling_efficiency"] > 4 and found["starved"] is None
    assert any(x.startswith("fastest at 2 processes") and "⚠ above the ideal 2x" in x
               for x in found["advice"])  # fmt: skip
    command.print_plan(found)
    out = capsys.readouterr().out
    assert "499% ⚠" in out  # the table's cell, and its note below (wrapped or not)
    assert "⚠ scaling above 100%" in " ".join(out.split())


def test_threads_starved_by_other_processes_refuse_the_plan(tmp_path, monkeypatch, capsys):
    # one thread 10x faster than two: the one-device step waited for cores
    with pytest.raises(UserError, match="10.0 ms at 1: its threads waited for cores"):
        planned(tmp_path, monkeypatch, one_thread_s=0.010)
    assert not (tmp_path / "forecast.json").exists()
    found = planned(tmp_path, monkeypatch, one_thread_s=0.010, allow_noisy=True)
    command.print_plan(found)
    out = " ".join(capsys.readouterr().out.split())
    assert "⚠ above the ideal 2x" in out and "its threads waited for cores" in out


def test_a_loaded_machine_is_refused_at_its_first_noisy_calibration():
    """Under load another try waits on the same processes: the first noisy one refuses, with
    where the watch stopped it and its windows."""
    measure, tried = fake([0.66, 0.10])

    def stopped(attempt):
        result = measure(attempt)
        result["summary"] |= {"stopped_at": [2, 5], "step_windows_s": [0.075, 0.55]}
        return result

    with pytest.raises(UserError) as refused:
        spread.steady(stopped, "one device", load="load average 2.3 on 2 cores", say=print)
    line = str(refused.value)
    assert tried == [1] and "\n" not in line
    assert "one device spread 66% in its first try (stopped after window 2 of 5" in line
    assert "its windows' steps 75.0, 550.0 ms" in line
    assert "load average 2.3 on 2 cores" in line and "--allow-noisy" in line


def test_a_calibration_is_noisy_for_certain_once_no_windows_to_come_can_steady_it():
    # 75 then 550 ms: whatever the 3 windows to come, the 5 spread above 25%
    assert spread.certain_noisy([0.075, 0.55], 5)
    # 10 then 13 ms: the rest may still steady them; and one window tells nothing
    assert not spread.certain_noisy([0.010, 0.013], 5)
    assert not spread.certain_noisy([0.5], 5)
    # the bound is exact: the rest at the windows' mean leave spread x sqrt(k / total)
    windows = [0.010, 0.020]
    rest = [0.015] * 3
    assert spread.of_windows(windows + rest)[1] == pytest.approx(
        spread.of_windows(windows)[1] * (2 / 5) ** 0.5
    )


def test_the_watch_stops_a_calibration_at_its_first_noisy_window(tmp_path):
    """A running calibration's step log read as it grows: after its second measured window it
    is noisy whatever the rest measure, and its process group is stopped then."""
    import json
    import sys
    import time

    points = [(4, 0.0), (8, 0.3), (12, 0.7), (16, 4.7)]  # warm-up, then 100 ms, then 1 s steps
    (tmp_path / "steps.jsonl").write_text(
        "".join(json.dumps({"step": s, "time": t, "loss": 1.0}) + "\n" for s, t in points)
    )
    assert calibrate.live_windows(tmp_path / "steps.jsonl", 8) == pytest.approx([0.1, 1.0])
    proc = calibrate._start([sys.executable, "-c", "import time; time.sleep(60)"],
                            tmp_path / "log.txt", None)  # fmt: skip
    began = time.monotonic()
    got = calibrate.watch_windows([proc], [tmp_path], 8, 5, spread.LIMIT, timeout_s=60)
    assert got == (pytest.approx([0.1, 1.0]), 5)
    assert time.monotonic() - began < 10 and proc.poll() is not None
