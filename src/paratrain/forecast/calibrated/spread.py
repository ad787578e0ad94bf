"""How steady a calibration was, and what the plan does when it was not.

A calibration's step time is the median of its measured windows (result.json's step_windows_s:
the measured steps cut into up to 5 consecutive windows, each its mean step), and its spread
the windows' coefficient of variation (standard deviation / mean). On a machine that other
processes load, one process's threads wait for a thread the scheduler put aside: on 2 busy
cores `tiny_cpu`'s one-device step (2 threads) averaged 75 to 550 ms in runs minutes apart
(single steps 9 to 340 ms), while the two single-thread copies beside it held about 10 ms, so
a plan printed 650-1400% scaling. A spread above the limit is measured again (a fresh
process), at most `tries` times; then the plan goes on from the steadiest try only when asked
(--allow-noisy), else it refuses in one line. Threads that wait steadily (the spread small, the
step still far slower than at one thread) are caught by starved().

Unless --allow-noisy, a calibration is watched window by window as it runs (calibrate.py): at
the first window after which its spread is above the limit whatever the windows still to come
measure (certain_noisy), it is stopped. On a machine that was loaded before the plan began
(load_note) that first noisy window refuses the plan: another try would wait on the same
processes. Under load a plan was refused after 2 min 47 s of tries; now it is refused seconds
into its first noisy calibration."""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable

from paratrain.errors import UserError

LIMIT = 0.25
"""The largest coefficient of variation of a calibration's windows taken as steady: on the
shared 2-core machine, single-thread calibrations of 5 steps (windows of one step) spread
15-29%, threads waiting for cores 66-117%."""
TRIES = 3


def of_windows(windows: list[float]) -> tuple[float, float]:
    """-> (the median window's step, the windows' coefficient of variation; 0 for fewer than
    two windows)."""
    if not windows:
        raise UserError("plan: the calibration run measured no steps after its warm-up")
    median = statistics.median(windows)
    if len(windows) < 2:
        return median, 0.0
    return median, statistics.pstdev(windows) / max(statistics.fmean(windows), 1e-12)


def certain_noisy(windows: list[float], total: int, limit: float = LIMIT) -> bool:
    """The first `windows` of a calibration's `total` spread so that all of them will spread
    above `limit` whatever the rest measure. The rest lower the spread most when each equals
    the windows' mean; then the variance is k/total of the k windows' (the mean unchanged), so
    the spread is theirs times sqrt(k / total)."""
    k = len(windows)
    if k < 2 or total < k:
        return False
    return of_windows(windows)[1] * (k / total) ** 0.5 > limit


def load_note(cores: int) -> str | None:
    """A line when other processes kept this machine busy over the last minute (the load
    average at or above half its cores), None when quiet or unknown."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # not on every platform
        return None
    if load < max(1.0, cores / 2):
        return None
    return f"load average {load:.1f} on {cores} cores: other processes are running here"


def steady(
    measure: Callable[[int], dict],
    what: str,
    *,
    tries: int = TRIES,
    limit: float = LIMIT,
    allow_noisy: bool = False,
    load: str | None = None,
    say: Callable[[str], None] = print,
) -> dict:
    """measure(try number, from 1) -> a calibration's result.json whose summary holds
    `spread` (its windows' coefficient of variation; `stopped_at`: [windows measured, of how
    many] where the watch stopped it at its first noisy window), repeated until the spread is
    at most `limit`, at most `tries` times. -> the steady result, or with allow_noisy the
    steadiest (its summary's `tries` and `noisy` say so); else a UserError naming the flag, at
    once where the machine was loaded (`load`: load_note as read before any calibration;
    afterwards it counts ours), else after the last try."""
    results = []
    for attempt in range(1, tries + 1):
        result = measure(attempt)
        s = result["summary"]
        s["tries"] = attempt
        if s["spread"] <= limit:
            s["noisy"] = False
            return result
        results.append(result)
        if not allow_noisy and load:  # another try would wait on the same processes
            raise UserError(_too_noisy(what, s, limit, load, "in its first try"))
        if attempt < tries:
            say(
                f"plan: {what}: its step spread {s['spread']:.0%} over its windows (above "
                f"{limit:.0%}): measuring again ({attempt + 1}/{tries})"
            )
    best = min(results, key=lambda r: r["summary"]["spread"])
    if not allow_noisy:
        when = f"or more in each of {tries} tries"
        raise UserError(_too_noisy(what, best["summary"], limit, load, when))
    spread = best["summary"]["spread"]
    why = (
        f"{what} spread {spread:.0%} or more in each of {tries} tries (steady: {limit:.0%} or less)"
    )
    best["summary"]["noisy"] = True
    say(f"plan: noisy machine: {why}; planning from the steadiest try (--allow-noisy)")
    return best


def _too_noisy(what: str, s: dict, limit: float, load: str | None, when: str) -> str:
    """The refusal's one line: which calibration, how far it ran, its windows' spread."""
    stopped = s.get("stopped_at")
    ran = (
        f" (stopped after window {stopped[0]} of {stopped[1]}: above {limit:.0%} whatever the "
        "rest measure)"
        if stopped
        else ""
    )
    windows = ", ".join(f"{w * 1000:,.1f}" for w in s.get("step_windows_s") or [])
    return (
        f"plan: this machine is too noisy to calibrate on: {what} spread {s['spread']:.0%} "
        f"{when}{ran}"
        + (f", its windows' steps {windows} ms" if windows else "")
        + f" (steady: {limit:.0%} or less)"
        + (f"; {load}" if load else "")
        + ". Plan on a quiet machine, or pass --allow-noisy to plan from the steadiest try"
    )


STARVED = 2.0
"""One process's several threads slower than one thread by this factor: they waited for cores
(a quiet machine's small-model threads cost at most tens of percent)."""


def starved(many_s: float, one_s: float, threads: int, load: str | None) -> str | None:
    """The one-device step at `threads` threads (many_s) against one thread (one_s) -> a line
    when the threads waited for cores other processes hold, else None."""
    if many_s <= STARVED * one_s:
        return None
    return (
        f"one device's step took {many_s * 1000:,.1f} ms at {threads} threads and "
        f"{one_s * 1000:,.1f} ms at 1: its threads waited for cores that other processes hold"
        + (f" ({load})" if load else "")
        + ", so the one-device step and every scaling figure against it are wrong here. Plan "
        "on a quiet machine, or with --set launch.cpu_threads=1"
    )
