"""plan's formulas against hand-computed cases (issue 18): each number below is worked out in
the comment beside it, so a changed formula fails here."""

import pytest

from paratrain.plan.model import (
    Calibration,
    bubble,
    comm_bytes,
    memory_per_gpu,
    ring,
    scaling_efficiency,
    shard,
    step_time,
)

# 100 M fp32 parameters, AdamW: 400 MB of weights, 400 MB of gradients, 800 MB of moments
CAL = Calibration(
    forward_s=0.1,
    backward_s=0.2,
    optimizer_s=0.02,
    params=100_000_000,
    activation_bytes=2e9,
    largest_block_params=10_000_000,
)


def test_ring_and_shard_factors():
    assert ring(1) == 0 and ring(2) == 1.0 and ring(8) == 1.75
    assert shard(1) == 0 and shard(4) == 0.75


def test_communication_volumes():
    assert comm_bytes("ddp", CAL, 8) == 1.75 * 400e6  # 2(N-1)/N x gradient bytes
    assert comm_bytes("fsdp", CAL, 8) == pytest.approx(0.875 * (2 * 400e6 + 400e6))
    assert comm_bytes("local_sgd", CAL, 8, every=16) == 1.75 * 400e6 / 16
    with pytest.raises(ValueError, match="no communication model"):
        comm_bytes("tp", CAL, 2)


def test_ddp_hides_what_the_backward_covers():
    # 8 GPUs over 100 GB/s: 700 MB / 100 GB/s = 7 ms, inside the 200 ms backward; the last
    # 25 MiB bucket (x 1.75 / 100 GB/s = 0.459 ms) stays exposed
    t = step_time("ddp", CAL, 8, 100.0)
    assert t["comm_s"] == pytest.approx(0.007)
    assert t["exposed_s"] == pytest.approx(25 * 2**20 * 1.75 / 100e9)
    # over 1 GB/s: 700 ms of all-reduce, 500 ms past the backward, plus the last bucket
    slow = step_time("ddp", CAL, 8, 1.0)
    assert slow["exposed_s"] == pytest.approx(0.5 + 25 * 2**20 * 1.75 / 1e9)
    assert step_time("ddp", CAL, 1, 1.0)["step_s"] == pytest.approx(0.32)  # nothing to send


def test_fsdp_and_averaging_exposure():
    # FSDP over 8 at 2 GB/s: 1.05 GB -> 0.525 s, 0.3 s hidden under forward + backward
    assert step_time("fsdp", CAL, 8, 2.0)["exposed_s"] == pytest.approx(0.225)
    # local SGD every 16 at 1 GB/s: 700 MB / 16 / 1 GB/s = 43.75 ms, all of it exposed
    assert step_time("local_sgd", CAL, 8, 1.0, every=16)["exposed_s"] == pytest.approx(0.04375)


def test_memory_per_gpu():
    assert memory_per_gpu("ddp", CAL, 8) == pytest.approx(1.6e9 + 2e9)
    # a 1/8 shard of 1.6 GB, two gathered blocks of 10 M x 8 bytes, the activations
    assert memory_per_gpu("fsdp", CAL, 8) == pytest.approx(0.2e9 + 0.16e9 + 2e9)


def test_pipeline_bubble_and_efficiency():
    assert bubble(4, 12) == pytest.approx(3 / 15)
    assert bubble(1, 8) == 0
    assert scaling_efficiency("ddp", CAL, 8, 1.0) == pytest.approx(
        0.32 / (0.32 + 0.5 + 25 * 2**20 * 1.75 / 1e9)
    )
