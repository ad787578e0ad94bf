"""lora.fused on one layer, on the GPU: peft's LoRA Linear against the fused forward
(models/causal_lm/lora_matmul.py) at the 8B shape's q_proj / v_proj / o_proj sizes, batch 2 and 8
of 2,048 tokens, bf16 autocast with fp32 adapters as the recipe trains them: forward + backward
time (CUDA events, median of 20 after 5 warm-up, eager and compiled) and how far the outputs and
gradients lie apart. `--small` runs it on the CPU.

    python3 benchmarks/device/lora_layer_check.py --out $OUT
"""

import argparse
import copy
import json

import torch
from peft import LoraConfig, get_peft_model
from torch import nn

from paratrain.meters.floor import _seconds
from paratrain.models.causal_lm.lora_matmul import fuse_adapters


def layer(k: int, n: int, device) -> nn.Module:
    model = nn.Sequential(nn.Linear(k, n, bias=False)).to(device, torch.bfloat16)
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["0"]))
    for name, p in model.named_parameters():
        if p.requires_grad:
            p.data = p.data.float()
            if "lora_B" in name:  # peft starts B at zero; a trained one is not
                nn.init.normal_(p, std=0.02)
    return model


def timed(model, x, grad, device, repeats: int) -> float:
    """Milliseconds of one forward + backward: meters/floor.py's median timing (CUDA events on a
    GPU) after 4 more warm-ups here (compiled layers settle)."""

    def once():
        with torch.autocast(device.type, dtype=torch.bfloat16):
            y = model(x)
        y.backward(grad)

    for _ in range(4):
        once()
    return _seconds(once, device, repeats) * 1e3


def apart(ref, new, x_ref, x_new) -> dict:
    out = {"x_grad": ((x_ref.grad - x_new.grad).norm() / x_ref.grad.norm()).item()}
    for (name, p), (_, q) in zip(ref.named_parameters(), new.named_parameters(), strict=True):
        if p.requires_grad:
            out[name.split(".")[-3]] = ((p.grad - q.grad).norm() / p.grad.norm()).item()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--small", action="store_true")
    args = ap.parse_args()
    device = torch.device("cpu" if args.small else "cuda")
    shapes = [("q_proj", 4096, 4096), ("v_proj", 4096, 1024), ("o_proj", 4096, 4096)]
    batches = [2, 8]
    if args.small:
        shapes, batches = [("q_proj", 256, 256)], [1]
    rows = []
    for name, k, n in shapes:
        for batch in batches:
            tokens = batch * (2048 if not args.small else 64)
            torch.manual_seed(0)
            ref = layer(k, n, device)
            new = copy.deepcopy(ref)
            assert fuse_adapters(new)[0] == 1
            x = torch.randn(tokens, k, device=device, dtype=torch.bfloat16)
            grad = torch.randn(tokens, n, device=device, dtype=torch.bfloat16)
            xr, xn = x.clone().requires_grad_(), x.clone().requires_grad_()
            with torch.autocast(device.type, dtype=torch.bfloat16):
                yr, yn = ref(xr), new(xn)
            yr.backward(grad)
            yn.backward(grad)
            row = {"layer": name, "k": k, "n": n, "tokens": tokens,
                   "out_apart": ((yr - yn).float().norm() / yr.float().norm()).item(),
                   **{f"{key}_apart": v for key, v in apart(ref, new, xr, xn).items()}}  # fmt: skip
            xr.requires_grad_(True)
            for mode, wrap in (("eager", lambda m: m), ("compiled", torch.compile)):
                row[f"peft_{mode}_ms"] = timed(wrap(ref), xr, grad, device, 20)
                row[f"fused_{mode}_ms"] = timed(wrap(new), xn, grad, device, 20)
            rows.append(row)
            print(json.dumps(row), flush=True)
    with open(f"{args.out}/lora_layer_check.json", "w") as f:
        json.dump({"torch": torch.__version__, "device": str(torch.cuda.get_device_name(0))
                   if device.type == "cuda" else "cpu", "rows": rows}, f, indent=1)  # fmt: skip


if __name__ == "__main__":
    main()
