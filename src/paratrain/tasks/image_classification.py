"""Image classification: MNIST / ImageFolder / synthetic images, torchvision or user models;
cross-entropy, held-out accuracy."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from paratrain.config.data import IMAGE_SOURCES
from paratrain.data.device import DeviceLoader
from paratrain.data.loader import build_data
from paratrain.data.sources import find_mnist_files
from paratrain.distributed import process_group as pg
from paratrain.errors import UserError
from paratrain.models import build_model, resolve_builder
from paratrain.models.vision import VisionSpec
from paratrain.protocols import BuildContext, Layout, PipelineHooks, Task, Workload


def check(cfg, layout: Layout) -> None:
    """Config-time checks of this task (ValueError naming the field)."""
    if cfg.data.resize_on == "gpu" and cfg.device == "cpu":
        raise ValueError("data.resize_on: gpu needs a CUDA device, got device=cpu; use cpu")
    if cfg.model.depthwise_conv == "shift-add" and not cfg.train.compile:
        raise ValueError(
            "model.depthwise_conv: shift-add is written for torch.compile to fuse (eagerly "
            "it is slower than native); set train.compile=true"
        )


def preflight(cfg, layout: Layout, cuda: bool) -> None:
    """Missing files are named now, in one line, not by N workers; only their presence is
    checked (the workers read them), so a 60,000-image data set is not loaded twice."""
    if not cuda and cfg.data.resize_on == "gpu":
        raise UserError("data.resize_on: gpu needs a GPU and none is in use; use cpu")
    if cfg.data.source == "mnist":
        for train_split in (True, False):
            find_mnist_files(cfg.data.path, train_split)
    elif cfg.data.source == "imagefolder" and not Path(cfg.data.path).is_dir():
        raise UserError(
            f"data.path: no such folder {cfg.data.path} (one sub-folder of images per class)"
        )
    resolve_builder(cfg.model.name)  # a user's "module:function" that does not import


def loss_sum(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits, y.to(logits.device), reduction="sum")


def score(logits: torch.Tensor, y: torch.Tensor) -> dict:
    """Held-out sums of a batch; `correct` stays on the device (no sync per batch)."""
    return {"correct": (logits.argmax(dim=1) == y.to(logits.device)).sum(), "total": len(y)}


def summarize(sums: dict[str, float]) -> dict[str, float]:
    return {"val_accuracy": sums["correct"] / max(sums["total"], 1)}


def image_loader(cfg, data, loader, device, policy, prefetch: bool) -> DeviceLoader:
    """One loader of build_data's images on the device: copied, resized (resize_on=gpu) and
    normalised there (also the gan task's)."""
    return DeviceLoader(
        loader,
        device,
        dtype=policy.param_dtype,
        size=cfg.data.image_size,
        mean=data.source.mean,
        std=data.source.std,
        finish_on_device=cfg.data.resize_on == "gpu",
        non_blocking=cfg.data.non_blocking,
        channels_last=cfg.train.channels_last,
        prefetch=prefetch,
    )


def build_images(ctx: BuildContext):
    """build_data for this rank: data-parallel ranks read different batches; a pipeline's
    stages and a tensor-parallel group's ranks read the same ones (the first stage uses the
    images, the last the labels). Also the gan task's."""
    return build_data(
        ctx.cfg.data,
        sampler_mode=ctx.layout.sampler,
        rank=ctx.dp_rank,
        world=ctx.dp_size,
        seed=ctx.cfg.seed,
        device=ctx.device,
        loader_batch=ctx.loader_batch,
        # a forward that is a collective (FSDP) needs the same held-out batch count everywhere
        even_val=ctx.even_val,
    )


def build(ctx: BuildContext) -> Workload:
    cfg, policy, device = ctx.cfg, ctx.policy, ctx.device
    data = build_images(ctx)
    model = build_model(cfg.model, data.source.num_classes, data.source.channels)
    model = model.to(device=device, dtype=policy.param_dtype)
    if cfg.train.channels_last:
        model = model.to(memory_format=torch.channels_last)

    def device_loader(loader, prefetch: bool) -> DeviceLoader:
        return image_loader(cfg, data, loader, device, policy, prefetch)

    def loss(model, batch):
        x, y = batch
        logits = model(x)
        return F.cross_entropy(logits, y.to(logits.device)), None  # strategy=split: on its GPU

    @torch.no_grad()
    def evaluate(model, loader) -> dict[str, float]:
        """Held-out accuracy; each rank scores its shard, the counts are summed over ranks."""
        model.eval()
        sums = {"correct": 0.0, "total": 0.0}
        for x, y in loader:
            with policy.autocast():
                for key, value in score(model(x), y).items():
                    sums[key] += value
        totals = pg.all_reduce_sum([float(sums["correct"]), sums["total"]], device)
        return summarize(dict(zip(("correct", "total"), totals, strict=True)))

    return Workload(
        model=model,
        spec=VisionSpec(),
        train=device_loader(data.train, cfg.data.prefetch_to_device),
        val=device_loader(data.val, False) if data.val is not None else None,
        sampler=data.sampler,
        loss=loss,
        evaluate=evaluate,
        pipeline=PipelineHooks(
            split=lambda batch: (batch[0], batch[1], len(batch[1])),
            loss_sum=loss_sum,
            score=score,
            summarize=summarize,
            score_keys=("correct", "total"),
        ),
        info={
            "data_real": data.source.real,
            "pin_memory": data.train.pin_memory,
            "num_classes": data.source.num_classes,
        },
        rows=data.rows(),
    )


TASK = Task(
    name="image_classification",
    reads=IMAGE_SOURCES,
    layouts=frozenset({"single", "dp", "ddp", "fsdp", "pp", "split"}),
    check=check,
    preflight=preflight,
    build=build,
    describes="images -> class scores, cross-entropy, held-out accuracy",
    refusals={
        "tp": "tensor parallelism splits language models' projections; image models train "
        "with ddp, fsdp, pipeline or split"
    },
)
