"""A simulated slow link (sync.simulated_gbps): every collective of the gradient / parameter
sync paths completes no sooner than its payload / the link's rate after it started. A CPU
stand-in for a network between nodes, so a table on one machine shows where each way of
agreeing (parallel/sync.py) starts to pay; every result that used it says so
(summary.communication.simulated_gbps). A simulation: real links also have latency, congestion
and NCCL's algorithms, none of which this models.

The delay keeps each collective's overlap as it is: DDP's bucket all-reduce completes on a
timer thread (the backward goes on meanwhile), stale-1's all-reduce is waited for a step later,
local SGD's and DiLoCo's averaging block the step as their real collectives do."""

from __future__ import annotations

import threading
import time

import torch


class SlowLink:
    def __init__(self, gbps: float):
        self.gbps = gbps
        self.bytes_per_s = gbps * 1e9 / 8

    def seconds(self, nbytes: float) -> float:
        return nbytes / self.bytes_per_s

    def hold(self, started: float, nbytes: float) -> None:
        """Sleep until `nbytes` would have crossed the link since `started` (perf_counter)."""
        left = started + self.seconds(nbytes) - time.perf_counter()
        if left > 0:
            time.sleep(left)

    def wrap_hook(self, hook, per_element: float | None, wire: float = 1.0):
        """A DDP communication hook whose future completes once the bucket's payload (its
        elements x `per_element` bytes as sent; the bucket's own dtype when None) times `wire`
        (what the collective puts on each rank's link per payload byte: 2(N-1)/N for a ring
        all-reduce, N-1 for an all-gather) would have crossed the link, and not before the real
        collective. CPU only: this future carries no CUDA stream order (setup refuses GPUs)."""

        def slow(state, bucket):
            started = time.perf_counter()
            buf = bucket.buffer()
            size = buf.numel() * (per_element or buf.element_size()) * wire
            inner = hook(state, bucket)
            out: torch.futures.Future = torch.futures.Future()

            def done(fut) -> None:
                left = started + self.seconds(size) - time.perf_counter()
                try:
                    value = fut.value()
                except Exception as e:  # the collective failed: hand DDP the error now
                    out.set_exception(e)
                    return
                if left <= 0:
                    out.set_result(value)
                else:
                    threading.Timer(left, out.set_result, args=(value,)).start()

            inner.add_done_callback(done)
            return out

        return slow
