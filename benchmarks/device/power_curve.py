"""Issue 52: how a power limit slows this GPU's matmuls, measured without changing its settings.

torchtitan's table ran H100s at 500 W; the lent H100 runs at 700 W and its limit is not ours to
change. What can be measured here is the curve the limit acts on: the matmul's power at each clock
it runs. A bf16 GEMM loop followed, each time, by an idle spin of the GPU (torch.cuda._sleep) of a
set share of the period (the duty) draws less power on average, so the power manager lets the
clock rise; at each duty the clock settles where the average power meets the limit (or at the
top clock). NVML is read every few milliseconds in a thread: the SM clock, the power (instant
where the driver has it) and the clock's limiting reasons. From each steady state,

    P_gemm(f) = (P - (1 - d) * P_spin(f)) / d

is the GEMM's own power at clock f (P_spin: the spin's power, measured alone at the top clock).
Fitting P_gemm = P0 + k * f^n over the duties gives the clock a 500 W limit allows the GEMM,
which is the plan's 500 W compute share.

    python3 benchmarks/device/power_curve.py OUT            # on the GPU: OUT/power.json, power.md
    python3 benchmarks/device/power_curve.py OUT --fit FILE # the fit alone, from a power.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import threading
import time
from pathlib import Path

N = 8192  # one GEMM: 2 N^3 = 1.1 TFLOP, ~1.6 ms at 700 TFLOP/s
DUTIES = (1.0, 0.85, 0.7, 0.55, 0.4)
PHASE_S = 4.0


class Sampler(threading.Thread):
    """NVML every `every` seconds: (t, SM MHz, W instant or averaged, W averaged, reasons, C)."""

    def __init__(self, handle, every: float = 0.004):
        super().__init__(daemon=True)
        import pynvml as nv

        self.nv, self.h, self.every, self.rows, self.stop = nv, handle, every, [], False
        try:
            nv.nvmlDeviceGetFieldValues(handle, [nv.NVML_FI_DEV_POWER_INSTANT])
            self.instant = True
        except Exception:  # older driver: the averaged reading only
            self.instant = False

    def read(self) -> tuple:
        nv, h = self.nv, self.h
        avg = nv.nvmlDeviceGetPowerUsage(h) / 1000
        inst = avg
        if self.instant:
            v = nv.nvmlDeviceGetFieldValues(h, [nv.NVML_FI_DEV_POWER_INSTANT])[0]
            if v.nvmlReturn == 0:
                inst = v.value.uiVal / 1000
        try:
            reasons = nv.nvmlDeviceGetCurrentClocksEventReasons(h)
        except Exception:
            reasons = nv.nvmlDeviceGetCurrentClocksThrottleReasons(h)
        clock = nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)
        temp = nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)
        return (time.perf_counter(), clock, inst, avg, int(reasons), temp)

    def run(self) -> None:
        while not self.stop:
            self.rows.append(self.read())
            time.sleep(self.every)


def phase(torch, name: str, seconds: float, gemm, sleep_cycles: int, sampler) -> dict:
    """Run `gemm` then a spin of `sleep_cycles` GPU cycles, over and over, for `seconds`; the
    steady state is the last 60%. -> the phase's summary (clock, power, GEMM rate, duty)."""
    t0 = time.perf_counter()
    events = []
    while time.perf_counter() - t0 < seconds:
        chunk = []
        for _ in range(16):
            e = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
            e[0].record()
            if gemm is not None:
                gemm()
            e[1].record()
            if sleep_cycles:
                torch.cuda._sleep(sleep_cycles)
            e[2].record()
            chunk.append(e)
        chunk[-1][2].synchronize()
        events.append((time.perf_counter(), chunk))
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    steady = t0 + 0.4 * (t1 - t0)
    gemm_ms, spin_ms = [], []
    for t, chunk in events:
        if t < steady:
            continue
        for a, b, c in chunk:
            gemm_ms.append(a.elapsed_time(b))
            spin_ms.append(b.elapsed_time(c))
    rows = [r for r in sampler.rows if steady <= r[0] <= t1]
    gm, sm = statistics.mean(gemm_ms), statistics.mean(spin_ms)
    out = {
        "phase": name,
        "t0": t0,
        "t1": t1,
        "samples": len(rows),
        "clock_mhz": statistics.median(r[1] for r in rows) if rows else None,
        "power_w": statistics.mean(r[2] for r in rows) if rows else None,
        "power_avg_w": statistics.mean(r[3] for r in rows) if rows else None,
        "reasons": sorted({r[4] for r in rows}),
        "temp_c": max((r[5] for r in rows), default=None),
        "gemm_ms": statistics.median(gemm_ms),
        "spin_ms": sm,
        "duty": gm / (gm + sm) if gm + sm else 0.0,
        "tflops": 2 * N**3 / (statistics.median(gemm_ms) / 1e3) / 1e12
        if gemm is not None
        else None,
    }
    print(
        f"{name:>12}: {out['clock_mhz']} MHz, {out['power_w'] or 0:.0f} W "
        f"(avg {out['power_avg_w'] or 0:.0f}), duty {out['duty']:.2f}, "
        f"{out['tflops'] or 0:.0f} TFLOP/s, reasons {out['reasons']}, {out['temp_c']} C",
        flush=True,
    )
    return out


def hold(torch, name: str, seconds: float, fn, flops: float, sampler) -> dict:
    """`fn` over and over for `seconds`, 8 calls a chunk, each chunk timed by CUDA events and
    stamped with the host's clock once it is done (the queue is one chunk deep). -> the phase
    with its chunks [(t, TFLOP/s)]."""
    t0 = time.perf_counter()
    chunks = []
    while time.perf_counter() - t0 < seconds:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(8):
            fn()
        b.record()
        b.synchronize()
        chunks.append((time.perf_counter(), 8 * flops / (a.elapsed_time(b) / 1e3) / 1e12))
    out = {"phase": name, "kind": "hold", "t0": t0, "t1": time.perf_counter(), "chunks": chunks}
    tail = [r for r in sampler.rows if r[0] > out["t1"] - seconds / 4]
    rates = [c[1] for c in chunks if c[0] > out["t1"] - seconds / 4]
    print(
        f"{name:>12}: settled {statistics.median(r[1] for r in tail)} MHz, "
        f"{statistics.mean(r[2] for r in tail):.0f} W, {statistics.median(rates):.0f} TFLOP/s",
        flush=True,
    )
    return out


def cool(seconds: float) -> None:
    time.sleep(seconds)  # the one-second average and the die cool down: the next hold starts high


def holds(torch, sampler, a, b, c) -> list[dict]:
    """The spin alone (the static power at the top clock), then bf16 and float8 GEMMs held from
    a cool start."""
    phases = [phase(torch, "spin", 3.0, None, int(1.6e-3 * 1980e6), sampler)]
    cool(5.0)
    phases.append(hold(torch, "bf16 hold", 8.0, lambda: torch.mm(a, b, out=c), 2 * N**3, sampler))
    f8 = torch.float8_e4m3fn
    a8, b8, one = a.to(f8), b.to(f8), torch.ones((), device=a.device)
    cool(5.0)
    phases.append(
        hold(
            torch,
            "fp8 hold",
            8.0,
            lambda: torch._scaled_mm(a8, b8.t(), one, one, out_dtype=torch.bfloat16),
            2 * N**3,
            sampler,
        )
    )
    return phases


def measure(out: Path, duty: bool) -> dict:
    import pynvml as nv
    import torch

    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByIndex(0)
    info = {
        "name": nv.nvmlDeviceGetName(h),
        "power_limit_w": nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1000,
        "max_sm_mhz": nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM),
        "torch": torch.__version__,
    }
    print(info, flush=True)
    sampler = Sampler(h)
    print("instant power reading:", sampler.instant, flush=True)
    sampler.start()
    dev = "cuda"
    a = torch.randn(N, N, device=dev, dtype=torch.bfloat16)
    b = torch.randn(N, N, device=dev, dtype=torch.bfloat16)
    c = torch.empty(N, N, device=dev, dtype=torch.bfloat16)

    def gemm(x=a, y=b):
        torch.mm(x, y, out=c)

    gemm()
    torch.cuda.synchronize()
    if not duty:
        phases = holds(torch, sampler, a, b, c)
    else:
        phases = duties(torch, sampler, info, a, b, gemm)
    sampler.stop = True
    sampler.join()
    res = {"info": info, "instant": sampler.instant, "phases": phases, "samples": sampler.rows}
    (out / "power.json").write_text(json.dumps(res))
    return res


def duties(torch, sampler, info, a, b, gemm) -> list[dict]:
    """The first call's method (--duty): the GEMM then a spin, at each duty; and the GEMM on
    data that switches fewer bits."""
    c = torch.empty_like(a)
    phases = []
    time.sleep(2.0)
    idle = [r for r in sampler.rows if r[0] > time.perf_counter() - 1.5]
    phases.append(
        {
            "phase": "idle",
            "clock_mhz": statistics.median(r[1] for r in idle),
            "power_w": statistics.mean(r[2] for r in idle),
            "reasons": sorted({r[4] for r in idle}),
        }
    )
    # the spin alone: cycles for ~1.6 ms at the top clock
    cycles = int(1.6e-3 * info["max_sm_mhz"] * 1e6)
    phases.append(phase(torch, "spin", 3.0, None, cycles, sampler))
    for d in DUTIES:
        spin = int(cycles * (1 - d) / d) if d < 1 else 0
        phases.append(phase(torch, f"duty {d:.2f}", PHASE_S, gemm, spin, sampler))
    # the same GEMM on data that switches fewer bits: the power of the data, at the limit
    half = a * (torch.rand_like(a) < 0.5)
    phases.append(phase(torch, "half zeros", PHASE_S, lambda: torch.mm(half, b, out=c), 0, sampler))
    zeros = torch.zeros_like(a)
    phases.append(phase(torch, "zeros", PHASE_S, lambda: torch.mm(zeros, b, out=c), 0, sampler))
    return phases


def fit(res: dict) -> list[str]:
    """The GEMM's own power at each duty's clock, and the fit P0 + k f^n by least squares over
    n (a grid) with P0 and k linear. -> report lines."""
    ph = {p["phase"]: p for p in res["phases"]}
    spin = ph["spin"]["power_w"]
    lines = [
        f"GPU {res['info']['name']}, limit {res['info']['power_limit_w']:.0f} W, top clock "
        f"{res['info']['max_sm_mhz']} MHz, instant power: {res['instant']}",
        "",
        "| phase | duty | SM MHz | power W | GEMM W | GEMM TFLOP/s | TFLOP/s per GHz | reasons |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    pts = []
    for p in res["phases"]:
        if p.get("tflops") is None:
            lines.append(
                f"| {p['phase']} | | {p['clock_mhz']} | {p['power_w']:.0f} | | | | {p['reasons']} |"
            )
            continue
        d = p["duty"]
        pg = (p["power_w"] - (1 - d) * spin) / d
        if p["phase"].startswith("duty"):
            pts.append((p["clock_mhz"] / 1e3, pg))
        lines.append(
            f"| {p['phase']} | {d:.2f} | {p['clock_mhz']} | {p['power_w']:.0f} | {pg:.0f} | "
            f"{p['tflops']:.0f} | {p['tflops'] / (p['clock_mhz'] / 1e3):.0f} | {p['reasons']} |"
        )
    lines.append("")
    fs = sorted({f for f, _ in pts})
    if len(fs) < 3:
        lines.append(f"the clock took {len(fs)} value(s) over the duties: too few to fit a curve")
        return lines
    best = None
    for n10 in range(5, 61):
        n = n10 / 10
        xs = [f**n for f, _ in pts]
        ys = [p for _, p in pts]
        mx, my = statistics.mean(xs), statistics.mean(ys)
        sxx = sum((x - mx) ** 2 for x in xs)
        k = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
        p0 = my - k * mx
        err = sum((p0 + k * x - y) ** 2 for x, y in zip(xs, ys, strict=True))
        if best is None or err < best[0]:
            best = (err, n, p0, k)
    err, n, p0, k = best
    lines.append(
        f"fit: P_gemm = {p0:.0f} W + {k:.1f} W x (f / GHz)^{n:.1f}, rms {(err / len(pts)) ** 0.5:.1f} W"
    )
    f_top = ph["duty 1.00"]["clock_mhz"] / 1e3
    for watts in (700, 600, 500, 400):
        if watts - p0 <= 0:
            continue
        f = ((watts - p0) / k) ** (1 / n)
        lines.append(
            f"- GEMM held at {watts} W: {f * 1e3:.0f} MHz, {f / f_top:.3f} of the 700 W clock "
            f"(the cube-root rule: {(watts / 700) ** (1 / 3):.3f})"
        )
    return lines


def readings(res: dict, p: dict) -> list[tuple]:
    """A hold's distinct NVML readings (the sensors change every ~100 ms): (s into the hold,
    MHz, W instant, C, TFLOP/s of the chunks done in the 100 ms before)."""
    out, last, kept = [], None, 0.0
    for t, mhz, w, _avg, _reasons, temp in res["samples"]:
        if not p["t0"] <= t <= p["t1"] or ((mhz, w) == last and t - kept < 0.1):
            continue
        last, kept = (mhz, w), t
        rates = [r for tc, r in p["chunks"] if t - 0.1 <= tc <= t]
        if rates:
            out.append((t - p["t0"], mhz, w, temp, statistics.mean(rates)))
    return out


def exponent(pts: list[tuple[float, float]]) -> tuple[float, float, float]:
    """The slope of y on x in logs, both read with noise: ordinary least squares (too low), the
    reverse regression (too high) and their geometric mean."""
    mx, my = statistics.mean(x for x, _ in pts), statistics.mean(y for _, y in pts)
    sxy = sum((x - mx) * (y - my) for x, y in pts)
    low = sxy / sum((x - mx) ** 2 for x, _ in pts)
    high = sum((y - my) ** 2 for _, y in pts) / sxy
    return low, high, math.sqrt(low * high)


def fit_holds(res: dict) -> list[str]:
    """Each hold's readings, and the exponent n of P - P_static = k f^n over them: the clock
    measured by the GEMMs' own rate over the 100 ms the power reading covers (the rate goes with
    the clock below the top clock: TFLOP/s per GHz is steady there), the first 0.15 s left out
    (the top clock, where it does not). The clock at 500 W from the bf16 GEMM's settled clock at
    the limit, with the exponent measured where that clock lands (the float8 hold's range)."""
    static = next(p for p in res["phases"] if p["phase"] == "spin")["power_w"]
    limit = res["info"]["power_limit_w"]
    lines = [
        f"GPU {res['info']['name']}, limit {limit:.0f} W, top clock {res['info']['max_sm_mhz']} MHz; "
        f"the spin alone (static power at the top clock): {static:.0f} W",
        "",
    ]
    found = {}
    for p in res["phases"]:
        if p.get("kind") != "hold":
            continue
        rows = readings(res, p)
        lines += [
            f"{p['phase']}:",
            "",
            "| s | SM MHz | W | C | TFLOP/s | TFLOP/s per GHz |",
            "|---:|---:|---:|---:|---:|---:|",
        ]
        lines += [
            f"| {t:.2f} | {f:.0f} | {w:.0f} | {c} | {r:.0f} | {r / f * 1e3:.0f} |"
            for t, f, w, c, r in rows
        ]
        used = [r for r in rows if r[0] > 0.15 and r[2] > static]
        settled = [r for r in rows if r[0] > 0.75 * (p["t1"] - p["t0"])]
        if len(used) < 5 or not settled:
            lines += ["", "too few readings to fit", ""]
            continue
        low, high, n = exponent([(math.log(r[4]), math.log(r[2] - static)) for r in used])
        f_set = statistics.median(r[1] for r in settled)
        w_set = statistics.mean(r[2] for r in settled)
        found[p["phase"]] = (n, f_set, w_set)
        clocks = sorted(r[1] for r in used)
        lines += [
            "",
            f"settled: {f_set:.0f} MHz at {w_set:.0f} W, {statistics.median(r[4] for r in settled):.0f} TFLOP/s; "
            f"exponent n = {n:.2f} ({low:.2f} to {high:.2f}) over {len(used)} readings, clocks "
            f"{clocks[len(clocks) // 10]:.0f} to {clocks[-len(clocks) // 10 - 1]:.0f} MHz (10th to 90th percentile)",
            "",
        ]
    if "bf16 hold" in found:
        n_bf16, f_set, w_set = found["bf16 hold"]
        for name, (n, _, _) in found.items():
            share = ((500 - static) / (w_set - static)) ** (1 / n)
            lines.append(
                f"- bf16 GEMM at 500 W with the {name}'s exponent {n:.2f}: {share * f_set:.0f} MHz, {share:.3f} "
                f"of its clock at {limit:.0f} W (the cube-root rule: {(500 / limit) ** (1 / 3):.3f})"
            )
    return lines


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--fit", type=Path, help="a power.json to fit, no measuring")
    ap.add_argument("--duty", action="store_true", help="the first call's duty-cycle method")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    res = json.loads(args.fit.read_text()) if args.fit else measure(args.out, args.duty)
    lines = fit_holds(res) if any(p.get("kind") == "hold" for p in res["phases"]) else fit(res)
    (args.out / "power.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
