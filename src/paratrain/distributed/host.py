"""Facts of this host that several parts ask: the cores this process may run on."""

from __future__ import annotations

import os


def cores() -> int:
    """The cores this process may run on (its affinity, as taskset or a container sets it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1
