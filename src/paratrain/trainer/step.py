"""One optimizer step, top to bottom: micro-batches of forward, loss and backward (or a
pipeline schedule's), then the optimizer. Communication happens inside backward: DDP
all-reduces gradient buckets, FSDP reduce-scatters each block's gradients, tensor parallelism's
collectives run in each layer's forward and backward, a pipeline's stages send activations and
their gradients to their neighbours."""

from __future__ import annotations

import torch
import torch.distributed as dist

from paratrain import faults
from paratrain.parallel.apply import gradient_sync
from paratrain.parallel.tp import replicate_partial_grads, whole_tensor
from paratrain.profiling import phase


def train_step(run, batches) -> tuple[torch.Tensor | None, torch.Tensor | None, bool]:
    """-> (this step's loss on this rank, or None on a pipeline stage without the loss;
    tokens it trained on, or None for images; whether the step was applied: False when its
    loss or gradients were not finite on some rank, and every rank skipped the update)."""
    k, work, scaler = run.k, run.work, run.scaler
    step = run.state.step + 1  # the step being taken, from 1
    cuda = run.env.device.type == "cuda"
    loss_sum, tokens = None, None
    if work.step is not None:  # the task's own step (a GAN: two models, two optimizers)
        return work.step(run, next(batches))
    with run.step_context():  # loss_parallel under TP: forward and backward inside it
        if run.pipe is not None:  # forward and backward of every micro-batch, stage by stage
            batch = next(batches)
            with run.policy.autocast():
                loss_sum = run.pipe.train_step(batch)
            tokens = work.pipeline.tokens(batch)
        else:
            for micro in range(k):
                with phase("data", cuda):
                    batch = next(batches)
                # Gradient accumulation: only the last micro-batch all-reduces (DDP's no_sync)
                # or reduce-scatters (FSDP).
                # sync.mode: local SGD, DiLoCo and stale-1 take no all-reduce in backward
                sync = micro == k - 1 and run.sync.grad_sync(step)
                with gradient_sync(run.model, enabled=sync):
                    with phase("forward", cuda), run.policy.autocast():
                        loss, n_tokens = work.loss(run.model, batch)
                        if k > 1:  # the mean over micro-batches; k = 1 needs no kernel for it
                            loss = loss / k
                    # backward: DDP all-reduces gradient buckets here, overlapped with compute
                    with phase("backward", cuda):
                        (scaler.scale(loss) if scaler else loss).backward()
                # strategy=split: the loss comes from the last GPU; the sums live on the first
                detached = whole_tensor(loss.detach()).to(run.env.device)
                loss_sum = detached if loss_sum is None else loss_sum + detached
                if n_tokens is not None:
                    tokens = n_tokens if tokens is None else tokens + n_tokens
    replicate_partial_grads(run.dtensor_params)  # tensor parallel: summed norms' gradients
    if faults.poison_gradients(run.env.rank, run.state.step + 1):
        for p in run.params:
            if p.grad is not None:
                p.grad.fill_(float("nan"))
    if run.cfg.train.max_bad_steps >= 0:
        with phase("checks", cuda):
            finite = finite_everywhere(run, loss_sum)
        if not finite:
            run.optimizer.zero_grad(set_to_none=True)
            return loss_sum, tokens, False
    with phase("optimizer", cuda):
        # stale-1: this step's gradients start their all-reduce; last step's are applied
        if run.sync.before_optimizer(step):
            if scaler is not None:
                scaler.step(run.optimizer)  # skipped when the gradients hold inf/NaN
                scaler.update()  # ... and then the scale backs off
            else:
                run.optimizer.step()
        run.optimizer.zero_grad(set_to_none=True)
        run.sync.after_optimizer(step)  # local SGD, DiLoCo: the replicas averaged every H steps
    return loss_sum, tokens, True


def finite_everywhere(run, loss: torch.Tensor | None) -> bool:
    """Whether this step's loss and gradients are finite on every rank: one flag, all-reduced
    (MIN), so all ranks skip together. Under fp16 the scaled gradients may overflow by design
    (GradScaler skips those steps and lowers its scale), so only the loss is checked there."""
    device = run.env.device
    ok = torch.ones((), device=device)
    if loss is not None:
        ok = ok * torch.isfinite(loss).all()
    if run.scaler is None:
        grads = [p.grad for p in run.params if p.grad is not None]
        grads = [g.to_local() if hasattr(g, "to_local") else g for g in grads]  # DTensor shards
        # per-tensor norms in a few fused kernels: NaN or inf anywhere makes its norm so
        if grads:
            norms = torch.stack([n.to(device) for n in torch._foreach_norm(grads)])
            ok = ok * torch.isfinite(norms).all()
            # whole gradients here (no sharding): their norm, for the step log (no sync now)
            whole = (
                run.wrapper in (None, "ddp", "dp") and not run.dims.tp_enabled and run.pipe is None
            )
            run.grad_norm = torch.linalg.vector_norm(norms) if whole else None
    if dist.is_initialized():
        dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    return bool(ok.item())
