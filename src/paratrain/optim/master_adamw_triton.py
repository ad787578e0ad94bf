"""One Triton kernel for one weight's AdamW step under train.bf16_weights: it reads the bf16
gradient and the fp32 master, exp_avg and exp_avg_sq, and writes those three and the bf16 weight
the model computes with. torch's fused AdamW takes one dtype for weight and gradient, so the same
update would need a pass casting the gradients up and another rounding the masters down; here
each element is read and written once (28 bytes a parameter, against 40 for fp32 weights under
autocast: their per-matmul casts and the gradients' cast back).

The update is torch.optim.AdamW's (decoupled decay, lerp for exp_avg, the bias corrections from
the step count), with torch's fused kernels' two device flags: grad_scale divides each gradient
as it is read (the clip), found_inf leaves everything as it was (the NaN guard's skip)."""

from __future__ import annotations

import torch

from paratrain.kernels import big, block_index, tl, triton

# elements and warps a program: 9.34 ms a step over the 1B shape against 9.56 for 2048 x 8 and
# 10.45-11.54 for 8192 (one H200, benchmarks/device/parts_bench.py, call 48)
BLOCK, WARPS = 1024, 4

if triton is not None:

    @triton.jit
    def _adamw_master(
        master,
        weight,
        grad,
        exp_avg,
        exp_avg_sq,
        step,
        grad_scale,
        found_inf,
        n,
        lr,
        beta1,
        beta2,
        eps,
        weight_decay,
        HAS_SCALE: tl.constexpr,
        HAS_INF: tl.constexpr,
        BLOCK: tl.constexpr,
        BIG: tl.constexpr,
    ):
        start = tl.program_id(0)
        if BIG:  # the product in int64: program_id is int32 and would wrap past 2**31 elements
            start = start.to(tl.int64)
        i = block_index(start * BLOCK, BLOCK, BIG)
        if HAS_INF:  # a skipped step: no element in range, every load and store masked off
            n = tl.where(tl.load(found_inf) == 0, n, 0)
        mask = i < n
        g = tl.load(grad + i, mask=mask, other=0.0).to(tl.float32)
        if HAS_SCALE:
            g = g / tl.load(grad_scale)
        w = tl.load(master + i, mask=mask, other=0.0)
        m = tl.load(exp_avg + i, mask=mask, other=0.0)
        v = tl.load(exp_avg_sq + i, mask=mask, other=0.0)
        t = tl.load(step)  # this step's count, already advanced (float32, as torch keeps it)
        w = w * (1.0 - lr * weight_decay)
        m = m + (1.0 - beta1) * (g - m)
        v = beta2 * v + (1.0 - beta2) * g * g
        correction1 = 1.0 - tl.exp2(t * tl.log2(beta1))  # 1 - beta1 ** t
        correction2 = 1.0 - tl.exp2(t * tl.log2(beta2))
        denom = tl.sqrt(v) / tl.sqrt(correction2) + eps
        w = w - (lr / correction1) * (m / denom)
        tl.store(master + i, w, mask=mask)
        tl.store(exp_avg + i, m, mask=mask)
        tl.store(exp_avg_sq + i, v, mask=mask)
        # rounded to nearest even on the GPU (LLVM's fptrunc), as torch's .to(bfloat16) rounds
        tl.store(weight + i, w.to(weight.dtype.element_ty), mask=mask)


def adamw_master_step(
    weight: torch.Tensor,
    grad: torch.Tensor,
    state: dict,
    *,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    grad_scale: torch.Tensor | None,
    found_inf: torch.Tensor | None,
) -> None:
    """One weight's update in place (state: master, exp_avg, exp_avg_sq, step advanced)."""
    master = state["master"]
    n = master.numel()
    _adamw_master[(triton.cdiv(n, BLOCK),)](
        master,
        weight,
        grad,
        state["exp_avg"],
        state["exp_avg_sq"],
        state["step"],
        grad_scale if grad_scale is not None else master,
        found_inf if found_inf is not None else master,
        n,
        lr,
        beta1,
        beta2,
        eps,
        weight_decay,
        HAS_SCALE=grad_scale is not None,
        HAS_INF=found_inf is not None,
        BLOCK=BLOCK,
        BIG=big(master),
        num_warps=WARPS,
    )
