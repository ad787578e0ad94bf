"""One optimizer step, top to bottom: micro-batches of forward, loss and backward (or a
pipeline schedule's), then the optimizer. Communication happens inside backward: DDP
all-reduces gradient buckets, FSDP reduce-scatters each block's gradients, tensor parallelism's
collectives run in each layer's forward and backward, a pipeline's stages send activations and
their gradients to their neighbours."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from paratrain.meters.profiling import phase
from paratrain.parallel.apply import gradient_sync
from paratrain.parallel.tp import replicate_partial_grads
from paratrain.protocols import StepContext, whole_tensor
from paratrain.trainer import faults


@dataclass(frozen=True)
class Step:
    """What a training step reads, and nothing more: made once from the built run (of_built),
    so the step sees neither the plan nor the config beyond the three settings it obeys."""

    model: Any
    """What forward runs: this rank's stage, parallelized, compiled and wrapped."""
    pipe: Any
    """parallel.pipeline.Pipeline when the model is cut into stages, else None."""
    policy: Any
    """The precision policy: autocast for forward."""
    scaler: Any
    """fp16's GradScaler, else None."""
    optimizer: Any
    params: list
    dtensor_params: list
    sync: Any
    """How the data-parallel replicas agree (parallel/sync.py)."""
    parts: dict
    step_context: Callable[[], Any]
    wrapper: str | None
    device: Any
    rank: int
    tp_enabled: bool
    loss: Callable
    """Workload.loss(model, batch) -> (loss, tokens or None)."""
    task_step: Callable | None
    """A task's own step (a GAN's), else None."""
    pipeline_tokens: Callable | None
    max_grad_norm: float | None
    max_bad_steps: int
    sync_mode: str

    @classmethod
    def of_built(cls, built) -> Step:
        """From trainer.run.Built: the fields a step reads."""
        work, train = built.work, built.cfg.train
        return cls(
            model=built.model,
            pipe=built.pipe,
            policy=built.policy,
            scaler=built.scaler,
            optimizer=built.optimizer,
            params=built.params,
            dtensor_params=built.dtensor_params,
            sync=built.sync,
            parts=built.parts,
            step_context=built.step_context,
            wrapper=built.wrapper,
            device=built.env.device,
            rank=built.env.rank,
            tp_enabled=built.dims.tp_enabled,
            loss=work.loss,
            task_step=work.step,
            pipeline_tokens=work.pipeline.tokens if work.pipeline is not None else None,
            max_grad_norm=train.max_grad_norm,
            max_bad_steps=train.max_bad_steps,
            sync_mode=built.cfg.sync.mode,
        )


def choose_step(s: Step, k: int) -> Callable[[Iterator, int], tuple[Any, Any, Any, Any]]:
    """The run's step, chosen once (k: micro-batches per step): the
    task's own (a GAN: two models, two optimizers), or forward and backward (micro-batches, or
    a pipeline schedule's) then the update. A step takes the epoch's batch iterator and the
    steps done so far -> (this step's loss on this rank, or None on a pipeline
    stage without the loss; tokens it trained on, or None for images; whether it was applied:
    a bool, or a device flag the NaN guard reads a step later; the gradients' norm, a device
    tensor, where this rank holds it whole (one process, DDP) or the clip computed it, for
    the step log, else None)."""
    if s.task_step is not None:
        return lambda batches, done: (
            *s.task_step(task_step_context(s, done), next(batches)),
            None,
        )

    def step(batches, done: int):
        with s.step_context():  # loss_parallel under TP: forward and backward inside it
            if s.pipe is not None:
                loss_sum, tokens = pipeline_pass(s, batches)
            else:
                loss_sum, tokens = micro_batches(s, k, done + 1, batches)
        return update(s, done + 1, loss_sum, tokens)

    return step


def pipeline_pass(s, batches) -> tuple[torch.Tensor | None, Any]:
    """Forward and backward of every micro-batch, stage by stage."""
    batch = next(batches)
    with s.policy.autocast():
        loss_sum = s.pipe.train_step(batch)
    return loss_sum, s.pipeline_tokens(batch)


def micro_batches(s, k: int, step: int, batches) -> tuple[torch.Tensor, Any]:
    """k micro-batches of forward, loss and backward for step `step` (1-based); gradients
    accumulate."""
    scaler = s.scaler
    cuda = s.device.type == "cuda"
    loss_sum, tokens = None, None
    for micro in range(k):
        with phase("data", cuda):
            batch = next(batches)
        # Gradient accumulation: only the last micro-batch all-reduces (DDP's no_sync) or
        # reduce-scatters (FSDP). sync.mode: local SGD, DiLoCo and stale-1 take no all-reduce
        # in backward
        sync = micro == k - 1 and s.sync.grad_sync(step)
        with gradient_sync(s.model, enabled=sync):
            with phase("forward", cuda), s.policy.autocast():
                loss, n_tokens = s.loss(s.model, batch)
                if k > 1:  # the mean over micro-batches; k = 1 needs no kernel for it
                    loss = loss / k
            # backward: DDP all-reduces gradient buckets here, overlapped with compute
            with phase("backward", cuda):
                (scaler.scale(loss) if scaler else loss).backward()
        # strategy=split: the loss comes from the last GPU; the sums live on the first
        detached = whole_tensor(loss.detach()).to(s.device)
        loss_sum = detached if loss_sum is None else loss_sum + detached
        if n_tokens is not None:
            tokens = n_tokens if tokens is None else tokens + n_tokens
    return loss_sum, tokens


def update(s, step: int, loss_sum, tokens) -> tuple[torch.Tensor | None, Any, Any, Any]:
    """Clipping, the NaN guard, then the optimizer step (or none, on every rank, for a bad
    step) -> the step's (loss, tokens, applied, gradient norm)."""
    cuda = s.device.type == "cuda"
    replicate_partial_grads(s.dtensor_params)  # tensor parallel: summed norms' gradients
    if faults.poison_gradients(s.rank, step):
        for p in s.params:
            if p.grad is not None:
                p.grad.fill_(float("nan"))
    norm, divisor = None, None
    if s.max_grad_norm is not None:
        with phase("clip", cuda):
            norm, divisor = clip_gradients(s, s.max_grad_norm)
    grad_norm, verdict, finite = norm, None, True  # the clip's norm: the step log's
    if s.scaler is not None:  # fp16: overflowing scaled gradients are the scaler's to skip
        norm = None
    if s.max_bad_steps >= 0:
        with phase("checks", cuda):
            if guard_on_device(s):
                verdict, whole = nonfinite_flag(s, loss_sum, norm)
            else:
                finite, whole = finite_everywhere(s, loss_sum, norm)
            grad_norm = grad_norm if whole is None else whole
            if verdict is None and not finite:
                s.optimizer.zero_grad(set_to_none=True)
                return loss_sum, tokens, False, grad_norm
    with phase("optimizer", cuda):
        optimizer_step(s, step, verdict, divisor)
    return loss_sum, tokens, True if verdict is None else verdict, grad_norm


def clip_gradients(s, max_norm: float) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The gradients' global L2 norm, and the gradients scaled down to max_norm when it exceeds
    it -> (the norm, or None without gradients; the divisor left for the fused optimizer, or
    None when applied here). Under fp16 the scaler's factor comes out first (unscale_), or the
    norm would be the scaled one. No host sync: a NaN norm reaches the guard, which skips.

    With a fused optimizer that takes a grad_scale (AdamW, Adam, SGD), the scaling is not a
    pass of its own over every gradient: the kernel divides each gradient as it reads it, as
    it does for GradScaler (1B Llama shape on one H200: 2.7 ms a step saved)."""
    if s.scaler is not None:
        s.scaler.unscale_(s.optimizer)
    groups = parameter_groups(s.params)
    if not groups:
        return None, None
    total = global_norm(groups, s.device)
    if scales_in_kernel(s):
        # clip_grads_with_norm_'s factor, max_norm / (norm + 1e-6) at most 1, as a divisor
        return total, torch.clamp((total + 1e-6) / max_norm, min=1.0).to(torch.float32)
    for params in groups:  # clip_grads_with_norm_ takes the parameters and scales their .grad
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total, foreach=True)
    return total, None


def parameter_groups(params) -> list[list[torch.Tensor]]:
    """The parameters with gradients, in groups whose gradients one foreach kernel takes: plain
    tensors (per device), and DTensors per device mesh. Under tensor parallelism LoRA's adapters
    stay plain beside the sharded base, and a 2-D mesh's parameters may sit on different
    sub-meshes; torch's foreach norm refuses such a mix."""
    groups: dict[tuple, list[torch.Tensor]] = {}
    for p in params:
        g = p.grad
        if g is None:
            continue
        mesh = getattr(g, "device_mesh", None)
        key = ("dtensor", id(mesh)) if mesh is not None else ("plain", g.device)
        groups.setdefault(key, []).append(p)
    return list(groups.values())


def global_norm(groups: list[list[torch.Tensor]], device: torch.device) -> torch.Tensor:
    """sqrt of the sum of every group's squared gradient norm, on `device`. A DTensor group's norm is
    reduced over its mesh by DTensor (a replicated result) and made a plain tensor, so every
    rank holds the same norm; plain gradients are whole (replicated) on each rank."""
    norms = []
    for params in groups:
        grads = [p.grad for p in params]
        if grads[0].dtype == torch.bfloat16 and not hasattr(grads[0], "device_mesh"):
            # train.bf16_weights: the norm summed in fp32 (torch's would be bf16, 3 digits,
            # and the clip's factor with it)
            per = torch._foreach_norm(grads, 2.0, dtype=torch.float32)
            norms.append(torch.linalg.vector_norm(torch.stack(per)).to(device))
            continue
        n = torch.nn.utils.get_total_norm(grads, foreach=True)
        if hasattr(n, "full_tensor"):
            n = n.full_tensor()
        norms.append(n.to(device=device, dtype=torch.float32))
    return norms[0] if len(norms) == 1 else torch.linalg.vector_norm(torch.stack(norms))


def scales_in_kernel(s) -> bool:
    """Whether the optimizer's fused kernel can divide the gradients itself (its grad_scale):
    one of torch's fused optimizers, not under GradScaler (which owns that slot), every step's
    gradients applied as they are (sync.mode every_step)."""
    opt = s.optimizer
    return (
        s.scaler is None
        and not isinstance(opt, list)
        and s.sync_mode == "every_step"
        and getattr(opt, "_step_supports_amp_scaling", False)
        and bool(opt.defaults.get("fused"))
    )


def optimizer_step(s, step: int, verdict, divisor=None) -> None:
    scaler, optimizer = s.scaler, s.optimizer
    # stale-1: this step's gradients start their all-reduce; last step's are applied
    if s.sync.before_optimizer(step):
        if scaler is not None:
            scaler.step(optimizer)  # skipped when the gradients hold inf/NaN
            scaler.update()  # ... and then the scale backs off
        elif verdict is not None or divisor is not None:
            # the fused kernel skips the whole update (and the step count) when the flag is
            # set, and divides the gradients by grad_scale (the clip), on the device:
            # GradScaler's mechanism, without its host read
            optimizer.found_inf, optimizer.grad_scale = verdict, divisor
            optimizer.step()
            optimizer.found_inf, optimizer.grad_scale = None, None
        else:
            optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    s.sync.after_optimizer(step)  # local SGD, DiLoCo: the replicas averaged every H steps


def guard_on_device(s) -> bool:
    """Whether the NaN guard can leave its verdict on the device (train.max_bad_steps): the
    optimizer is one of torch's fused ones, whose kernel takes a found_inf flag and skips the
    whole update on it, so no host sync is needed each step (BERT-base on one H200: 4-9%
    faster than the host check); the loop reads the flag a step later. Not under GradScaler
    (fp16: it owns the flag), nor where updates are not every step's all-reduced gradients (sync.mode), nor
    for SGD with momentum before its buffers exist: on a skipped first step the fused kernel
    would leave them allocated but unset (torch 2.14), and the next step would read them."""
    opt = s.optimizer
    if s.scaler is not None or isinstance(opt, list) or s.sync_mode != "every_step":
        return False
    if not getattr(opt, "_step_supports_amp_scaling", False) or not opt.defaults.get("fused"):
        return False
    if isinstance(opt, torch.optim.SGD) and opt.defaults.get("momentum"):
        return all(
            opt.state.get(p, {}).get("momentum_buffer") is not None
            for group in opt.param_groups
            for p in group["params"]
        )
    return True


def finite_everywhere(s, loss: torch.Tensor | None, norm=None) -> tuple[bool, Any]:
    """Whether this step's loss and gradients are finite on every rank: one flag, all-reduced
    (MIN), so all ranks skip together. Under fp16 the scaled gradients may overflow by design
    (GradScaler skips those steps and lowers its scale), so only the loss is checked there.
    -> (that, the whole gradients' norm met on the way or None: _finite_here)."""
    ok, whole = _finite_here(s, loss, norm)
    if dist.is_initialized():
        dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    return bool(ok.item()), whole


def nonfinite_flag(s, loss: torch.Tensor | None, norm=None) -> tuple[torch.Tensor, Any]:
    """1.0 when this step's loss or gradients are not finite on some rank, else 0.0: a device
    tensor, all-reduced (MAX) without reading it on the host -> (it, the whole gradients'
    norm met on the way or None)."""
    ok, whole = _finite_here(s, loss, norm)
    bad = 1.0 - ok
    if dist.is_initialized():
        dist.all_reduce(bad, op=dist.ReduceOp.MAX)
    return bad, whole


def _finite_here(s, loss: torch.Tensor | None, norm=None) -> tuple[torch.Tensor, Any]:
    """1.0 when this rank's loss and gradients are finite, on the device; and the gradients'
    norm for the step log on the way, where they are whole (else None). With the clip's global
    norm given, that norm is the gradients' check (NaN or inf in any gradient makes it so): no
    second pass."""
    device = s.device
    ok, whole_norm = torch.ones((), device=device), None
    if loss is not None:
        ok = ok * torch.isfinite(loss).all()
    if norm is not None:
        return ok * torch.isfinite(norm.to(device)).all(), None
    if s.scaler is None:
        grads = [p.grad for p in s.params if p.grad is not None]
        grads = [g.to_local() if hasattr(g, "to_local") else g for g in grads]  # DTensor shards
        # per-tensor norms in a few fused kernels: NaN or inf anywhere makes its norm so
        if grads:
            norms = torch.stack([n.to(device) for n in torch._foreach_norm(grads)])
            ok = ok * torch.isfinite(norms).all()
            # whole gradients here (no sharding): their norm, for the step log (no sync now)
            whole = (
                s.wrapper in (None, "ddp", "data-parallel") and not s.tp_enabled and s.pipe is None
            )
            whole_norm = torch.linalg.vector_norm(norms) if whole else None
    return ok, whole_norm


def task_step_context(s, done: int) -> StepContext:
    """What a task's own step may use: its wrapped parts, their optimizers, the guard."""
    guarded = s.max_bad_steps >= 0
    return StepContext(
        parts=s.parts,
        optimizers=s.optimizer,
        scaler=s.scaler,
        step=done,
        finite=(lambda loss: finite_everywhere(s, loss)[0]) if guarded else (lambda loss: True),
        no_sync=lambda module: gradient_sync(module, enabled=False),
        discard=lambda module: gradient_sync(module, enabled=s.wrapper != "ddp"),
    )
