"""The simulated slow link: its arithmetic, and a DDP hook whose buckets complete only once
their payload would have crossed the link (the gradients unchanged)."""

import time

import pytest
import torch
from torch import nn

from paratrain.parallel.slowlink import SlowLink


def test_seconds_and_hold():
    link = SlowLink(0.008)  # 1 MB/s
    assert link.seconds(250_000) == pytest.approx(0.25)
    t0 = time.perf_counter()
    link.hold(t0 - 0.2, 250_000)  # 0.2 s already passed: 0.05 s left
    assert 0.04 < time.perf_counter() - t0 < 0.2
    t1 = time.perf_counter()
    link.hold(t1 - 1.0, 250_000)  # long done: no wait
    assert time.perf_counter() - t1 < 0.01


def test_wrapped_hook_delays_backward_and_keeps_gradients(one_rank_group):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    x = torch.randn(8, 100)

    def backward_s(link):
        torch.manual_seed(0)
        model = nn.parallel.DistributedDataParallel(nn.Linear(100, 10))  # 1,010 fp32: 4,040 B
        hook = default_hooks.allreduce_hook
        if link is not None:
            hook = link.wrap_hook(hook, None)
        model.register_comm_hook(None, hook)
        t0 = time.perf_counter()
        model(x).pow(2).sum().backward()
        return time.perf_counter() - t0, model.module.weight.grad.clone()

    _, fast = backward_s(None)
    slow_s, slow = backward_s(SlowLink(4040 * 8 / 0.3 / 1e9))  # the bucket takes 0.3 s
    assert torch.equal(fast, slow)
    assert slow_s >= 0.29  # the hook held the bucket for its simulated transfer (a lower bound)
