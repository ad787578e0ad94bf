"""plan's calibration reading, rows and advice on a recorded result (no run): the numbers below
are worked out beside each assertion."""

import copy
import json

import pytest

from paratrain.config import load_config
from paratrain.errors import UserError
from paratrain.forecast import command
from paratrain.forecast.calibrated import calibrate, predict
from paratrain.forecast.calibrated.model import Links

# a result.json as a calibration run writes it (fields plan reads), 100 ms per step on a GPU
RESULT = {
    "precision": "bf16",
    "summary": {
        "step_time_s": 0.100,
        # measure_step's median window and the windows' spread (forecast/calibrated/spread.py): steady
        "step_windows_s": [0.099, 0.100, 0.101],
        "spread": 0.008,
        "peak_memory_bytes": 3_000_000_000,
        "unique_samples_per_s": 640.0,
        "model_state": {
            "parameters": 100_000_000,
            "parameter_bytes": 400_000_000,
            "trainable_parameters": 100_000_000,
            "gradient_bytes": 400_000_000,
            "optimizer_bytes": 800_000_000,
            "largest_block_parameters": 10_000_000,
            "blocks": 10,
            "hidden_size": None,
            "layers": None,
            "micro_batch": 64,
            "micro_batches": 1,
        },
        "profile_phases": {
            "phases": {
                "data": {"cpu_ms": 1.0, "gpu_ms": 0.0},
                "forward": {"cpu_ms": 5.0, "gpu_ms": 30.0},
                "backward": {"cpu_ms": 5.0, "gpu_ms": 60.0},
                "optimizer": {"cpu_ms": 1.0, "gpu_ms": 5.0},
            }
        },
    },
}


def test_calibration_from_a_result():
    cal = calibrate.from_result(RESULT)
    # GPU kernel times of the phases, the rest of the measured step as "other"
    assert (cal.forward_s, cal.backward_s, cal.optimizer_s) == pytest.approx((0.03, 0.06, 0.005))
    assert cal.other_s == pytest.approx(0.005)
    assert cal.compute_s == pytest.approx(0.1)
    assert (cal.param_bytes, cal.grad_bytes, cal.optim_bytes) == (4.0, 4.0, 8.0)
    assert cal.activation_bytes == pytest.approx(3e9 - 1.6e9)
    assert cal.act_elem_bytes == 2.0
    # profiled phases longer than the unprofiled step: scaled to fit inside it
    slow = copy.deepcopy(RESULT)
    slow["summary"]["step_time_s"] = 0.0475
    cal = calibrate.from_result(slow)
    assert cal.forward_s + cal.backward_s + cal.optimizer_s == pytest.approx(0.0475)
    assert cal.other_s == pytest.approx(0.0, abs=1e-12)
    none = copy.deepcopy(RESULT)
    none["summary"]["profile_phases"] = None
    with pytest.raises(UserError, match="no step phases"):
        calibrate.from_result(none)


def test_rows_scaling_and_advice():
    cal = calibrate.from_result(RESULT)
    links = Links(10.0, 1.0, per_node=8)
    rows = predict.plan_rows(
        lambda n, strategy: cal,
        [1, 8, 64],
        links,
        ["ddp", "fsdp", "hsdp", "local_sgd"],
        samples_per_step=64,
        memory_limit=lambda n: 2.5e9,
    )
    got = {(r["strategy"], r["gpus"]): r for r in rows}
    assert ("hsdp", 8) not in got and ("local_sgd/16", 1) not in got  # not applicable there
    one = got[("ddp", 1)]
    assert one["samples_per_s"] == pytest.approx(640.0) and one["scaling_efficiency"] == 1.0
    # DDP at 64 over 1 GB/s: 1.75... x 400 MB / 1 GB/s = 787.5 ms against a 60 ms backward
    ddp64 = got[("ddp", 64)]
    assert ddp64["comm_s"] == pytest.approx(2 * 63 / 64 * 0.4)
    assert ddp64["exposed_share"] > 0.8
    # memory: DDP keeps 1.6 GB of state + 1.4 GB of activations > 2.5 GB: does not fit
    assert not one["fits"] and got[("fsdp", 8)]["fits"]
    lines = predict.advice(rows, links)
    assert any(x.startswith("ddp does not fit at 1 GPU: 2.8 GiB") for x in lines)
    # one sentence: the share, the link in MB/s or GB/s (3 significant digits), and what the
    # strategies that hide more of it expose at that scale
    (ddp,) = [x for x in lines if "DDP spends" in x]
    assert ddp.startswith("At 64 GPUs DDP spends ")
    assert "of its step waiting for communication (its all-reduce at 1.00 GB/s across nodes)" in ddp
    assert "; at that scale hsdp waits " in ddp and " and local_sgd/16 " in ddp
    assert ddp.endswith(".")
    assert any(x.startswith("fastest at 64 GPUs: hsdp") for x in lines)
    alone = got[("ddp", 64)] | {"bus_gbps": 0.011127}
    (slow,) = [x for x in predict.advice([alone], links, "process") if "DDP" in x]
    assert "At 64 processes DDP spends" in slow and "at 11.1 MB/s across nodes)" in slow
    assert slow.endswith("; HSDP or local SGD would hide more of it.")


def test_rates_and_counts_read_as_words():
    assert [predict.bandwidth(g) for g in (0.011127, 0.5, 1.5, 242.0, 2500.0)] == [
        "11.1 MB/s",
        "500 MB/s",
        "1.50 GB/s",
        "242 GB/s",
        "2,500 GB/s",
    ]
    assert (
        predict.count(1, "process") == "1 process" and predict.count(4, "process") == "4 processes"
    )
    assert predict.count(8) == "8 GPUs"


def test_model_parallel_rows_respect_the_model():
    assert predict.divides("tp", 4, {"attention_heads": 8, "kv_heads": 2}) is False
    assert predict.divides("tp", 2, {"attention_heads": 8, "kv_heads": 2}) is True
    assert predict.divides("pp", 3, {"layers": 2}) is False
    assert predict.strategies_for("causal_lm", 4, 16) == [
        "ddp",
        "fsdp",
        "hsdp",
        "local_sgd",
        "tp",
        "pp",
    ]
    assert "tp" not in predict.strategies_for("image_classification", 10, 16)


def test_plan_end_to_end_on_recorded_runs(tmp_path, monkeypatch):
    """run_plan with the calibration, link and measured runs answered from records: the
    predicted DDP step at 2 beside a measured one, its error worked out."""
    calls = []
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # the cores decide (conftest sets 1)

    def fake_step(cfg, out, *, steps, threads=None, run_as=None, wrapper="single", copies=1, **kw):
        calls.append((wrapper, threads, copies, steps, tuple(run_as or ())))
        result = copy.deepcopy(RESULT)
        result["summary"]["profile_phases"]["phases"] = {
            k: {"cpu_ms": v["gpu_ms"]}
            for k, v in RESULT["summary"]["profile_phases"]["phases"].items()
        }
        if run_as:  # the measured DDP run at 2 processes: 125 ms
            result["summary"]["step_time_s"] = 0.125
        return result

    monkeypatch.setattr(calibrate, "measure_step", fake_step)
    monkeypatch.setattr(calibrate, "measure_bus", lambda n, nbytes, device, out: 1.0)
    monkeypatch.setattr(command, "_on_cpu", lambda cfg: True)
    monkeypatch.setattr("paratrain.launch.torchrun.cores", lambda: 2)
    cfg = load_config("recipes/tiny_cpu.yaml")
    args = command.PlanArgs(gpus=[1, 2, 8], measure=[2], strategies=["ddp"], out=tmp_path)
    found = command.run_plan(cfg, args)
    rows = {(r["strategy"], r["gpus"]): r for r in found["rows"]}
    # 2 processes on 2 cores, 1 thread each: calibrated at 1 thread (the same record here);
    # DDP's 400 MB at 1 GB/s = 400 ms, 340 ms past the backward + the last 25 MiB bucket
    assert rows[("ddp", 2)]["step_s"] == pytest.approx(0.1 + 0.34 + 25 * 2**20 / 1e9)
    (measured,) = found["measured"]
    assert measured["step_error"] == pytest.approx(rows[("ddp", 2)]["step_s"] / 0.125 - 1)
    # one process alone at 2 threads; two copies at once at 1 thread each, over ~10 s of steps
    assert ("single", 2, 1, 20, ()) in calls and ("single", 1, 2, 100, ()) in calls
    assert json.loads((tmp_path / "forecast.json").read_text())["rows"]
    # 8 processes on a 2-core machine that runs 4: the across-machines assumption printed
    assert any("across machines as within" in x for x in found["assumptions"])
    # a set OMP_NUM_THREADS is what `paratrain run` gives each process, so the plan too
    calls.clear()
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    command.run_plan(cfg, command.PlanArgs(gpus=[1, 2], strategies=["ddp"], out=tmp_path / "omp"))
    assert {threads for _, threads, *_ in calls} == {1}


def test_scales_beyond_this_machine_measure_all_of_it(tmp_path, monkeypatch):
    buses = []
    monkeypatch.setattr(calibrate, "measure_step", lambda *a, **k: copy.deepcopy(RESULT))
    monkeypatch.setattr(calibrate, "measure_bus", lambda n, *a: buses.append(n) or 1.0)
    monkeypatch.setattr(command, "_on_cpu", lambda cfg: True)
    monkeypatch.setattr("paratrain.launch.torchrun.cores", lambda: 2)
    cfg = load_config("recipes/tiny_cpu.yaml")
    found = command.run_plan(cfg, command.PlanArgs(gpus=[1, 64], strategies=["ddp"], out=tmp_path))
    assert buses == [4]  # this machine's 4 processes (a "node"), not 64
    assert {r["gpus"] for r in found["rows"]} == {1, 64}


def test_one_gpu_needs_a_stated_link(tmp_path, monkeypatch):
    monkeypatch.setattr(calibrate, "measure_step", lambda *a, **k: copy.deepcopy(RESULT))
    monkeypatch.setattr(command, "_on_cpu", lambda cfg: False)
    monkeypatch.setattr("torch.cuda.device_count", lambda: 1)
    cfg = load_config("recipes/tiny_cpu.yaml")
    with pytest.raises(UserError, match="give --bus-gbps"):
        command.run_plan(cfg, command.PlanArgs(gpus=[1, 8], out=tmp_path))


def test_a_cpu_plan_speaks_of_processes_on_this_machine(tmp_path, monkeypatch, capsys):
    """On the CPU a scale is processes: the table, its header and every line say so, and the
    default scales stop at the processes this machine runs (a 2-core machine runs 4)."""
    monkeypatch.setattr(calibrate, "measure_step", lambda *a, **k: copy.deepcopy(RESULT))
    monkeypatch.setattr(calibrate, "measure_bus", lambda n, *a: 0.011127)
    monkeypatch.setattr(command, "_on_cpu", lambda cfg: True)
    monkeypatch.setattr("paratrain.launch.torchrun.cores", lambda: 2)
    cfg = load_config("recipes/tiny_cpu.yaml")
    found = command.run_plan(cfg, command.PlanArgs(gpus=None, out=tmp_path))
    assert {r["gpus"] for r in found["rows"]} == {1, 2, 4}
    capsys.readouterr()
    command.print_plan(found)
    out = capsys.readouterr().out
    assert "GPU" not in out, out
    assert "one process's step" in out and "memory/process" in out
    assert "┃ processes ┃" in out  # the table's header
    assert "4 processes per machine" in out and "11.1 MB/s at 4" in out
    (ddp,) = [x for x in found["advice"] if "DDP spends" in x]
    assert "processes DDP spends" in ddp and "(its all-reduce at 11.1 MB/s)" in ddp
    # a scale beyond this machine only when asked, and said to be machines like this one
    found = command.run_plan(cfg, command.PlanArgs(gpus=[1, 8], out=tmp_path / "8"))
    command.print_plan(found)
    assert "8 (2 machines)" in capsys.readouterr().out
