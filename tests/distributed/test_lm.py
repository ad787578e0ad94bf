"""LoRA fine-tuning on 2 CPU processes (gloo): DDP and FSDP2."""

import json

import pytest
import torch
from conftest import (
    adapter_logits,
    final_weights,
    lm_settings,
    max_abs_diff,
    read_result,
    run_cli,
    write_alpaca,
)

pytestmark = pytest.mark.dist

# 48 examples, 10% held out: 43 training rows, 5 steps of 2 x 4 an epoch; 10 steps are 2 epochs.
TWO_EPOCHS = ["train.max_steps=10", "data.val_fraction=0.1"]


def run_lm(tmp_path, name, data, *extra):
    out = tmp_path / name
    sets = [a for s in lm_settings(data) + list(extra) for a in ("--set", s)]
    run_cli(["run", *sets, "--nproc", "2", "--output-dir", out])
    return out


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_alpaca(tmp_path_factory.mktemp("data") / "alpaca.json", n=48)


@pytest.fixture(scope="module")
def ddp(tmp_path_factory, data):
    """One DDP run for two tests: its own checks, and the reference FSDP is held to."""
    return run_lm(tmp_path_factory.mktemp("lm"), "ddp", data, "strategy=ddp-ds", *TWO_EPOCHS)


def test_ddp_lora_two_epochs_loss_falls_adapter_reloads(ddp):
    result = read_result(ddp)
    losses = [e["train_loss"] for e in result["epochs"]]
    assert result["world_size"] == 2 and len(losses) >= 2 and losses[-1] < losses[0], losses
    assert all("lora_" in k for k in final_weights(ddp))  # only the adapters train (and are saved)
    loaded, from_ckpt, plain = adapter_logits(ddp)
    torch.testing.assert_close(loaded, from_ckpt)
    assert (loaded - plain).abs().max() > 1e-4


def test_fsdp_matches_ddp(tmp_path, data, ddp):
    fsdp = run_lm(tmp_path, "fsdp", data, "strategy=fsdp", *TWO_EPOCHS)
    r = read_result(fsdp)
    assert r["strategy"] == "fsdp" and r["summary"]["optimizer_steps"] == 10
    # Same data order, same initial weights, fp32: sharded and replicated training agree to
    # rounding, and so does the held-out loss (under FSDP every rank runs every eval forward).
    assert max_abs_diff(final_weights(fsdp), final_weights(ddp)) < 1e-5
    a, b = (read_result(run)["epochs"][-1]["val_loss"] for run in (fsdp, ddp))
    assert abs(a - b) < 1e-5 * abs(b), (a, b)
    loaded, from_ckpt, _ = adapter_logits(fsdp)
    torch.testing.assert_close(loaded, from_ckpt)


def test_fp16_lora_with_loss_scaling_under_fsdp(tmp_path, data):
    """FSDP2's fp16 mixed precision (sharded gradients, one loss scale over all ranks) with
    LoRA. fp16 loss scaling under ddp-ds is test_strategies.py's
    test_fp16_and_bf16_train_on_cpu_processes."""
    out = run_lm(
        tmp_path,
        "fsdp",
        data,
        "strategy=fsdp",
        "precision=fp16",
        "train.max_steps=4",
        "train.eval=false",
    )
    s = read_result(out)["summary"]
    assert s["optimizer_steps"] == 4 and s["loss_scale"] is not None and s["tokens_per_s"] > 0


def test_delayed_fp8_lora_under_ddp_tracks_the_high_precision_run(tmp_path, data, ddp):
    """model.fp8=delayed (+ lm_head in float8) under DDP, end to end: it trains like the
    high-precision DDP run above, within float8's rounding (each rank's histories its own:
    test_buffers.py)."""
    pytest.importorskip("torchao")
    out = run_lm(
        tmp_path,
        "delayed",
        data,
        "strategy=ddp-ds",
        "model.fp8=delayed",
        "model.fp8_lm_head=true",
        *TWO_EPOCHS,
    )
    r, ref = read_result(out), read_result(ddp)
    assert r["workload"]["fp8"] == "delayed" and r["summary"]["optimizer_steps"] == 10
    losses = [e["train_loss"] for e in r["epochs"]]
    assert losses[-1] < losses[0], losses
    a, b = r["epochs"][-1]["val_loss"], ref["epochs"][-1]["val_loss"]
    assert a != b and abs(a - b) < 0.02 * b, (a, b)


def test_fused_adapters_under_ddp_match_peft_layers(tmp_path, data, ddp):
    """lora.fused (models/causal_lm/lora_matmul.py: each adapter's product inside its base
    matmul, its own backward) under DDP's bucketed all-reduce: the same training as peft's
    layers in the run above (the CPU's auto keeps peft's), to fp32 rounding."""
    fused = run_lm(tmp_path, "fused", data, "strategy=ddp-ds", "lora.fused=true", *TWO_EPOCHS)
    plan = json.loads((fused / "plan.json").read_text())
    assert {"key": "lora.fused", "value": True, "reason": "as set", "by": "set"} in plan["levers"]
    assert max_abs_diff(final_weights(fused), final_weights(ddp)) < 1e-5
    a, b = (read_result(run)["epochs"][-1]["train_loss"] for run in (fused, ddp))
    assert abs(a - b) < 1e-5 * abs(b), (a, b)
