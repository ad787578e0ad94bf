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
    from paratrain.lm import data as lmdata
    from paratrain.lm.model import build_causal_lm

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
        for s in gpu_settings(data) + [f"strategy={strategy}", "train.max_steps=12"]
        for a in ("--set", s)
    ]
    out = tmp_path / "run"
    run_cli(["run", *sets, "--nproc", nproc, "--output-dir", out])
    r = read_result(out)
    s = r["summary"]
    assert r["backend"] == "nccl" and s["optimizer_steps"] == 12 and s["tokens_per_s"] > 0
    assert s["peak_memory_kind"] == "cuda_max_allocated" and s["mfu"] is not None
    assert (out / "adapter" / "adapter_config.json").is_file()
