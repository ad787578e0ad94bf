"""GPU telemetry over the measured steps: SM clock, power, temperature and utilisation, read from
NVML through torch.cuda (which maps CUDA_VISIBLE_DEVICES indices to NVML's).

Why: throughput that does not scale is not always software. Two GPUs busy side by side can draw
the host to its power limit and lower their clocks; a compute-dense step (compiled, fused) is hit
harder than a slow one. Each rank samples its own GPU in a daemon thread; result.json keeps the
per-rank summary, so a scaling loss can be told apart from a clock loss.
"""

from __future__ import annotations

import statistics
import threading
from collections.abc import Callable, Sequence

import torch

READINGS = {
    "sm_clock_mhz": torch.cuda.clock_rate,
    "power_w": lambda d: torch.cuda.power_draw(d) / 1000.0,
    "temperature_c": torch.cuda.temperature,
    "utilization_pct": torch.cuda.utilization,
}


def limits(device: torch.device) -> dict[str, float]:
    """The GPU's enforced power limit and top SM clock: what the means are measured against (a
    GPU drawing its limit at a clock below the top is power-bound). Empty where NVML lacks them."""
    try:
        pynvml = torch.cuda.pynvml
        handle = torch.cuda._get_pynvml_handler(device)  # maps CUDA_VISIBLE_DEVICES to NVML's index
        return {
            "power_limit_w": pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0,
            "sm_clock_mhz_max": float(
                pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM)
            ),
        }
    except Exception:  # no NVML, another torch's private helper, or a GPU without these
        return {}


def energy_counter(devices: Sequence[torch.device]) -> Callable[[], float] | None:
    """A reader of the joules the given GPUs have used (NVML's total-energy counter, in mJ since
    the driver loaded, summed over the devices), or None off CUDA, without NVML or on a GPU that
    lacks the counter (pre-Volta): the caller then falls back to mean power x time."""
    if not devices or any(d.type != "cuda" for d in devices):
        return None
    try:
        pynvml = torch.cuda.pynvml
        handles = [torch.cuda._get_pynvml_handler(d) for d in devices]

        def read() -> float:
            return sum(pynvml.nvmlDeviceGetTotalEnergyConsumption(h) for h in handles) / 1000.0

        read()  # raises here, once, where the counter is missing
        return read
    except Exception:  # no NVML, another torch's private helper, or no counter
        return None


def energy_summary(
    joules: float | None,
    method: str | None,
    *,
    gpus: int,
    seconds: float,
    samples: float,
    tokens: float | None = None,
) -> dict[str, float | str | None] | None:
    """The measured window's energy as a user compares it: J per sample (and per token), samples
    (tokens) per kWh, the mean power per GPU. None when nothing was measured (a CPU run)."""
    if joules is None or joules <= 0 or samples <= 0:
        return None
    out: dict[str, float | str | None] = {
        "joules": joules,
        "method": method,
        "gpus": gpus,
        "mean_power_w_per_gpu": joules / max(seconds, 1e-9) / max(gpus, 1),
        "joules_per_sample": joules / samples,
        "samples_per_kwh": samples / joules * 3.6e6,
    }
    if tokens:
        out["joules_per_token"] = joules / tokens
        out["tokens_per_kwh"] = tokens / joules * 3.6e6
    return out


def summarize(samples: list[dict[str, float]]) -> dict[str, float] | None:
    """Mean of each reading, plus the lowest clock and the highest temperature."""
    if not samples:
        return None
    out: dict[str, float] = {"samples": len(samples)}
    for key in READINGS:
        values = [s[key] for s in samples if key in s]
        if values:
            out[f"{key}_mean"] = round(statistics.fmean(values), 1)
    clocks = [s["sm_clock_mhz"] for s in samples if "sm_clock_mhz" in s]
    temps = [s["temperature_c"] for s in samples if "temperature_c" in s]
    if clocks:
        out["sm_clock_mhz_min"] = min(clocks)
    if temps:
        out["temperature_c_max"] = max(temps)
    return out


class GpuSampler:
    """start() / stop() -> summary, or None off CUDA or without NVML (nvidia-ml-py)."""

    def __init__(self, device: torch.device, interval_s: float = 0.5):
        self.device, self.interval_s = device, interval_s
        self.samples: list[dict[str, float]] = []
        self._stop = threading.Event()
        self._paused = threading.Event()  # evaluation, checkpoints: out of the readings
        self._thread: threading.Thread | None = None
        self.enabled = device.type == "cuda" and self._read() is not None

    def _read(self) -> dict[str, float] | None:
        try:
            return {k: float(read(self.device)) for k, read in READINGS.items()}
        except Exception:  # no NVML, or a reading this GPU or driver does not offer
            return None

    def _sample(self) -> None:
        reading = self._read()
        if reading is not None:
            self.samples.append(reading)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            if not self._paused.is_set():
                self._sample()

    def pause(self) -> None:
        self._paused.set()

    def resume(self) -> None:
        self._paused.clear()

    def start(self) -> None:
        if self.enabled and self._thread is None:
            self._sample()  # a short run still gets a first and a last reading
            self._thread = threading.Thread(target=self._run, daemon=True, name="gpu-telemetry")
            self._thread.start()

    def stop(self) -> dict[str, float] | None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            if not self._paused.is_set():  # after the last evaluation: not a training reading
                self._sample()
        summary = summarize(self.samples)
        return {**summary, **limits(self.device)} if summary else summary
