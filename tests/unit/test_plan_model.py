"""plan's formulas against hand-computed cases (issue 18): each number below is worked out in
the comment beside it, so a changed formula fails here."""

import pytest

from paratrain.forecast.calibrated.model import (
    Calibration,
    Links,
    bubble,
    comm_bytes,
    hsdp_step,
    memory_per_gpu,
    model_parallel,
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
        comm_bytes("zero-7", CAL, 2)


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


def test_lora_sends_only_the_trained_gradients():
    # 100 M weights, 1 M trained: DDP all-reduces 4 MB x 2(N-1)/N; FSDP still gathers all
    lora = Calibration(0.1, 0.2, 0.01, params=100_000_000, trainable=1_000_000)
    assert comm_bytes("ddp", lora, 2) == 4e6
    assert comm_bytes("fsdp", lora, 2) == pytest.approx(0.5 * (800e6 + 4e6))
    assert lora.state_bytes == 400e6 + 1e6 * 12


def test_bf16_weights_send_fp32_gradients_under_ddp():
    # train.bf16_weights: 2-byte gradients held (memory), 4 bytes a gradient in DDP's sum
    from paratrain.forecast.calibrated.calibrate import ddp_wire_bytes

    wide = ddp_wire_bytes(
        {"train": {"bf16_weights": True}, "ddp": {"gradient_compression": "none"}}
    )
    assert wide == 4.0
    sent_bf16 = {"train": {"bf16_weights": True}, "ddp": {"gradient_compression": "bf16"}}
    assert ddp_wire_bytes(sent_bf16) == 2.0
    assert ddp_wire_bytes({"train": {"bf16_weights": False}}) is None
    bf16 = Calibration(0.1, 0.2, 0.01, params=100_000_000, grad_bytes=2.0, wire_bytes=wide)
    assert comm_bytes("ddp", bf16, 2) == 400e6  # 100 M x 4 bytes x 2(N-1)/N
    assert bf16.state_bytes == 400e6 + 100e6 * (2 + 8)  # the 2-byte gradients in memory


# a causal LM: 4 layers, hidden 1024, 2 x 2048 tokens per step in bf16
LM = Calibration(
    forward_s=0.1,
    backward_s=0.2,
    optimizer_s=0.02,
    params=50_000_000,
    layers=4,
    hidden=1024,
    tokens_per_micro=2048,
    micro_batches=2,
    activation_bytes=4e9,
)


def test_tensor_parallel_collectives_and_split():
    # per layer and micro-batch 4 x 2048 x 1024 x 2 bytes = 16.78 MB, x ring(2) = 1, x 4 layers
    # x 2 micro-batches = 134.2 MB; over 10 GB/s 13.4 ms, all exposed
    assert comm_bytes("tp", LM, 2) == 4 * 2048 * 1024 * 2 * 4 * 2
    t = model_parallel("tp", LM, 2, 10.0)
    assert t["comm_s"] == pytest.approx(4 * 2048 * 1024 * 2 * 8 / 10e9)
    assert t["step_s"] == pytest.approx(0.32 / 2 + t["comm_s"])
    assert t["memory_bytes"] == pytest.approx(LM.state_bytes / 2 + 4e9)


def test_pipeline_step_and_memory():
    # 4 stages, 4 micro-batches: (0.3 / 4) x 7/4 + 0.02 / 4 = 0.13125 + 0.005
    t = model_parallel("pp", LM, 4, 10.0, m=4)
    assert t["step_s"] == pytest.approx(0.3 / 4 * 7 / 4 + 0.005)
    # a stage: 1/4 of the state, 4 micro-batches of 1/4 of the batch over 1/4 of the layers
    assert t["memory_bytes"] == pytest.approx(LM.state_bytes / 4 + 4e9 * 4 / 16)
    with pytest.raises(ValueError):
        model_parallel("ddp", LM, 2, 1.0)


def test_hsdp_and_links_across_nodes():
    links = Links(100.0, 10.0, per_node=8)
    assert links.bus(8) == 100.0 and links.bus(16) == 10.0
    measured = Links(2.0, None, per_node=4, measured=((2, 1.0), (4, 0.5)))
    assert measured.bus(2) == 1.0 and measured.bus(3) == 1.0 and measured.bus(4) == 0.5
    # 16 GPUs = 2 nodes of 8: FSDP over 8 at 100 GB/s (0.875 x 1.2 GB = 1.05 GB -> 10.5 ms),
    # the gradient shard (400 MB / 8) all-reduced over 2 nodes at 10 GB/s (x ring(2) = 1: 5 ms)
    t = hsdp_step(CAL, 16, links)
    assert t["comm_s"] == pytest.approx(0.0105 + 0.005)
    assert t["exposed_s"] == 0.0  # inside the 300 ms forward + backward
    assert t["memory_bytes"] == pytest.approx(1.6e9 / 8 + 0.16e9 + 2e9)
