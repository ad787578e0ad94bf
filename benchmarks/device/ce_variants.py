"""paratrain's Triton loss kernel (models/causal_lm/ce_triton.py) alone over the Llama-3.2-1B
step's [16,384 x 128,256] bf16 logits, for several block sizes and warp counts, beside
Liger-Kernel's cross-entropy kernel on the same logits (CUDA events, median of 20, less the
copy that restores the logits each time: both write the gradient over them).
    PYTHONPATH=src python3 benchmarks/device/ce_variants.py"""

import torch
import torch.nn.functional as F

from paratrain.models.causal_lm import ce_triton

IGNORE = -100
N, V = 16_384, 128_256


def events(fn, repeats=20):
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return sorted(times)[len(times) // 2]


def main():
    torch.manual_seed(0)
    base = (torch.randn(N, V, device="cuda") * 2).to(torch.bfloat16)
    labels = torch.randint(0, V, (N,), device="cuda")
    labels[::97] = IGNORE
    ref = F.cross_entropy(base.float(), labels, ignore_index=IGNORE)
    work = base.clone()
    copy = events(lambda: work.copy_(base), 10)
    print(f"copy {copy:.3f} ms ({2 * base.numel() * 2 / copy / 1e9:.2f} TB/s)")

    def ours():
        work.copy_(base)
        return ce_triton.loss_and_gradient_(work, labels)

    for block, warps in (
        (32768, 32),
        (32768, 16),
        (16384, 32),
        (16384, 16),
        (8192, 16),
        (8192, 8),
        (65536, 32),
        (131072, 32),
    ):
        ce_triton.BLOCK, ce_triton.WARPS = block, warps
        try:
            for _ in range(2):
                loss = ours()
            ms = events(ours) - copy
        except Exception as e:  # a block too large for the registers: a row, not a crash
            print(f"ours BLOCK {block:6d} warps {warps:2d}: {type(e).__name__} {str(e)[:80]}")
            continue
        print(
            f"ours BLOCK {block:6d} warps {warps:2d}: {ms:6.3f} ms  "
            f"{3 * base.numel() * 2 / ms / 1e9:5.2f} TB/s if the logits were read twice  "
            f"|dloss| {abs(loss.item() - ref.item()):.1e}"
        )
    try:
        from liger_kernel.transformers import LigerCrossEntropyLoss
    except ImportError:
        print("liger-kernel absent")
        return
    liger = LigerCrossEntropyLoss(ignore_index=IGNORE)

    def theirs():
        work.copy_(base)
        return liger(work, labels)

    for _ in range(2):
        theirs()
    print(f"Liger cross-entropy forward: {events(theirs) - copy:6.3f} ms")


if __name__ == "__main__":
    main()
