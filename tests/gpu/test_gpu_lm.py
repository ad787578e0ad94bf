"""Language-model fine-tuning on CUDA: LoRA in bf16 with DDP and FSDP2, packing under sdpa.
Marked `gpu`: skipped without CUDA; run on the lent GPU machine."""

import pytest
import torch
from conftest import lm_settings, read_result, run_cli, write_alpaca

pytestmark = pytest.mark.gpu
two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")


def gpu_settings(data):
    return [s.replace("device=cpu", "device=cuda") for s in lm_settings(data)] + ["precision=bf16"]


def test_packed_examples_do_not_attend_to_each_other_on_cuda():
    from paratrain.data.text import data as lmdata
    from paratrain.models.causal_lm.build import build_causal_lm

    torch.manual_seed(0)
    model = build_causal_lm(None, "random", "tiny", "sdpa", torch.float32).cuda().eval()
    model.config.use_cache = False
    a, b = [256, 10, 11, 12, 13], [256, 20, 21, 22]
    ((ids, _, pos, _),) = lmdata.pack([(a, a), (b, b)], 9, pad_id=258)
    with torch.no_grad():
        packed = model(
            input_ids=torch.tensor([ids]).cuda(), position_ids=torch.tensor([pos]).cuda()
        ).logits[0]
        alone = model(input_ids=torch.tensor([b]).cuda()).logits[0]
    torch.testing.assert_close(packed[5:9], alone, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("strategy", ["ddp-ds", pytest.param("fsdp", marks=two_gpus)])
def test_bf16_lora_on_gpus(tmp_path, strategy):
    data = write_alpaca(tmp_path / "alpaca.json", n=96)
    nproc = min(2, torch.cuda.device_count())
    sets = [
        a
        # on one GPU DDP over NCCL all the same (the plan would run one rank in one process)
        for s in gpu_settings(data)
        + [f"strategy={strategy}", "train.max_steps=12", "launch.one_process=false"]
        for a in ("--set", s)
    ]
    out = tmp_path / "run"
    run_cli(["run", *sets, "--nproc", nproc, "--output-dir", out])
    r = read_result(out)
    s = r["summary"]
    assert r["backend"] == "nccl" and s["optimizer_steps"] == 12 and s["tokens_per_s"] > 0
    assert s["peak_memory_kind"] == "cuda_max_allocated" and s["mfu"] is not None
    telemetry = s["gpu_telemetry"]  # one summary per rank, from NVML
    assert len(telemetry) == nproc and all(t["sm_clock_mhz_mean"] > 0 for t in telemetry)
    assert (out / "adapter" / "adapter_config.json").is_file()


@pytest.mark.parametrize("strategy", ["ddp-ds", pytest.param("fsdp", marks=two_gpus)])
def test_regional_compile_with_chunked_loss_on_gpus(tmp_path, strategy):
    data = write_alpaca(tmp_path / "alpaca.json", n=96)
    nproc = min(2, torch.cuda.device_count())
    settings = gpu_settings(data) + [
        f"strategy={strategy}",
        "train.max_steps=6",
        "train.compile=true",
        "model.loss_chunk_tokens=128",
    ]
    out = tmp_path / "run"
    run_cli(
        ["run", *[a for s in settings for a in ("--set", s)], "--nproc", nproc, "--output-dir", out]
    )
    s = read_result(out)["summary"]
    assert s["optimizer_steps"] == 6 and s["tokens_per_s"] > 0
    assert (out / "adapter" / "adapter_config.json").is_file()


def test_cudnn_attention_first_runs(tmp_path):
    data = write_alpaca(tmp_path / "alpaca.json", n=48)
    settings = gpu_settings(data) + ["train.max_steps=4", "train.sdpa_backend=cudnn"]
    out = tmp_path / "run"
    run_cli(["run", *[a for s in settings for a in ("--set", s)], "--output-dir", out])
    assert read_result(out)["summary"]["optimizer_steps"] == 4


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_fp8_base_layers_with_compile_on_cuda(tmp_path, recipe):
    pytest.importorskip("torchao")
    data = write_alpaca(tmp_path / "alpaca.json", n=48)
    settings = gpu_settings(data) + [
        "train.max_steps=6",
        "train.compile=true",
        f"model.fp8={recipe}",
        "model.loss_chunk_tokens=128",
    ]
    out = tmp_path / "run"
    run_cli(["run", *[a for s in settings for a in ("--set", s)], "--output-dir", out])
    r = read_result(out)
    assert r["summary"]["optimizer_steps"] == 6 and r["workload"]["fp8"] == recipe


def test_liger_loss_and_gradients_equal_transformers():
    """model.kernels=liger (Liger's RMSNorm, RoPE, SwiGLU, fused linear cross-entropy) gives
    transformers' loss and adapter gradients, within bf16 rounding. Last in the file: Liger
    patches transformers' Llama module for the rest of the process."""
    pytest.importorskip("liger_kernel")
    from paratrain.models.causal_lm.build import build_causal_lm
    from paratrain.models.causal_lm.fast_layers import apply_kernels
    from paratrain.models.causal_lm.lora import LoraConfig, apply_lora
    from paratrain.models.causal_lm.loss import ChunkedLossLM

    def lm(kernels):
        torch.manual_seed(0)
        model = build_causal_lm(None, "random", "tiny", "sdpa", torch.bfloat16, "cuda")
        model.config.use_cache = False
        model = apply_lora(apply_kernels(model, kernels, torch.device("cuda")), LoraConfig())
        for n, p in model.named_parameters():
            if "lora_B" in n:
                torch.nn.init.normal_(p, std=0.02)  # nonzero B: gradients reach every adapter
        return ChunkedLossLM(model, 0, fused="liger") if kernels == "liger" else model

    ids = torch.randint(0, 300, (2, 64), device="cuda")
    labels = ids.clone()
    labels[:, :10] = -100
    out = {}
    for kernels in ("none", "liger"):
        model = lm(kernels)
        with torch.autocast("cuda", torch.bfloat16):
            loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        grads = {
            n.replace("lm.", "", 1): p.grad.float()
            for n, p in model.named_parameters()
            if p.requires_grad
        }
        out[kernels] = (loss.float(), grads)
    torch.testing.assert_close(out["liger"][0], out["none"][0], atol=2e-2, rtol=2e-2)
    for n, g in out["none"][1].items():
        torch.testing.assert_close(out["liger"][1][n], g, atol=5e-3, rtol=5e-2, msg=n)
