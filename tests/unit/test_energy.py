"""Energy per sample: the counter's window (training only, warm-up out), the fallback from mean
power, the summary's arithmetic, the line printed and the report's column, on fake counters."""

import json
import time

import pytest
import torch
from conftest import TINY_SETTINGS, train

from paratrain.config import load_config
from paratrain.meters import telemetry
from paratrain.trainer import result as results
from paratrain.trainer.measure import Meter, TrainClock


class Counter:
    """Joules that only grow when told to: what NVML's counter does while a GPU works."""

    def __init__(self):
        self.j = 1_000.0

    def __call__(self):
        return self.j


def test_summary_arithmetic():
    e = telemetry.energy_summary(
        3_600.0, "nvml_total_energy", gpus=2, seconds=6.0, samples=1_800, tokens=3_600
    )
    assert e["joules_per_sample"] == 2.0 and e["samples_per_kwh"] == 1_800_000.0
    assert e["joules_per_token"] == 1.0 and e["tokens_per_kwh"] == 3_600_000.0
    assert e["mean_power_w_per_gpu"] == 300.0  # 3,600 J / 6 s / 2 GPUs
    assert telemetry.energy_summary(None, None, gpus=1, seconds=1, samples=10) is None
    assert telemetry.energy_summary(5.0, "x", gpus=1, seconds=1, samples=0) is None


def test_clock_counts_joules_only_while_training():
    c = Counter()
    clock = TrainClock(torch.device("cpu"), c)
    clock.resume()
    c.j += 50  # training
    clock.pause()
    c.j += 1_000  # evaluation, a checkpoint: out of the window as their seconds are
    clock.resume()
    c.j += 25
    assert clock.joules() == 75.0
    clock.pause()
    assert clock.joules() == 75.0
    assert TrainClock(torch.device("cpu")).joules() is None  # no counter: nothing invented


def test_meter_leaves_warm_up_out():
    c = Counter()
    clock = TrainClock(torch.device("cpu"), c)
    meter = Meter(torch.device("cpu"), start_step=0, warmup=2, profiled=0)
    clock.resume()
    c.j += 400  # two warm-up steps (compilation draws power too)
    meter.mark(2, clock)
    c.j += 60
    assert meter.joules(5, clock) == 60.0
    fresh = Meter(torch.device("cpu"), start_step=0, warmup=10, profiled=0)
    assert fresh.joules(5, clock) == 460.0  # never warm: the whole run, as window() counts


def test_energy_from_counter_or_mean_power():
    kw = {"gpus": 1, "seconds": 2.0, "samples": 100, "tokens": 0.0, "device": torch.device("cpu")}
    e = results.energy(80.0, [None], 1, **kw)
    assert e["method"] == "nvml_total_energy" and e["joules_per_sample"] == 0.8
    fallback = results.energy(None, [{"power_w_mean": 300.0}], 1, **kw)
    assert fallback["method"] == "mean_power_x_time" and fallback["joules"] == 600.0
    assert results.energy(None, [None], 1, **kw) is None  # a CPU run: no energy row


def test_counter_reads_nvml_in_joules(monkeypatch):
    class FakeNvml:
        @staticmethod
        def nvmlDeviceGetTotalEnergyConsumption(handle):
            return {"h0": 5_000, "h1": 7_000}[handle]  # mJ

    monkeypatch.setattr(torch.cuda, "pynvml", FakeNvml, raising=False)
    monkeypatch.setattr(torch.cuda, "_get_pynvml_handler", lambda d: f"h{d.index}")
    read = telemetry.energy_counter([torch.device("cuda", 0), torch.device("cuda", 1)])
    assert read() == 12.0
    assert telemetry.energy_counter([torch.device("cpu")]) is None


def test_counter_absent_on_a_gpu_without_it(monkeypatch):
    class OldNvml:
        @staticmethod
        def nvmlDeviceGetTotalEnergyConsumption(handle):
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")

    monkeypatch.setattr(torch.cuda, "pynvml", OldNvml, raising=False)
    monkeypatch.setattr(torch.cuda, "_get_pynvml_handler", lambda d: 0)
    assert telemetry.energy_counter([torch.device("cuda", 0)]) is None


def test_run_reports_energy_per_sample(tmp_path, monkeypatch, capsys):
    """A whole run on a counter that draws 200 W of wall time: result.json's J/sample is that
    power x the measured seconds / the measured samples, and the summary line says it."""
    t0 = time.perf_counter()
    monkeypatch.setattr(
        telemetry, "energy_counter", lambda devices: lambda: 200.0 * (time.perf_counter() - t0)
    )
    cfg = load_config(
        None,
        [
            *TINY_SETTINGS,
            "data.limit_samples=256",
            "train.max_steps=8",
            "train.warmup_steps=2",
            f"output_dir={tmp_path}",
        ],
    )
    train(cfg)
    s = json.loads((tmp_path / "result.json").read_text())["summary"]
    e = s["energy"]
    assert e["method"] == "nvml_total_energy" and e["gpus"] == 1
    assert e["mean_power_w_per_gpu"] == pytest.approx(200.0, rel=0.05)
    samples = s["unique_samples_per_s"] * s["step_time_s"] * s["measured_steps"]
    assert e["joules_per_sample"] == pytest.approx(e["joules"] / samples)
    assert "J/sample" in capsys.readouterr().out


def test_cpu_run_has_no_energy(tmp_path):
    cfg = load_config(
        None,
        [*TINY_SETTINGS, "data.limit_samples=128", "train.max_steps=3", f"output_dir={tmp_path}"],
    )
    train(cfg)
    assert json.loads((tmp_path / "result.json").read_text())["summary"]["energy"] is None


def test_energy_line():
    assert results.energy_line(None) == ""
    line = results.energy_line(
        {"joules_per_sample": 0.4123, "samples_per_kwh": 8.73e6, "mean_power_w_per_gpu": 655.2}
    )
    assert line == ", 0.412 J/sample (8.73e+06 samples/kWh, 655 W per GPU)"
    lm = results.energy_line(
        {
            "joules_per_token": 0.0712,
            "tokens_per_kwh": 5.06e7,
            "mean_power_w_per_gpu": 690.0,
            "joules_per_sample": 145.8,
        }
    )
    assert lm.startswith(", 71.2 mJ/token")


def test_report_has_an_energy_column():
    from test_bench_report import row

    from paratrain.bench.report import build_report

    r = row("a", nproc=1, label="x")
    r.metrics = {"measured_steps": 10, "energy": {"joules_per_sample": 0.4123}}
    bare = row("b", nproc=1, label="y")  # a CPU run
    bare.metrics = {"measured_steps": 10, "energy": None}
    (table,), _ = build_report({"v": ("variants", {}, [r, bare])})
    col = table.headers.index("J/sample")
    assert [t[col] for t in table.rows] == ["0.412", "n/a"]
    assert any("total-energy counter" in n for n in table.notes)
