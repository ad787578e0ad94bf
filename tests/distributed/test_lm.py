"""LoRA fine-tuning on 2 CPU processes (gloo): DDP and FSDP2."""

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


def run_lm(tmp_path, name, data, *extra):
    out = tmp_path / name
    sets = [a for s in lm_settings(data) + list(extra) for a in ("--set", s)]
    run_cli(["run", *sets, "--nproc", "2", "--output-dir", out])
    return out


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_alpaca(tmp_path_factory.mktemp("data") / "alpaca.json", n=96)


def test_ddp_lora_20_steps_loss_falls_adapter_reloads(tmp_path, data):
    out = run_lm(
        tmp_path, "ddp", data, "strategy=ddp-ds", "train.max_steps=20", "data.val_fraction=0.1"
    )
    result = read_result(out)
    losses = [e["train_loss"] for e in result["epochs"]]
    assert result["world_size"] == 2 and len(losses) >= 2 and losses[-1] < losses[0], losses
    assert all("lora_" in k for k in final_weights(out))  # only the adapters train (and are saved)
    loaded, from_ckpt, plain = adapter_logits(out)
    torch.testing.assert_close(loaded, from_ckpt)
    assert (loaded - plain).abs().max() > 1e-4


def test_fsdp_matches_ddp(tmp_path, data):
    common = ["train.max_steps=6", "train.eval=false"]
    ddp = run_lm(tmp_path, "ddp", data, "strategy=ddp-ds", *common)
    fsdp = run_lm(tmp_path, "fsdp", data, "strategy=fsdp", *common)
    r = read_result(fsdp)
    assert r["strategy"] == "fsdp" and r["summary"]["optimizer_steps"] == 6
    # Same data order, same initial weights, fp32: sharded and replicated training agree to rounding.
    assert max_abs_diff(final_weights(fsdp), final_weights(ddp)) < 1e-5
    loaded, from_ckpt, _ = adapter_logits(fsdp)
    torch.testing.assert_close(loaded, from_ckpt)


@pytest.mark.parametrize("strategy", ["ddp-ds", "fsdp"])
def test_fp16_lora_with_loss_scaling(tmp_path, data, strategy):
    out = run_lm(
        tmp_path,
        strategy,
        data,
        f"strategy={strategy}",
        "precision=fp16",
        "train.max_steps=4",
        "train.eval=false",
    )
    s = read_result(out)["summary"]
    assert s["optimizer_steps"] == 4 and s["loss_scale"] is not None and s["tokens_per_s"] > 0
