"""AdamW for a model whose weights are bf16 (train.bf16_weights): the fp32 master weights live in
the optimizer's state beside exp_avg and exp_avg_sq, and each step updates the master and rounds
it into the model's weight. Megatron-LM's and DeepSpeed's bf16 layout: the model computes with
bf16 weights (no per-matmul casts of fp32 ones under autocast, a bf16 residual stream, bf16
gradients, half the gradient memory), while the update accumulates in fp32 as torch's AdamW on
fp32 weights does.

The masters are part of the optimizer's state_dict, so a checkpoint keeps them and a resume
continues from them, not from the rounded weights. On CUDA (or Triton's interpreter) one kernel a
weight (master_adamw_triton.py); elsewhere the same arithmetic in torch ops."""

from __future__ import annotations

import torch

from paratrain.kernels import uses_triton

# state entries kept in fp32 whatever the weight's dtype (torch's load_state_dict would cast
# them to it)
FP32_STATE = ("master", "exp_avg", "exp_avg_sq")


def to_bf16_weights(model: torch.nn.Module) -> dict[torch.nn.Parameter, torch.Tensor]:
    """The model's trained floating-point weights made bf16 in place (the same Parameter
    objects; buffers such as rotary frequencies stay as they are) -> {weight: its fp32 value
    before rounding}, the masters the optimizer starts from: step 0 computes with exactly the
    bf16 weights autocast would have cast."""
    masters = {}
    for p in model.parameters():
        if p.requires_grad and p.is_floating_point():
            masters[p] = p.detach().to(torch.float32, copy=True)
            p.data = p.data.to(torch.bfloat16)
    return masters


class MasterAdamW(torch.optim.Optimizer):
    """torch.optim.AdamW's update on fp32 masters of low-precision weights. Takes the fused
    optimizers' device flags (grad_scale, found_inf: the clip's divisor and the NaN guard's
    skip) as attributes, as GradScaler sets them, so the loop treats it as a fused optimizer."""

    _step_supports_amp_scaling = True

    def __init__(
        self, params, masters=None, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0
    ):
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, fused=True)
        super().__init__(params, defaults)
        masters = masters or {}
        for group in self.param_groups:
            for p in group["params"]:
                master = masters.get(p)
                if master is None:
                    master = p.detach().to(torch.float32, copy=True)
                self.state[p] = {
                    "step": torch.zeros((), dtype=torch.float32, device=p.device),
                    "master": master.to(p.device),
                    "exp_avg": torch.zeros_like(master, device=p.device),
                    "exp_avg_sq": torch.zeros_like(master, device=p.device),
                }
        self.grad_scale: torch.Tensor | None = None
        self.found_inf: torch.Tensor | None = None

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        scale, inf = self.grad_scale, self.found_inf
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            live = [p for p in group["params"] if p.grad is not None]
            if not live:
                continue
            if any(p.grad.is_sparse for p in live):
                raise RuntimeError("MasterAdamW does not support sparse gradients")
            steps = [self.state[p]["step"] for p in live]
            torch._foreach_add_(steps, 1.0)
            if inf is not None:  # a skipped step does not count (torch's fused AdamW)
                torch._foreach_sub_(steps, [inf.to(steps[0].device)] * len(steps))
            for p in live:
                update = _kernel_for(p)
                update(
                    p,
                    p.grad,
                    self.state[p],
                    lr=float(group["lr"]),
                    beta1=beta1,
                    beta2=beta2,
                    eps=group["eps"],
                    weight_decay=group["weight_decay"],
                    grad_scale=scale,
                    found_inf=inf,
                )
        return loss

    def load_state_dict(self, state_dict) -> None:
        """torch's, except that the masters and moments stay fp32: torch casts floating state to
        each weight's dtype, which would round the masters to bf16."""
        from itertools import chain

        saved = state_dict["state"]
        kept = {k: {n: v for n, v in s.items() if n in FP32_STATE} for k, s in saved.items()}
        super().load_state_dict(state_dict)
        ids = chain.from_iterable(g["params"] for g in state_dict["param_groups"])
        params = chain.from_iterable(g["params"] for g in self.param_groups)
        for key, p in zip(ids, params, strict=True):
            for name, value in kept.get(key, {}).items():
                self.state[p][name] = value.to(device=p.device, dtype=torch.float32, copy=True)


def _kernel_for(p: torch.Tensor):
    """The fused kernel where Triton runs (CUDA, or its interpreter under TRITON_INTERPRET=1)
    and the tensors are dense; torch's arithmetic elsewhere."""
    if uses_triton(p) and p.is_contiguous() and p.grad.is_contiguous():
        from paratrain.optim.master_adamw_triton import adamw_master_step

        return adamw_master_step
    return adamw_master_reference


def adamw_master_reference(
    weight, grad, state, *, lr, beta1, beta2, eps, weight_decay, grad_scale, found_inf
) -> None:
    """The kernel's arithmetic in torch ops (torch.optim.AdamW's single-tensor update on the
    master), then the master rounded into the weight."""
    if found_inf is not None and bool(found_inf.item()):
        return
    master, m, v, t = state["master"], state["exp_avg"], state["exp_avg_sq"], state["step"]
    g = grad.to(torch.float32)
    if grad_scale is not None:
        g = g / grad_scale.to(g.device)
    t = float(t.item())
    master.mul_(1.0 - lr * weight_decay)
    m.lerp_(g, 1.0 - beta1)
    v.mul_(beta2).addcmul_(g, g, value=1.0 - beta2)
    correction1 = 1.0 - beta1**t
    correction2 = 1.0 - beta2**t
    denom = (v.sqrt() / correction2**0.5).add_(eps)
    master.addcdiv_(m, denom, value=-lr / correction1)
    weight.copy_(master)
