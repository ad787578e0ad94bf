"""lm_head + mean next-token cross-entropy with the loss's gradient written in forward
(model.kernels=triton-loss). One Triton program a row of the [tokens, vocab] logits: an online
max and sum over the row give its log-sum-exp, then a second pass writes softmax minus the
one-hot target, over 1/n of the trained tokens, in place of the logits. Backward is then only
lm_head's two matmuls, with the incoming gradient applied on the [tokens, hidden] side of each
(not on the logits, the largest tensor). Compiled cross_entropy reads the logits in forward
and reduces each row again in backward (5.5 ms a step on the Llama-3.2-1B shape's 16,384 x
128,256 logits on one H200, benchmarks/device/parts_bench.py); this kernel 2.8 ms, and
Liger-Kernel's, which works this way, 3.2 ms with its gradient (ce_variants.py, call 56).

The arithmetic is F.cross_entropy(logits.float(), ignore_index=-100)'s: fp32 inside the kernel,
the loss summed in fp32, the gradient rounded once to the logits' dtype. Liger-Kernel's
cross-entropy works the same way; it keeps each row's loss in the logits' dtype and reads the
incoming gradient on the host, which would stop the host each step."""

from __future__ import annotations

import contextlib

import torch

from paratrain.kernels import tl, triton

IGNORE = -100
# A row of 128,256 bf16 logits is 256 KB. With 32 warps a program, one program runs on each SM,
# so the rows in flight fit in L2 and the second pass can read them from there (Liger-Kernel's
# choice; 16 warps and 8,192 columns a block took 3.35 ms a step on one H200, call 50). The
# eviction hints and the target's element written apart took the kernel alone from 3.20 to 2.78
# ms (benchmarks/device/ce_variants.py, call 56; Liger's kernel: 3.21 ms).
BLOCK, WARPS = 32768, 32

if triton is not None:

    @triton.jit
    def _loss_and_gradient(
        logits,
        labels,
        losses,
        count,
        stride,
        vocab,
        IGNORE_INDEX: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        row = tl.program_id(0)
        base = logits + row.to(tl.int64) * stride
        label = tl.load(labels + row)
        valid = label != IGNORE_INDEX
        at = tl.where(valid, label, 0)
        scale = tl.where(valid, 1.0 / tl.load(count).to(tl.float32), 0.0)
        target = tl.load(base + at).to(tl.float32)
        top = float("-inf")
        total = 0.0
        for start in range(0, vocab, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            # kept in L2 for the second pass, which then lets it go
            x = tl.load(
                base + cols, mask=cols < vocab, other=float("-inf"), eviction_policy="evict_last"
            ).to(tl.float32)
            new_top = tl.maximum(top, tl.max(x, 0))
            total = total * tl.exp(top - new_top) + tl.sum(tl.exp(x - new_top), 0)
            top = new_top
        lse = top + tl.log(total)
        tl.store(losses + row, tl.where(valid, lse - target, 0.0))
        for start in range(0, vocab, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            mask = cols < vocab
            x = tl.load(base + cols, mask=mask, other=0.0, eviction_policy="evict_first")
            g = tl.exp(x.to(tl.float32) - lse) * scale
            tl.store(base + cols, g.to(logits.dtype.element_ty), mask=mask)
        # the target's own element once, after every thread's store above (rather than a
        # compare and select on each of the row's 128,256 elements)
        tl.debug_barrier()
        own = tl.exp(target - lse) * scale - scale
        # a label outside the vocabulary writes nothing (not into the next row)
        tl.store(base + at, own.to(logits.dtype.element_ty), mask=(at >= 0) & (at < vocab))


def loss_and_gradient_(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """logits [n, vocab] (overwritten with the mean loss's gradient), labels [n] (IGNORE where
    no token is trained) -> the mean loss over the trained tokens (fp32; nan without any, as
    cross_entropy gives)."""
    n, vocab = logits.shape
    trained = labels != IGNORE
    count = trained.sum()
    losses = torch.empty(n, device=logits.device, dtype=torch.float32)
    # Triton launches on the current device; strategy=split puts lm_head on another GPU
    with torch.cuda.device(logits.device) if logits.is_cuda else contextlib.nullcontext():
        _launch(logits, labels, losses, count, vocab)
    return losses.sum() / count


def _launch(logits, labels, losses, count, vocab) -> None:
    _loss_and_gradient[(logits.shape[0],)](
        logits,
        labels,
        losses,
        count,
        logits.stride(0),
        vocab,
        IGNORE_INDEX=IGNORE,
        BLOCK=min(BLOCK, triton.next_power_of_2(vocab)),
        num_warps=WARPS,
    )


class LinearCrossEntropy(torch.autograd.Function):
    """hidden [n, h] @ weight[vocab, h].T, then the mean cross-entropy against labels [n]."""

    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda", cast_inputs=torch.bfloat16)
    def forward(ctx, hidden, weight, labels):
        logits = hidden @ weight.t()
        loss = loss_and_gradient_(logits, labels)
        ctx.save_for_backward(hidden, weight, logits)  # logits: now the loss's gradient
        return loss

    @staticmethod
    @torch.amp.custom_bwd(device_type="cuda")
    def backward(ctx, grad_loss):
        hidden, weight, grad_logits = ctx.saved_tensors
        # A device scalar (no host read), applied in fp32 on the [tokens, hidden] side, the
        # smallest tensor of each product: in bf16, 1/3 (three accumulated micro-batches)
        # would be 0.2% off.
        scale = grad_loss.float()
        grad_hidden = (grad_logits @ weight).float().mul_(scale).to(hidden.dtype)
        grad_weight = grad_logits.t() @ hidden.float().mul_(scale).to(hidden.dtype)
        return grad_hidden, grad_weight, None


def triton_lm_loss(hidden: torch.Tensor, labels: torch.Tensor, weight: torch.Tensor):
    """Mean next-token loss: hidden [B, T, H], labels [B, T] (unshifted, as transformers takes
    them), lm_head's weight [vocab, H]."""
    from torch.nn import functional as F

    shifted = F.pad(labels, (0, 1), value=IGNORE)[:, 1:].flatten()
    return LinearCrossEntropy.apply(hidden.flatten(0, 1), weight, shifted)
