"""Two parts of the Llama-3.2-1B full-training step with train.bf16_weights, timed alone on the
GPU (CUDA events, median of 10-20) to choose between forms:
  - the loss over whole bf16 logits [16,384 x 128,256], forward + backward: torch.compile of
    F.cross_entropy on the fp32 upcast (paratrain's WholeLoss), against Liger-Kernel's
    cross-entropy kernel (the gradient written in forward, in place of the logits);
  - MasterAdamW's step over the 1B shape's weights (bf16 weights and gradients, fp32 masters and
    moments) for each block size and warp count of its Triton kernel, with the bytes moved a
    second (28 a parameter).
    PYTHONPATH=src python3 benchmarks/device/parts_bench.py"""

import torch
import torch.nn.functional as F

IGNORE = -100
N, V, H, FF, KV, LAYERS = 16_384, 128_256, 2048, 8192, 512, 16


def events(fn, repeats):
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return sorted(times)[len(times) // 2]


def loss_rows():
    torch.manual_seed(0)
    base = (torch.randn(N, V, device="cuda") * 2).to(torch.bfloat16)
    labels = torch.randint(0, V, (N,), device="cuda")
    labels[::97] = IGNORE
    compiled = torch.compile(lambda x, y: F.cross_entropy(x.float(), y, ignore_index=IGNORE))
    out = {}

    def run_compiled():
        x = base.detach().requires_grad_()
        loss = compiled(x, labels)
        loss.backward()
        out["compiled"] = (loss.detach(), x.grad)

    for _ in range(3):
        run_compiled()
    print(f"loss: compiled cross_entropy      {events(run_compiled, 20):7.3f} ms")
    try:
        from liger_kernel.transformers import LigerCrossEntropyLoss
    except ImportError:
        print("loss: liger-kernel absent")
        return
    liger = LigerCrossEntropyLoss(ignore_index=IGNORE)
    work = base.clone()

    def run_liger():
        work.copy_(base)  # Liger writes the gradient over its input: a fresh copy each time
        x = work.detach().requires_grad_()
        loss = liger(x, labels)
        loss.backward()
        out["liger"] = (loss.detach(), x.grad)

    copy = events(lambda: work.copy_(base), 10)
    for _ in range(3):
        run_liger()
    ms = events(run_liger, 20) - copy
    (la, ga), (lb, gb) = out["compiled"], out["liger"]
    dg = (ga.float() - gb.float()).abs().max().item()
    print(
        f"loss: Liger cross-entropy         {ms:7.3f} ms (less the copy, {copy:.3f} ms)  "
        f"|dloss| {abs(la.item() - lb.item()):.2e}  max|dgrad| {dg:.2e}"
    )


def adamw_rows():
    from paratrain.optim import master_adamw_triton as kernel
    from paratrain.optim.master_adamw import MasterAdamW

    shapes = (
        [(V, H)]
        + [(H, H), (KV, H), (KV, H), (H, H), (FF, H), (FF, H), (H, FF), (H,), (H,)] * LAYERS
        + [(H,)]
    )
    params = [torch.nn.Parameter(torch.randn(s, device="cuda").to(torch.bfloat16)) for s in shapes]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = MasterAdamW(params, lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
    n = sum(p.numel() for p in params)
    for block in (1024, 2048, 4096, 8192):
        for warps in (4, 8, 16):
            kernel.BLOCK, kernel.WARPS = block, warps
            for _ in range(2):
                opt.step()
            ms = events(opt.step, 10)
            print(
                f"adamw: BLOCK {block:5d} warps {warps:2d}  {ms:7.3f} ms  "
                f"{28 * n / ms / 1e9:6.2f} TB/s"
            )


if __name__ == "__main__":
    loss_rows()
    adamw_rows()
