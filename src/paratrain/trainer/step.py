"""One optimizer step, top to bottom: micro-batches of forward, loss and backward (or a
pipeline schedule's), then the optimizer. Communication happens inside backward: DDP
all-reduces gradient buckets, FSDP reduce-scatters each block's gradients, tensor parallelism's
collectives run in each layer's forward and backward, a pipeline's stages send activations and
their gradients to their neighbours."""

from __future__ import annotations

import torch

from paratrain.parallel.apply import gradient_sync
from paratrain.parallel.tp import replicate_partial_grads, whole_tensor


def train_step(run, batches) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """-> (this step's loss on this rank, or None on a pipeline stage without the loss;
    tokens it trained on, or None for images)."""
    k, work, scaler = run.k, run.work, run.scaler
    loss_sum, tokens = None, None
    with run.step_context():  # loss_parallel under TP: forward and backward inside it
        if run.pipe is not None:  # forward and backward of every micro-batch, stage by stage
            batch = next(batches)
            with run.policy.autocast():
                loss_sum = run.pipe.train_step(batch)
            tokens = work.pipeline.tokens(batch)
        else:
            for micro in range(k):
                batch = next(batches)
                # Gradient accumulation: only the last micro-batch all-reduces (DDP's no_sync)
                # or reduce-scatters (FSDP).
                with gradient_sync(run.model, enabled=micro == k - 1):
                    with run.policy.autocast():
                        loss, n_tokens = work.loss(run.model, batch)
                        if k > 1:  # the mean over micro-batches; k = 1 needs no kernel for it
                            loss = loss / k
                    # backward: DDP all-reduces gradient buckets here, overlapped with compute
                    (scaler.scale(loss) if scaler else loss).backward()
                # strategy=split: the loss comes from the last GPU; the sums live on the first
                detached = whole_tensor(loss.detach()).to(run.env.device)
                loss_sum = detached if loss_sum is None else loss_sum + detached
                if n_tokens is not None:
                    tokens = n_tokens if tokens is None else tokens + n_tokens
    replicate_partial_grads(run.dtensor_params)  # tensor parallel: summed norms' gradients
    if scaler is not None:
        scaler.step(run.optimizer)  # skipped when the gradients hold inf/NaN
        scaler.update()  # ... and then the scale backs off
    else:
        run.optimizer.step()
    run.optimizer.zero_grad(set_to_none=True)
    return loss_sum, tokens
