"""Image classification: MNIST / ImageFolder / synthetic images, torchvision or user models;
cross-entropy, held-out accuracy."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from paratrain.config.data import IMAGE_SOURCES
from paratrain.config.keys import IMAGE_UNREAD
from paratrain.config.model import IMAGE_MODELS
from paratrain.data import images
from paratrain.data.device import DeviceLoader
from paratrain.data.loader import build_data
from paratrain.data.sources import FolderImages, find_mnist_files
from paratrain.distributed import process_group as pg
from paratrain.errors import DataError, UserError
from paratrain.models import build_model, resolve_builder
from paratrain.models.vision import VisionSpec
from paratrain.protocols import BuildContext, Layout, Machine, PipelineHooks, Task, Workload


def check(cfg, layout: Layout) -> None:
    """Config-time checks of this task (ValueError naming the field)."""
    if cfg.data.bad_images == "skip" and cfg.data.source != "imagefolder":
        raise ValueError(
            f"data.bad_images: skip leaves out an imagefolder's unreadable files; "
            f"data.source is {cfg.data.source}"
        )
    if cfg.data.resize_on == "gpu" and cfg.device == "cpu":
        raise ValueError("data.resize_on: gpu needs a CUDA device, got device=cpu; use cpu")
    if cfg.model.depthwise_conv == "shift-add" and not cfg.train.compile:
        raise ValueError(
            "model.depthwise_conv: shift-add is written for torch.compile to fuse (eagerly "
            "it is slower than native); set train.compile=true"
        )


RESULTS = "benchmarks/results/2026-12-03-h200x1/issue34/"  # MobileNetV2 at 500 px, calls 27-37


def levers(cfg, layout: Layout, machine: Machine) -> dict[str, tuple[object, str]]:
    """train.compile=auto's companions for image models on a GPU (runplan/levers.py): NHWC,
    cuDNN's timed algorithms, CUDA graphs (every batch one shape: the loader drops the last
    partial one), and for MobileNetV2 on large images paratrain's Triton depthwise, stem and
    BatchNorm kernels, as measured together (4.16-4.26x the seed's script on one H200)."""
    if machine.device != "cuda":
        return {}
    m, t = cfg.model, cfg.train
    conv = m.name in IMAGE_MODELS or m.name.startswith("timm:")
    out: dict[str, tuple[object, str]] = {
        "train.channels_last": (conv, "NHWC feeds cuDNN's tensor-core convolutions directly")
        if conv
        else (False, "your builder's model may not be a conv net; set it true if it is"),
        "train.cudnn_benchmark": (True, "one image size: cuDNN times its algorithms once")
        if not t.deterministic
        else (False, "train.deterministic: cuDNN's timed picks may differ between runs"),
    }
    graphs = t.compile is True and t.grad_accum_steps == 1 and not t.activation_checkpointing
    out["train.compile_mode"] = (
        (
            "reduce-overhead",
            "every batch has one shape: CUDA graphs replay the step's kernels without "
            "launching each (1,836 against 1,781 img/s, benchmarks/results/2026-11-30-h200x2/)",
        )
        if graphs
        else ("default", "CUDA graphs need a compiled step of one micro-batch, no recompute")
    )
    out.update(image_kernels(cfg, layout, machine))
    return out


def image_kernels(cfg, layout: Layout, machine: Machine) -> dict[str, tuple[object, str]]:
    """paratrain's Triton depthwise / stem / BatchNorm kernels where they were measured to pay:
    MobileNetV2, bf16, a GPU with Triton, images from model.shift_add_min_side pixels up."""
    m, d = cfg.model, cfg.data
    side = d.image_size or (d.synthetic_size if d.source == "synthetic" else 28)
    why = None
    if m.name != "mobilenet_v2":
        why = f"measured on MobileNetV2's depthwise layers only, not {m.name}"
    elif not machine.kernels:
        why = "paratrain's Triton kernels need a GPU of compute capability 8.0+ with Triton"
    elif cfg.precision != "bf16":
        why = f"measured in bf16, not {cfg.precision}"
    elif side < m.shift_add_min_side:
        why = f"{side} px images: below model.shift_add_min_side={m.shift_add_min_side}"
    elif not layout.uses <= {"single", "ddp"}:
        why = "measured in one process and under DDP only"
    elif cfg.train.channels_last is False:
        why = "the Triton kernels read channels_last tensors"
    if why:
        return {k: (PLAIN_KERNELS[k], why) for k in PLAIN_KERNELS}
    out: dict[str, tuple[object, str]] = {
        "model.depthwise_conv": (
            "triton",
            f"cuDNN's depthwise kernels are slow from {m.shift_add_min_side} px up; one pass "
            f"over each tensor instead ({RESULTS})",
        ),
        "model.batchnorm": (
            "triton",
            "BatchNorm + ReLU6 as two passes over the channels_last tensor",
        )
        if not m.sync_batchnorm
        else ("native", "model.sync_batchnorm takes PyTorch's BatchNorm"),
    }
    gray = (d.channels or (3 if d.source == "imagefolder" else 1)) == 1
    out["model.stem_conv"] = (
        ("depthwise", "the one-channel stem as a depthwise pass (cuDNN's needs a layout change)")
        if gray and m.depthwise_conv != "native"
        else ("native", "the stem reads 3 channels" if not gray else "depthwise_conv is native")
    )
    return out


PLAIN_KERNELS = {"model.depthwise_conv": "native", "model.stem_conv": "native"}
PLAIN_KERNELS["model.batchnorm"] = "native"


def preflight(cfg, layout: Layout, cuda: bool) -> None:
    """Missing files are named now, in one line, not by N workers; only their presence is
    checked (the workers read them), so a 60,000-image data set is not loaded twice."""
    if not cuda and cfg.data.resize_on == "gpu":
        raise UserError("data.resize_on: gpu needs a GPU and none is in use; use cpu")
    if cfg.data.source == "mnist":
        for train_split in (True, False):
            find_mnist_files(cfg.data.path, train_split)
    elif cfg.data.source == "imagefolder":
        if not Path(cfg.data.path).is_dir():
            raise UserError(
                f"data.path: no such folder {cfg.data.path} (one sub-folder of images per class)"
            )
        check_images(cfg.data)
    resolve_builder(cfg.model.name)  # a user's "module:function" that does not import


def check_images(d) -> None:
    """Every file of the ImageFolder(s) opened and verified (data/images.py), once, before any
    process starts: data.bad_images=error refuses the run naming them; skip says how many the
    run leaves out."""
    images.clear()  # this run's files as they are now
    for key, root in (("data.path", d.path), ("data.val_path", d.val_path)):
        if not root:
            continue
        paths = FolderImages(root, 3).paths()
        bad = images.bad_files(root, paths, progress=True)
        if not bad:
            continue
        count = f"{len(bad):,} image{'s' if len(bad) != 1 else ''}"
        if d.bad_images == "error":
            raise DataError(
                f"{key}: {count} of {len(paths):,} in {root} cannot be read: "
                f"{images.named(bad, root)}. Replace or remove them, or set "
                "data.bad_images=skip to train without them"
            )
        print(
            f"data: skipped {count} of {len(paths):,} in {key}={root} that cannot be read "
            f"(data.bad_images=skip): {images.named(bad, root)}",
            flush=True,
        )


# Models and data sources built with torchvision (timm's import it too); the tiny CNN on
# mnist-sample or synthetic images needs none of it, and its import (~1.5 s of CPU) is most of
# such a short run's start.
TORCHVISION_MODELS = tuple(m for m in IMAGE_MODELS if m != "tiny_cnn")
TORCHVISION_SOURCES = ("mnist", "imagefolder")


def footprint(cfg) -> dict[str, int] | None:
    """The model's parameters and one sample's saved activations (Task.footprint), counted
    without data (models/footprint.py); paratrain's own builders only: a user's builder runs in the run's processes,
    not before they start."""
    from paratrain.models.footprint import counted

    d = cfg.data
    if cfg.model.name not in IMAGE_MODELS:
        return None
    channels = d.channels or (3 if d.source == "imagefolder" else 1)
    side = d.image_size or (d.synthetic_size if d.source == "synthetic" else 28)  # MNIST's
    classes = d.num_classes if d.source in ("synthetic", "imagefolder") else 10

    def step(model):
        x = torch.empty(1, channels, side, side)
        return F.cross_entropy(model(x), torch.zeros(1, dtype=torch.long))

    def build():
        return build_model(cfg.model, classes, channels)

    return counted(build, step, input_bytes=channels * side * side * 4)


def imports(cfg) -> tuple[str, ...]:
    """torchvision where the model or the data source is built with it."""
    name = cfg.model.name
    vision = name in TORCHVISION_MODELS or name.startswith("timm:")
    return ("torchvision",) if vision or cfg.data.source in TORCHVISION_SOURCES else ()


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


class ImageClassification:
    """One rank's image classifier: its model, its images as device loaders, and what the
    trainer calls (loss, evaluate), built once by `build` (the tasks' one shape, as gan.py's)."""

    def __init__(self, ctx: BuildContext):
        cfg, policy, device = ctx.cfg, ctx.policy, ctx.device
        self.cfg, self.policy, self.device = cfg, policy, device
        self.data = build_images(ctx)
        source = self.data.source
        model = build_model(cfg.model, source.num_classes, source.channels)
        model = model.to(device=device, dtype=policy.param_dtype)
        if cfg.train.channels_last:
            model = model.to(memory_format=torch.channels_last)
        self.model = model

    def device_loader(self, loader, prefetch: bool) -> DeviceLoader:
        return image_loader(self.cfg, self.data, loader, self.device, self.policy, prefetch)

    def loss(self, model, batch):
        x, y = batch
        logits = model(x)
        return F.cross_entropy(logits, y.to(logits.device)), None  # strategy=split: on its GPU

    @torch.no_grad()
    def evaluate(self, model, loader) -> dict[str, float]:
        """Held-out accuracy; each rank scores its shard, the counts are summed over ranks."""
        model.eval()
        sums = {"correct": 0.0, "total": 0.0}
        for x, y in loader:
            with self.policy.autocast():
                for key, value in score(model(x), y).items():
                    sums[key] += value
        totals = pg.all_reduce_sum([float(sums["correct"]), sums["total"]], self.device)
        return summarize(dict(zip(("correct", "total"), totals, strict=True)))

    def workload(self) -> Workload:
        data = self.data
        return Workload(
            model=self.model,
            spec=VisionSpec(),
            train=self.device_loader(data.train, self.cfg.data.prefetch_to_device),
            val=self.device_loader(data.val, False) if data.val is not None else None,
            sampler=data.sampler,
            loss=self.loss,
            evaluate=self.evaluate,
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


def build(ctx: BuildContext) -> Workload:
    return ImageClassification(ctx).workload()


TASK = Task(
    name="image_classification",
    reads=IMAGE_SOURCES,
    layouts=frozenset({"single", "dp", "ddp", "fsdp", "pp", "split"}),
    check=check,
    preflight=preflight,
    build=build,
    describes="images -> class scores, cross-entropy, held-out accuracy",
    levers=levers,
    refusals={
        "tp": "tensor parallelism splits language models' projections; image models train "
        "with ddp, fsdp, pipeline or split"
    },
    unread=("lora", "gan", *IMAGE_UNREAD),
    family=VisionSpec.traits,
    imports=imports,
    footprint=footprint,
)
