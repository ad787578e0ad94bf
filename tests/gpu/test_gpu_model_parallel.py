"""Model parallelism for language models on CUDA (NCCL). One GPU cannot show speed; these run the
NCCL, DTensor and DCP paths on a degenerate mesh (strategy=tp over one rank: every projection a
one-shard DTensor, loss_parallel on one shard) and compare with a plain run. The 2-GPU tests run
tensor and pipeline parallelism for real where two GPUs are lent. Marked `gpu`."""

import pytest
import torch
from conftest import final_weights, max_abs_diff, read_result, run_cli

pytestmark = pytest.mark.gpu
two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")

LM = [
    "data.source=synthetic-text",
    "model.init=random",
    "model.shape=tiny",
    "device=cuda",
    "data.num_workers=0",
    "data.max_length=64",
    "data.batch_size=4",
    "train.max_steps=4",
    "train.warmup_steps=1",
    "train.lr=0.01",
    "train.optimizer=sgd",
    "log.progress=false",
]
# fp32 with TF32 off. SGD, not AdamW: sdpa's fp32 backward on CUDA (memory-efficient attention)
# adds in a varying order, and AdamW's division by the gradient's own size turns such noise in
# a near-zero gradient into steps of up to lr (two plain runs differ by ~1e-2 after 4 AdamW
# steps on the H200, 2026-12-01); SGD keeps it at rounding.
TOL = 1e-4


def run(tmp_path, name, *settings, nproc=None):
    out = tmp_path / name
    args = ["run", *[a for s in [*LM, *settings] for a in ("--set", s)], "--output-dir", out]
    run_cli(args + (["--nproc", nproc] if nproc else []))
    return out


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_tensor_parallel_over_one_gpu_matches_a_plain_run(tmp_path, lora):
    plain = run(tmp_path, "plain", f"lora.enabled={lora}")
    tp = run(tmp_path, "tp", "strategy=tp", f"lora.enabled={lora}", "checkpoint.every_steps=2")
    r = read_result(tp)
    assert r["backend"] == "nccl" and r["strategy"] == "tp" and r["parallel"]["tp"] == 1
    assert max_abs_diff(final_weights(tp), final_weights(plain)) < TOL
    # the DCP checkpoint written over NCCL resumes in a plain process
    mid = tp / "checkpoints" / "step_00000002"
    again = run(tmp_path, "again", f"lora.enabled={lora}", f"checkpoint.resume={mid}")
    assert read_result(again)["summary"]["steps_this_run"] == 2
    assert max_abs_diff(final_weights(again), final_weights(tp)) < TOL


def test_bf16_tensor_parallel_trains(tmp_path):
    out = run(tmp_path, "bf16", "strategy=tp", "precision=bf16", "train.max_steps=8")
    s = read_result(out)["summary"]
    assert s["optimizer_steps"] == 8 and s["tokens_per_s"] > 0 and s["train_loss"] < 6.0


def test_layer_split_over_the_gpus_matches_a_plain_run(tmp_path):
    plain = run(tmp_path, "plain", "lora.enabled=false")
    split = run(tmp_path, "split", "strategy=split", "lora.enabled=false")
    r = read_result(split)
    n = torch.cuda.device_count()
    assert len(r["parallel"]["split"]["devices"]) == n
    assert r["parallel"]["split"]["idle_fraction_per_device"] == pytest.approx((n - 1) / n)
    assert max_abs_diff(final_weights(split), final_weights(plain)) < TOL


@two_gpus
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_tensor_parallel_on_two_gpus_matches_one(tmp_path, lora):
    plain = run(tmp_path, "plain", f"lora.enabled={lora}")
    tp = run(tmp_path, "tp", "parallel.tp=2", f"lora.enabled={lora}", nproc=2)
    assert max_abs_diff(final_weights(tp), final_weights(plain)) < TOL


@two_gpus
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_pipeline_of_decoder_layers_on_two_gpus_matches_one(tmp_path, schedule):
    plain = run(tmp_path, "plain", "lora.enabled=false")
    pp = run(
        tmp_path,
        "pp",
        "parallel.pp=2",
        f"pipeline.schedule={schedule}",
        "pipeline.microbatches=2",
        "lora.enabled=false",
        nproc=2,
    )
    assert max_abs_diff(final_weights(pp), final_weights(plain)) < TOL
