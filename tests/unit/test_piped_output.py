"""What paratrain prints into a log file or a pipe (stdout no terminal, as `paratrain run ... |
tee log` or a CI job gives it): each line whole, not cut at rich's 80 columns, and no progress
bar's redraws ahead of the run's plan. Each case runs in a subprocess with its stdout piped."""

import json
import os
import subprocess
import sys

from test_plan_predict import RESULT  # a recorded calibration (tests/unit on the path)

LONG = "a line longer than any terminal, " * 6 + "14,024 unique samples/s"


def piped(code: str, *args: str) -> list[str]:
    proc = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": ""},
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


def test_the_runs_epoch_lines_are_whole_in_a_pipe():
    code = (
        "from paratrain.meters.metrics import Progress\n"
        "bar = Progress(True, 10, 'ddp-ds x2 fp32')\n"
        "bar.update(5)\n"
        "bar.print(f'epoch 0: loss 2.3089, {__import__(\"sys\").argv[1]}')\n"
        "bar.update(10)\n"
        "bar.close()\n"
    )
    lines = piped(code, LONG)
    assert f"epoch 0: loss 2.3089, {LONG}" in lines, lines


def test_doctors_bullets_and_table_are_whole_in_a_pipe():
    found = {
        "facts": {"torch": "2.14.1", "cpu_cores": 2, "numa_nodes": [0], "gpus": []},
        "measured": {"rows": [{"name": "disk read " + "x" * 90, "value": 1.0, "unit": "GB/s"}]},
        "advice": [LONG],
    }
    code = (
        "import json, sys\n"
        "from paratrain.doctor import print_report\n"
        "print_report(json.loads(sys.argv[1]))\n"
    )
    lines = piped(code, json.dumps(found))
    assert f"- {LONG}" in lines, lines
    assert any("disk read " + "x" * 90 in line for line in lines), lines


def test_the_plans_assumptions_and_table_are_whole_in_a_pipe(tmp_path, monkeypatch):
    import copy

    from paratrain.config import load_config
    from paratrain.forecast import command
    from paratrain.forecast.calibrated import calibrate

    monkeypatch.setattr(calibrate, "measure_step", lambda *a, **k: copy.deepcopy(RESULT))
    monkeypatch.setattr(calibrate, "measure_bus", lambda n, *a: 0.011127)
    monkeypatch.setattr(command, "_on_cpu", lambda cfg: True)
    monkeypatch.setattr("paratrain.launch.torchrun.cores", lambda: 2)
    found = command.run_plan(
        load_config("recipes/tiny_cpu.yaml"), command.PlanArgs(gpus=[1, 2], out=tmp_path)
    )
    code = (
        "import json, sys\n"
        "from paratrain.forecast.command import print_plan\n"
        "print_plan(json.loads(open(sys.argv[1]).read()))\n"
    )
    lines = piped(code, str(tmp_path / "forecast.json"))
    for line in found["assumptions"]:
        assert f"  assumes: {line}" in lines, lines
    for line in found["advice"]:
        assert f"  {line}" in lines, lines
    assert lines[0].endswith("trained)"), lines  # the header: one line


def test_transformers_loading_bar_is_off_in_a_pipe():
    """transformers' "Loading weights" bar: in a pipe its redraws are lines ahead of the
    plan; off there, on rank 0 as on the others, and back on after the load."""
    code = (
        "from transformers.utils import logging\n"
        "from paratrain.models.hf_loading import one_bar\n"
        "with one_bar():\n"
        "    print(logging.is_progress_bar_enabled())\n"
        "print(logging.is_progress_bar_enabled())\n"
    )
    assert piped(code) == ["False", "True"]
