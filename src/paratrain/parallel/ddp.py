"""The replicating data-parallel wrappers: nn.DataParallel (one process) and
DistributedDataParallel over the mesh's data-parallel group, with its communication hooks."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel


@dataclass(kw_only=True)
class DDPConfig:
    """DistributedDataParallel's settings (strategies ddp-full, ddp-rr, ddp-ds)."""

    bucket_cap_mb: float = 25.0
    """Gradient bucket size (MiB): a bucket is all-reduced as soon as its gradients are ready, so
    smaller buckets start communicating earlier in backward, with more calls."""
    gradient_as_bucket_view: bool = False
    """Gradients are views into the all-reduce buckets: no copy into and out of them, less memory."""
    static_graph: bool = False
    """The model uses the same parameters every step: DDP skips per-step bookkeeping."""
    broadcast_buffers: bool = True
    """Copy rank 0's buffers (BatchNorm running statistics) to every rank before each forward, as
    DDP does by default. false skips that collective (and its per-buffer copies, which made a
    compiled MobileNetV2 step host-bound: 1,455 -> 1,781 img/s on one H200 with the two settings
    above): each rank keeps the statistics of its own batches, which training in train mode does
    not read; paratrain averages them over the ranks before each evaluation and checkpoint."""
    gradient_compression: Literal["none", "fp16", "bf16", "int8", "powersgd"] = "none"
    """How gradients travel in the all-reduce (DDP communication hooks from
    torch.distributed.algorithms.ddp_comm_hooks): none, as computed (fp32 for fp32 weights);
    fp16 / bf16, each bucket cast to 16 bits for the all-reduce and back (half the bytes, the
    rounding of a 16-bit number); int8, every 512 gradients scaled by their largest on any rank
    and sent as 8-bit integers (an all-gather: the seed's 8-bit quantisation, about a quarter of
    fp32's bytes; every element within its chunk's max|g| / 254 of the exact mean); powersgd,
    each gradient matrix sent as a low-rank product (PowerSGD with error feedback: far fewer
    bytes, an approximation the next steps correct)."""
    powersgd_rank: int = 1
    """PowerSGD: the rank of the approximation (higher: closer to the exact gradient, more bytes)."""
    powersgd_start_step: int = 10
    """PowerSGD: plain all-reduces for this many steps first (at least 2), while the gradients
    change fastest."""
    split_compiled_graph: bool = True
    """With train.compile: split the compiled graph at bucket boundaries (TorchDynamo's
    DDPOptimizer) so the all-reduce of early buckets overlaps the rest of backward. false keeps
    one graph (more fusion, fewer launches); the all-reduce then waits for the whole backward,
    which costs little when the gradients are small."""

    def __post_init__(self) -> None:
        if self.bucket_cap_mb <= 0:
            raise ValueError(f"bucket_cap_mb: must be > 0, got {self.bucket_cap_mb}")
        if self.powersgd_rank < 1:
            raise ValueError(f"powersgd_rank: must be >= 1, got {self.powersgd_rank}")
        if self.powersgd_start_step < 2:
            # PowerSGDState refuses 1 with error feedback: the first step builds its state
            raise ValueError(f"powersgd_start_step: must be >= 2, got {self.powersgd_start_step}")


def apply_dp(model: nn.Module, device: torch.device) -> nn.Module:
    # DataParallel replicates the module onto every visible GPU on each forward and gathers the
    # outputs on GPU 0: one Python process drives all GPUs, which is why DDP beats it.
    if device.type != "cuda":
        return model  # DataParallel without GPUs is the module itself; say so instead of wrapping
    return nn.DataParallel(model)


def apply_ddp(
    model: nn.Module, device: torch.device, ddp: DDPConfig | None = None, group=None, link=None
) -> nn.Module:
    """DDP over `group` (the mesh's data-parallel ranks; None: all of them). It broadcasts the
    group's first rank's weights at construction, then all-reduces gradients in buckets during
    backward, overlapping communication with the rest of the backward pass."""
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
    wrapped = DistributedDataParallel(
        model,
        device_ids=ids,
        process_group=group,
        bucket_cap_mb=ddp.bucket_cap_mb,
        gradient_as_bucket_view=ddp.gradient_as_bucket_view,
        static_graph=ddp.static_graph,
        **{sync_kw: ddp.broadcast_buffers},
    )
    register_compression(wrapped, ddp, group, link)
    return wrapped


def register_compression(
    model: DistributedDataParallel, ddp: DDPConfig, group=None, link=None
) -> None:
    """ddp.gradient_compression as a DDP communication hook: it replaces the reducer's bucket
    all-reduce (and its division by the world size) with its own. `link` (a simulated slow link,
    parallel/slowlink.py) delays each bucket's completion by its payload at the link's rate."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    kind = ddp.gradient_compression
    hooks = {
        "none": default_hooks.allreduce_hook,
        "fp16": default_hooks.fp16_compress_hook,
        "bf16": default_hooks.bf16_compress_hook,
        "int8": int8_hook,
    }
    if kind in hooks and (kind != "none" or link is not None):
        hook = hooks[kind]
        if link is not None:
            import torch.distributed as dist

            dtype = next(model.parameters()).dtype
            n = dist.get_world_size(group)
            wire = n - 1 if kind == "int8" else 2 * (n - 1) / n  # all-gather / ring all-reduce
            hook = link.wrap_hook(hook, bytes_per_element(kind, dtype), wire)
        model.register_comm_hook(group, hook)
    elif kind == "powersgd":
        state = powerSGD_hook.PowerSGDState(
            process_group=group,
            matrix_approximation_rank=ddp.powersgd_rank,
            start_powerSGD_iter=ddp.powersgd_start_step,
        )
        model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)


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
    for buf in unwrap(model).buffers():
        if buf.is_floating_point():
            by_dtype.setdefault(buf.dtype, []).append(buf)
    for bufs in by_dtype.values():
        flat = _flatten_dense_tensors([b.detach() for b in bufs])
        dist.all_reduce(flat, group=group)  # SUM then divide: gloo has no AVG
        flat /= size
        with torch.no_grad():
            for b, mean in zip(bufs, _unflatten_dense_tensors(flat, bufs), strict=True):
                b.copy_(mean)


def unwrap(model: nn.Module) -> nn.Module:
    """The user's module under DP/DDP and torch.compile wrappers, and under wrappers without
    parameters of their own that name the module inside (`state_dict_root`: the causal LM's loss
    wrapper), so checkpoints carry the model's own parameter names whatever wraps it."""
    while True:
        if isinstance(model, (nn.DataParallel, DistributedDataParallel)):
            model = model.module
        elif hasattr(model, "_orig_mod"):
            model = model._orig_mod
        elif getattr(model, "state_dict_root", None):
            model = getattr(model, model.state_dict_root)
        else:
            return model
