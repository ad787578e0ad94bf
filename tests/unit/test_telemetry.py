"""GPU telemetry: the summary's arithmetic, and the sampler's thread on fake readings."""

import time

import torch

from paratrain.meters import telemetry


def test_summary_means_lowest_clock_hottest_reading():
    s = telemetry.summarize(
        [
            {"sm_clock_mhz": 1980, "power_w": 600, "temperature_c": 50, "utilization_pct": 100},
            {"sm_clock_mhz": 1700, "power_w": 700, "temperature_c": 60, "utilization_pct": 90},
        ]
    )
    assert s == {
        "samples": 2,
        "sm_clock_mhz_mean": 1840.0,
        "power_w_mean": 650.0,
        "temperature_c_mean": 55.0,
        "utilization_pct_mean": 95.0,
        "sm_clock_mhz_min": 1700,
        "temperature_c_max": 60,
    }
    assert telemetry.summarize([]) is None


def test_sampler_is_off_on_the_cpu():
    sampler = telemetry.GpuSampler(torch.device("cpu"))
    sampler.start()
    assert not sampler.enabled and sampler.stop() is None


def test_sampler_thread_collects_until_stopped(monkeypatch):
    clock = iter(range(1000, 100_000))
    fake = {
        "sm_clock_mhz": lambda d: next(clock),
        "power_w": lambda d: 500.0,
        "temperature_c": lambda d: 40.0,
        "utilization_pct": lambda d: 99.0,
    }
    monkeypatch.setattr(telemetry, "READINGS", fake)
    monkeypatch.setattr(telemetry, "limits", lambda d: {"power_limit_w": 700.0})
    sampler = telemetry.GpuSampler(torch.device("cuda"), interval_s=0.01)
    assert sampler.enabled
    sampler.start()
    time.sleep(0.2)
    s = sampler.stop()
    n = len(sampler.samples)
    time.sleep(0.05)
    assert len(sampler.samples) == n  # stopped means stopped
    assert s["samples"] == n >= 3 and s["power_w_mean"] == 500.0
    assert s["sm_clock_mhz_min"] == sampler.samples[0]["sm_clock_mhz"]
    assert s["power_limit_w"] == 700.0


def test_limits_are_empty_without_nvml():
    assert telemetry.limits(torch.device("cpu")) == {}


def test_affinity_in_tasksets_short_form(monkeypatch):
    from paratrain.meters import metrics

    monkeypatch.setattr(metrics.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 8, 10, 11})
    assert metrics._affinity() == "0-3,8,10-11"


def test_sampler_reads_nothing_while_the_clock_is_paused(monkeypatch):
    from paratrain.trainer.measure import TrainClock

    fake = {k: (lambda d: 1.0) for k in telemetry.READINGS}
    monkeypatch.setattr(telemetry, "READINGS", fake)
    monkeypatch.setattr(telemetry, "limits", lambda d: {})
    sampler = telemetry.GpuSampler(torch.device("cuda"), interval_s=0.01)
    clock = TrainClock(torch.device("cpu"), sampler=sampler)
    clock.resume()
    sampler.start()
    time.sleep(0.1)
    clock.pause()  # evaluation
    time.sleep(0.02)  # a reading in flight when the pause came lands now
    n = len(sampler.samples)
    time.sleep(0.15)
    assert len(sampler.samples) == n  # nothing read during the evaluation
    clock.resume()
    time.sleep(0.1)
    assert len(sampler.samples) > n
    sampler.stop()


def test_torchvision_version_is_read_without_importing_it():
    """result.json records torchvision's own __version__ (its build tag too), read from its
    version.py: the import costs a process ~1.5 s of CPU the tiny CNN's runs do not need."""
    import subprocess
    import sys

    code = (
        "import sys; from paratrain.meters.metrics import torchvision_version as v; "
        "print(v(), 'torchvision' in sys.modules)"
    )
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    import torchvision

    assert got.stdout.split() == [torchvision.__version__, "False"]
