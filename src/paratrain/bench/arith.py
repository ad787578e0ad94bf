"""The report's arithmetic, stated once (and printed in every report):

- speedup(N) = unique-sample throughput on N processes / on 1, at equal precision and per-GPU batch;
- scaling efficiency = speedup(N) / N;
- with repeats, the median and the min-max of the repeats.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Stat:
    median: float
    low: float
    high: float
    n: int

    def fmt(self, digits: int = 0, scale: float = 1.0) -> str:
        m = f"{self.median * scale:,.{digits}f}"
        if self.n < 2:
            return m
        return f"{m} [{self.low * scale:,.{digits}f}-{self.high * scale:,.{digits}f}]"


def stat(values: Sequence[float]) -> Stat | None:
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    return Stat(statistics.median(vals), min(vals), max(vals), len(vals))


def speedup(throughput_n: float, throughput_1: float) -> float:
    return throughput_n / throughput_1


def efficiency(speedup_n: float, n: int) -> float:
    return speedup_n / n


SPREAD = 0.2
"""Repeats whose max - min exceeds this share of their median are flagged."""


def suspect(speedup_n: float | None, n: int, *stats: Stat | None) -> str:
    """A figure to distrust, said in the table itself: a speedup above the ideal N (more than
    1% over: superlinear scaling is a measurement problem until explained), or repeats that
    spread widely."""
    notes = []
    if speedup_n is not None and speedup_n > n * 1.01:
        notes.append(f"above the ideal {n}x: suspect")
    for st in stats:
        if st is not None and st.n >= 2 and (st.high - st.low) > SPREAD * st.median:
            notes.append(f"repeats spread {(st.high - st.low) / st.median:.0%}")
            break
    return f" ⚠ {'; '.join(notes)}" if notes else ""


def time_for(samples: int, throughput: float) -> float:
    """Seconds to process `samples` unique samples at a measured throughput."""
    return samples / throughput
