"""Where the host waits for the GPU during the profiled steps: torch's CUDA sync debug mode
(torch.cuda.set_sync_debug_mode("warn")) raises a warning at each implicitly synchronizing call
(.item(), a copy to pageable memory, a stream's synchronize ...), and torch.cuda.synchronize,
which that mode leaves out, is wrapped for the window; SyncSites counts them by the Python line
that made them. A sync drains the GPU's queue: the GPU then idles while the host launches the
next work, so a steady-state step should have none (a step log's clock read at every point was
one: 2026-12-03, MobileNetV2 on one H200). Not listed: waits on an event (the loop's lagged
reads wait on a step already done) and torch.distributed's."""

from __future__ import annotations

import traceback
import warnings
from collections import Counter
from pathlib import Path

import torch

MESSAGE = "synchronizing CUDA operation"  # torch's warning text (c10/cuda warn_or_error_on_sync)
OWN = str(Path(__file__).resolve().parents[1])  # paratrain's source: the line a site is named by
SKIP = (warnings.__file__, __file__)  # the frames between the sync and the recorder


def site(frames: list[traceback.FrameSummary]) -> str:
    """A sync's place: the innermost frame in paratrain's source (the call paratrain made),
    and, when that is not the innermost frame, the innermost one too (the library's line)."""
    frames = [f for f in frames if f.filename not in SKIP]
    if not frames:
        return "?"

    def name(f: traceback.FrameSummary) -> str:
        path = f.filename
        if path.startswith(OWN):
            path = "paratrain" + path[len(OWN) :]
        return f"{path}:{f.lineno} {f.name}"

    ours = [f for f in frames if f.filename.startswith(OWN)]
    inner = frames[-1]
    if not ours or ours[-1] is inner:
        return name(inner)
    return f"{name(ours[-1])} -> {name(inner)}"


class SyncSites:
    """start() / stop() around the profiled steps (profiling.StepProfiler); counts by site."""

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self.counts: Counter[str] = Counter()
        self._catch: warnings.catch_warnings | None = None

    def start(self) -> None:
        if not self.cuda or self._catch is not None:
            return
        self._catch = warnings.catch_warnings()
        self._catch.__enter__()
        warnings.filterwarnings("always", message=f".*{MESSAGE}")
        shown = warnings.showwarning

        def record(message, category, filename, lineno, file=None, line=None):
            if MESSAGE in str(message):
                self.counts[site(traceback.extract_stack()[:-1])] += 1
            else:
                shown(message, category, filename, lineno, file, line)

        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        self._synchronize = explicit = torch.cuda.synchronize

        def synchronize(device=None):
            self.counts[site(traceback.extract_stack()[:-1])] += 1
            return explicit(device)

        torch.cuda.synchronize = synchronize

    def stop(self) -> None:
        if self._catch is None:
            return
        torch.cuda.synchronize = self._synchronize
        torch.cuda.set_sync_debug_mode("default")
        self._catch.__exit__(None, None, None)  # warnings' filters and showwarning as before
        self._catch = None

    def text(self, steps: int) -> str:
        """The sites as profile.txt lists them, most frequent first."""
        if not self.cuda:
            return ""
        total = sum(self.counts.values())
        lines = [f"host syncs (the host waiting for the GPU) per step: {total / steps:.1f}"]
        for where, n in self.counts.most_common(12):
            lines.append(f"  {n / steps:6.1f}  {where}")
        return "\n".join(lines) + "\n"
