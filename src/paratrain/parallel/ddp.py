"""The replicating data-parallel wrappers: nn.DataParallel (one process) and
DistributedDataParallel over the mesh's data-parallel group, with its communication hooks."""

from __future__ import annotations

import inspect
import warnings

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from paratrain.config.parallel import DDPConfig
from paratrain.protocols import unwrap


def apply_dp(model: nn.Module, device: torch.device) -> nn.Module:
    # DataParallel replicates the module onto every visible GPU on each forward and gathers the
    # outputs on GPU 0: one Python process drives all GPUs, which is why DDP beats it.
    if device.type != "cuda":
        return model  # DataParallel without GPUs is the module itself; say so instead of wrapping
    return nn.DataParallel(model)


def apply_ddp(
    model: nn.Module,
    device: torch.device,
    ddp: DDPConfig | None = None,
    group=None,
    link=None,
    fp32_sum: bool = False,
) -> nn.Module:
    """DDP over `group` (the mesh's data-parallel ranks; None: all of them). It broadcasts the
    group's first rank's weights at construction, then all-reduces gradients in buckets during
    backward, overlapping communication with the rest of the backward pass. fp32_sum: bf16
    gradients (train.bf16_weights) summed in fp32 unless ddp.gradient_compression says else."""
    ddp = ddp or DDPConfig()
    # Read by TorchDynamo when it first compiles the wrapped model, i.e. on the first step.
    torch._dynamo.config.optimize_ddp = ddp.split_compiled_graph
    ids = [device.index] if device.type == "cuda" else None
    # Newer torch names the per-forward buffer sync forward_sync_buffers (and warns on
    # broadcast_buffers); both still sync at construction, as paratrain wants.
    sync_kw = (
        "forward_sync_buffers"
        if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
        else "broadcast_buffers"
    )
    local = rank_local_buffers(model)
    if local:  # the module's own per-rank state (fp8_delayed's amax histories): not synced
        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, local)
    wrapped = DistributedDataParallel(
        model,
        device_ids=ids,
        process_group=group,
        bucket_cap_mb=ddp.bucket_cap_mb,
        gradient_as_bucket_view=ddp.gradient_as_bucket_view,
        static_graph=ddp.static_graph,
        **{sync_kw: ddp.broadcast_buffers},
    )
    register_compression(wrapped, ddp, group, link, fp32_sum)
    # A gradient that comes back from a compiled backward in another layout than its
    # channels_last parameter is copied into DDP's bucket: correct, a little slower, and said
    # (as the warning itself says) "not an error". Kept out of the run's output.
    warnings.filterwarnings("ignore", message="Grad strides do not match bucket view strides")
    return wrapped


def register_compression(
    model: DistributedDataParallel, ddp: DDPConfig, group=None, link=None, fp32_sum=False
) -> None:
    """ddp.gradient_compression as a DDP communication hook: it replaces the reducer's bucket
    all-reduce (and its division by the world size) with its own. `link` (a simulated slow link,
    parallel/slowlink.py) delays each bucket's completion by its payload at the link's rate.
    fp32_sum: with no compression, bf16 buckets are summed in fp32 (fp32_sum_hook)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    kind = ddp.gradient_compression
    wide = fp32_sum and kind == "none"
    hooks = {
        "none": fp32_sum_hook if wide else default_hooks.allreduce_hook,
        "fp16": default_hooks.fp16_compress_hook,
        "bf16": default_hooks.bf16_compress_hook,
        "int8": int8_hook,
    }
    if kind in hooks and (kind != "none" or link is not None or wide):
        hook = hooks[kind]
        if link is not None:
            import torch.distributed as dist

            size = wire_bytes(ddp, next(model.parameters()).dtype, fp32_sum)
            n = dist.get_world_size(group)
            wire = n - 1 if kind == "int8" else 2 * (n - 1) / n  # all-gather / ring all-reduce
            hook = link.wrap_hook(hook, size, wire)
        model.register_comm_hook(group, hook)
    elif kind == "powersgd":
        state = powerSGD_hook.PowerSGDState(
            process_group=group,
            matrix_approximation_rank=ddp.powersgd_rank,
            start_powerSGD_iter=ddp.powersgd_start_step,
        )
        model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)


def fp32_sum_hook(group, bucket):  # no annotation: DDP checks a real one, and ours is a string
    """A bucket of bf16 gradients (train.bf16_weights) all-reduced in fp32 and rounded back to
    bf16 once: each rank's gradient widened and divided by the world size, then summed, so the
    mean has one bf16 rounding where a bf16 all-reduce would round after every addition of its
    ring (the fp32 masters are there to keep such small differences). Twice a bf16 all-reduce's
    bytes, as much as fp32 weights' gradients."""
    import torch.distributed as dist

    g = bucket.buffer()
    wide = g.float().div_(dist.get_world_size(group))
    fut = dist.all_reduce(wide, group=group, async_op=True).get_future()
    return fut.then(lambda f: g.copy_(f.value()[0]))


def broadcast_masters(masters: dict, group=None) -> None:
    """train.bf16_weights' fp32 masters made the group's first rank's on every rank, as DDP
    made the bf16 weights at construction: each rank derived its masters from its own fp32
    weights before that, and a rank whose weights differed would otherwise step from its own
    master and write it back into the weights. One broadcast a tensor, at start-up (a flat
    copy would hold every master twice)."""
    import torch.distributed as dist

    src = dist.get_global_rank(group, 0) if group is not None else 0
    for master in masters.values():
        dist.broadcast(master, src=src, group=group)


INT8_CHUNK = 512  # elements per int8 scale: 4 bytes of scale per 512 of payload (+0.8%)


def int8_hook(group, bucket):  # no annotation: DDP checks a real one, and ours is a string
    """8-bit gradient compression for DDP: the bucket cut into chunks of INT8_CHUNK elements,
    each chunk's scale the largest |gradient| in it on any rank (one all-reduce of the scales),
    each rank's chunk rounded to int8 in [-127, 127] and all-gathered, the sum dequantised and
    divided by the world size here. Rounding errs by at most half a step per rank, so the mean
    errs by at most its chunk's scale / 254 per element. A scale per chunk, not per bucket: one
    scale set by a bucket's largest gradient rounded a language model's many small ones to zero
    (0.27 nats lost, benchmarks/results/2026-12-01-cpu/sync_modes). (PyTorch's
    quantization_pertensor_hook fails on torch 2.14's gloo futures; this one runs its two
    collectives in order and hands DDP a completed future.)"""
    import torch.distributed as dist

    g = bucket.buffer()
    world = dist.get_world_size(group)
    n = g.numel()
    chunks = -(-n // INT8_CHUNK)
    flat = torch.zeros(chunks * INT8_CHUNK, dtype=torch.float32, device=g.device)
    flat[:n] = g.detach().reshape(-1)
    rows = flat.view(chunks, INT8_CHUNK)
    scale = rows.abs().amax(dim=1)
    dist.all_reduce(scale, op=dist.ReduceOp.MAX, group=group)
    step = (torch.clamp(scale, min=torch.finfo(torch.float32).tiny) / 127.0).unsqueeze(1)
    q = torch.round(rows / step).clamp_(-127, 127).to(torch.int8)
    gathered = [torch.empty_like(q) for _ in range(world)]
    dist.all_gather(gathered, q, group=group)
    total = torch.stack(gathered).sum(dim=0, dtype=torch.int32).float()
    mean = (total * (step / world)).reshape(-1)[:n]
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(mean.view_as(g).to(g.dtype))
    return fut


def bytes_per_element(kind: str, dtype: torch.dtype) -> float | None:
    """What each gradient element costs in the all-reduce under `kind` (the tensors handed to
    the collectives; a bucket's one scale aside). None for PowerSGD: its factors' size depends
    on every matrix's shape and the rank."""
    size = torch.tensor([], dtype=dtype).element_size()
    return {"none": size, "fp16": 2, "bf16": 2, "int8": 1 + 4 / INT8_CHUNK}.get(kind)


def wire_bytes(ddp: DDPConfig, dtype: torch.dtype, fp32_sum: bool = False) -> float | None:
    """What each gradient element costs in DDP's all-reduce: bytes_per_element of what travels,
    fp32 where fp32_sum_hook widens bf16 gradients (train.bf16_weights, no compression)."""
    wide = fp32_sum and ddp.gradient_compression == "none"
    return bytes_per_element(ddp.gradient_compression, torch.float32 if wide else dtype)


def rank_local_buffers(model: nn.Module) -> list[str]:
    """The names of the buffers modules declare their rank's own (`rank_local_buffers`, a
    tuple of attribute names): DDP neither broadcasts nor averages them."""
    return [
        f"{path}.{name}" if path else name
        for path, module in model.named_modules()
        for name in getattr(module, "rank_local_buffers", ())
    ]


def average_buffers(model: nn.Module, group=None) -> None:
    """Make every rank's floating-point buffers (BatchNorm running mean and variance) the mean
    over the data-parallel ranks (`group`; None: all), in one all-reduce per dtype. Used when DDP
    does not broadcast them each step (ddp.broadcast_buffers=false), before the model is
    evaluated or saved."""
    import torch.distributed as dist
    from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

    if not (dist.is_available() and dist.is_initialized()):
        return
    size = dist.get_world_size(group)
    if size == 1:
        return
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    plain = unwrap(model)
    local = {id(plain.get_buffer(name)) for name in rank_local_buffers(plain)}
    for buf in plain.buffers():
        if buf.is_floating_point() and id(buf) not in local:
            by_dtype.setdefault(buf.dtype, []).append(buf)
    for bufs in by_dtype.values():
        flat = _flatten_dense_tensors([b.detach() for b in bufs])
        dist.all_reduce(flat, group=group)  # SUM then divide: gloo has no AVG
        flat /= size
        with torch.no_grad():
            for b, mean in zip(bufs, _unflatten_dense_tensors(flat, bufs), strict=True):
                b.copy_(mean)
