"""paratrain's Triton loss kernel (models/causal_lm/ce_triton.py) alone over the Llama-3.2-1B
step's [16,384 x 128,256] bf16 logits, for several block sizes and warp counts, beside
Liger-Kernel's cross-entropy kernel on the same logits (CUDA events, median of 20, less the
copy that restores the logits each time: both write the gradient over them).
    PYTHONPATH=src python3 benchmarks/device/ce_variants.py"""

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from parts_bench import events  # the same CUDA-event timing (this folder)

from paratrain.models.causal_lm import ce_triton

IGNORE = -100
N, V = 16_384, 128_256


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

    kept = ce_triton.BLOCK, ce_triton.WARPS
    for block, warps in ((32768, 32), (16384, 32), (8192, 8)):
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
    ce_triton.BLOCK, ce_triton.WARPS = kept
    variants(base, labels, work, copy)
    liger = LigerCrossEntropyLoss(ignore_index=IGNORE)

    def theirs():
        work.copy_(base)
        x = work.detach().requires_grad_()  # with a gradient: the kernel's second pass runs
        return liger(x, labels)

    for _ in range(2):
        theirs()
    print(f"Liger cross-entropy forward, gradient written: {events(theirs) - copy:6.3f} ms")


# Forms of the kernel tried against it (why ours reads the logits from memory twice where Liger's
# second pass finds them in L2): software pipelining off, L2 eviction hints, Liger's arithmetic.
@triton.jit
def _variant(
    logits,
    labels,
    losses,
    count,
    stride,
    vocab,
    BLOCK: tl.constexpr,
    HINTS: tl.constexpr,
    EXP2: tl.constexpr,
):
    row = tl.program_id(0)
    base = logits + row.to(tl.int64) * stride
    label = tl.load(labels + row)
    valid = label != -100
    scale = tl.where(valid, 1.0 / tl.load(count).to(tl.float32), 0.0)
    target = tl.load(base + tl.where(valid, label, 0)).to(tl.float32)
    top = float("-inf")
    total = 0.0
    for start in range(0, vocab, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        if HINTS:
            x = tl.load(
                base + cols, mask=cols < vocab, other=float("-inf"), eviction_policy="evict_last"
            ).to(tl.float32)
        else:
            x = tl.load(base + cols, mask=cols < vocab, other=float("-inf")).to(tl.float32)
        new_top = tl.maximum(top, tl.max(x, 0))
        if EXP2:
            total = total * tl.exp2((top - new_top) * 1.4426950408889634) + tl.sum(
                tl.exp2((x - new_top) * 1.4426950408889634), 0
            )
        else:
            total = total * tl.exp(top - new_top) + tl.sum(tl.exp(x - new_top), 0)
        top = new_top
    lse = top + tl.log(total)
    tl.store(losses + row, tl.where(valid, lse - target, 0.0))
    for start in range(0, vocab, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < vocab
        if HINTS:
            x = tl.load(
                base + cols, mask=mask, other=float("-inf"), eviction_policy="evict_first"
            ).to(tl.float32)
        else:
            x = tl.load(base + cols, mask=mask, other=float("-inf")).to(tl.float32)
        if EXP2:
            g = tl.exp2((x - top) * 1.4426950408889634) / total * scale
        else:
            g = tl.exp(x - lse) * scale
        tl.store(base + cols, g.to(logits.dtype.element_ty), mask=mask)
    tl.debug_barrier()
    own = tl.exp(target - lse) * scale - scale
    tl.store(base + tl.where(valid, label, 0), own.to(logits.dtype.element_ty))


def variants(base, labels, work, copy):
    count = (labels != IGNORE).sum()
    losses = torch.empty(N, device="cuda", dtype=torch.float32)
    for name, hints, exp2, stages in (
        ("plain", False, False, None),
        ("stages 1", False, False, 1),
        ("hints", True, False, None),
        ("exp2", False, True, None),
        ("exp2 stages 1", False, True, 1),
    ):
        extra = {} if stages is None else {"num_stages": stages}

        def run(hints=hints, exp2=exp2, extra=extra):
            work.copy_(base)
            _variant[(N,)](
                work,
                labels,
                losses,
                count,
                work.stride(0),
                V,
                BLOCK=32768,
                HINTS=hints,
                EXP2=exp2,
                num_warps=32,
                **extra,
            )

        for _ in range(2):
            run()
        print(
            f"variant {name:14s}: {events(run) - copy:6.3f} ms  "
            f"loss {(losses.sum() / count).item():.6f}"
        )


if __name__ == "__main__":
    main()
