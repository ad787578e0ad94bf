"""What the peer programs share: argv and config checks, world and device, the data set, the
model, the measured window and result.json. The training loops stay in each program's own file."""

from __future__ import annotations

import importlib.util
import operator
import os
import sys
import time
from pathlib import Path
from typing import NoReturn

import torch
import torch.distributed as dist
import torchvision
from torch import nn
from torch.utils.data import DataLoader, Dataset
from torchvision.transforms import v2

from paratrain.config import RunConfig, load_config
from paratrain.errors import UserError
from paratrain.meters import metrics
from paratrain.meters.telemetry import energy_counter, energy_summary
from paratrain.trainer import config as train_config

# What the peers implement; anything else is refused (exit 2) rather than run differently.
SUPPORTED = {
    "model.name": ("mobilenet_v2", "resnet50", "tiny_cnn"),
    "data.source": ("mnist-sample", "synthetic"),
    "precision": ("fp32", "tf32", "fp16", "bf16"),
    "data.channels": (None, 1),  # the digits are grey
    "train.grad_accum_steps": (1,),  # one batch per optimizer step in every peer
}
AUTOCAST = {"fp16": torch.float16, "bf16": torch.bfloat16}


def fail(message: str) -> NoReturn:
    """A config a peer cannot run: one line, exit 2 (the sweep reports it, not a traceback)."""
    print(f"paratrain peer: error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(2)


def require(library: str) -> None:
    """Checked before any work, so a missing optional library costs the sweep nothing."""
    if importlib.util.find_spec(library) is None:
        print(f"skipped: {library} is not installed", file=sys.stderr, flush=True)
        raise SystemExit(3)


def read_plan(program: str):
    """argv CONFIG_YAML OUT_DIR -> (the run's plan, the output folder); a bad one exits 2."""
    from paratrain.runplan import resolve

    if len(sys.argv) != 3:
        fail(f"usage: python -m paratrain.bench.peers.{program} CONFIG_YAML OUT_DIR")
    try:
        cfg = load_config(sys.argv[1])
        cfg.levers = "plain"  # a reference program decides nothing (a sweep's config: settled)
        return resolve(cfg), Path(sys.argv[2])
    except UserError as e:  # ConfigError is a UserError: already one line
        fail(str(e))


def read_config(program: str) -> tuple[RunConfig, Path]:
    """argv CONFIG_YAML OUT_DIR -> (the config as it runs, the output folder)."""
    plan, out_dir = read_plan(program)
    return plan.config, out_dir


def read_args(program: str) -> tuple[RunConfig, Path]:
    """read_config, then what the image peers implement (SUPPORTED)."""
    cfg, out_dir = read_config(program)
    for key, accepted in SUPPORTED.items():
        value = operator.attrgetter(key)(cfg)
        if value not in accepted:
            names = ", ".join(map(str, accepted))
            fail(f"{key}: {value!r} is not supported by the peers; accepted: {names}")
    if program != "sol" and cfg.model.depthwise_conv != "native":
        fail("model.depthwise_conv: only paratrain and the speed-of-light program swap layers")
    if cfg.device == "cuda" and not torch.cuda.is_available():
        fail("device: cuda was asked for but no GPU is visible (check CUDA_VISIBLE_DEVICES)")
    return cfg, out_dir


def world() -> tuple[int, int, int]:
    """(rank, local_rank, world_size) as torchrun sets them; absent means one process."""
    return tuple(
        int(os.environ.get(k, d)) for k, d in (("RANK", 0), ("LOCAL_RANK", 0), ("WORLD_SIZE", 1))
    )


def start(cfg: RunConfig) -> tuple[int, int, int, torch.device]:
    """A peer's process: its device, the process group when torchrun started it, the float32
    mode, the seed -> (rank, local_rank, world_size, device)."""
    rank, local_rank, world_size = world()
    device = pick_device(cfg, local_rank)
    if "WORLD_SIZE" in os.environ:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    set_float32_mode(cfg.precision, device)
    torch.manual_seed(cfg.seed)
    return rank, local_rank, world_size, device


def use_cuda(cfg: RunConfig) -> bool:
    return cfg.device != "cpu" and torch.cuda.is_available()  # read_args refused cuda without one


def pick_device(cfg: RunConfig, local_rank: int) -> torch.device:
    if not use_cuda(cfg):
        return torch.device("cpu")
    if local_rank >= torch.cuda.device_count():
        fail(f"device: local rank {local_rank} has no GPU ({torch.cuda.device_count()} visible)")
    torch.cuda.set_device(local_rank)  # one GPU per process
    return torch.device("cuda", local_rank)


def set_float32_mode(precision: str, device: torch.device) -> None:
    # PyTorch lets cuDNN use TF32 by default; paratrain's fp32 is IEEE FP32, so the peers switch
    # it the same way or an fp32 row would compare two different arithmetics.
    if device.type == "cuda":
        torch.backends.cudnn.allow_tf32 = precision == "tf32"
        torch.set_float32_matmul_precision("high" if precision == "tf32" else "highest")


def load_source(cfg: RunConfig):
    from paratrain.data import sources

    if cfg.data.source == "mnist-sample":
        return sources.load_mnist_sample()
    d = cfg.data
    return sources.load_synthetic(d.synthetic_samples, 1, d.synthetic_size, d.num_classes, cfg.seed)


def image_side(cfg: RunConfig) -> int:
    native = 28 if cfg.data.source == "mnist-sample" else cfg.data.synthetic_size
    return cfg.data.image_size or native


class PeerImages(Dataset):
    """uint8 [N,1,H,W] digits -> float [1,S,S] per sample, resized in the loader workers."""

    def __init__(self, source, cfg: RunConfig):
        n = cfg.data.limit_samples or len(source.train.images)
        self.images, self.labels = source.train.images[:n], source.train.labels[:n]
        side = image_side(cfg)
        steps = [v2.ToDtype(torch.float32, scale=True)]
        if tuple(self.images.shape[-2:]) != (side, side):
            steps.append(v2.Resize((side, side), antialias=True))
        self.transform = v2.Compose([*steps, v2.Normalize(source.mean, source.std)])

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int):
        return self.transform(self.images[i]), int(self.labels[i])


def build_model(name: str, num_classes: int) -> nn.Module:
    """torchvision's networks with random weights and a 1-channel stem (digits are grey)."""
    if name == "tiny_cnn":
        from paratrain.models.vision import TinyCNN

        return TinyCNN(num_classes, in_channels=1)
    if name == "mobilenet_v2":
        model = torchvision.models.mobilenet_v2(weights=None, num_classes=num_classes)
        s = model.features[0][0]
        model.features[0][0] = nn.Conv2d(
            1, s.out_channels, s.kernel_size, s.stride, s.padding, bias=False
        )
        return model
    model = torchvision.models.resnet50(weights=None, num_classes=num_classes)
    s = model.conv1
    model.conv1 = nn.Conv2d(1, s.out_channels, s.kernel_size, s.stride, s.padding, bias=False)
    return model


def build_optimizer(params, cfg: RunConfig) -> torch.optim.Optimizer:
    return train_config.build_optimizer(params, cfg.train)  # the same as paratrain's own


def image_loader(
    dataset: Dataset, cfg: RunConfig, device: torch.device, sampler=None
) -> DataLoader:
    """The seed's loader: batch per process, workers, pinned memory on CUDA, whole batches only.
    Without a sampler it shuffles (Accelerate and Fabric shard it themselves)."""
    return DataLoader(
        dataset,
        batch_size=cfg.data.batch_size,
        sampler=sampler,
        shuffle=sampler is None,
        num_workers=cfg.data.num_workers,
        pin_memory=cfg.data.pin_memory
        and device.type == "cuda",  # page-locking means nothing on a CPU
        drop_last=True,
    )


def grad_scaler(cfg: RunConfig, device: torch.device) -> torch.amp.GradScaler:
    """Enabled for fp16 only; disabled, scale() returns the loss and step() is optimizer.step()."""
    return torch.amp.GradScaler(
        device.type,
        init_scale=cfg.scaler.init_scale,
        growth_factor=cfg.scaler.growth_factor,
        backoff_factor=cfg.scaler.backoff_factor,
        growth_interval=cfg.scaler.growth_interval,
        enabled=cfg.precision == "fp16",
    )


def planned_steps(cfg: RunConfig, steps_per_epoch: int) -> int:
    if steps_per_epoch < 1:
        fail(f"data.batch_size: {cfg.data.batch_size} per process leaves no full batch per epoch")
    return cfg.train.max_steps or cfg.train.epochs * steps_per_epoch


def clock(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # kernels are asynchronous: wait before reading the time
    return time.perf_counter()


class Meter:
    """Counts steps and loss; the measured window starts after `warmup` steps when more run."""

    def __init__(self, device: torch.device, warmup: int, total: int, keep_losses: bool = False):
        self.device, self.warmup, self.total, self.steps = device, warmup, total, 0
        self.loss_sum = torch.zeros((), device=device, dtype=torch.float64)  # no per-step sync
        # each step's loss, kept on the device and read once at the end (no per-step sync)
        self.losses: list[torch.Tensor] | None = [] if keep_losses else None
        self.energy = energy_counter([device])  # None off CUDA: no energy row then

    def joules(self) -> float | None:
        return self.energy() if self.energy is not None else None

    def start(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        self.t0, self.j0 = clock(self.device), self.joules()
        self.mark = (0, self.t0, self.j0) if self.warmup == 0 else None

    def step(self, loss: torch.Tensor) -> None:
        self.steps += 1
        self.loss_sum += loss.detach().double()
        if self.losses is not None:
            self.losses.append(loss.detach().float())
        if self.steps == self.warmup and self.total > self.warmup:
            self.mark = (self.steps, clock(self.device), self.joules())

    def summary(self, batch_size: int, world_size: int) -> dict:
        end, j_end = clock(self.device), self.joules()
        excluded = self.mark is not None and self.steps > self.mark[0]
        first, t_first, j_first = self.mark if excluded else (0, self.t0, self.j0)
        measured, seconds = self.steps - first, max(end - t_first, 1e-9)
        # the same window's joules, every rank's GPU summed (like paratrain's own result)
        joules = torch.tensor(
            [j_end - j_first if j_end is not None else 0.0, float(j_end is not None)],
            dtype=torch.float64,
            device=self.device,
        )
        peak, kind = metrics.peak_memory_bytes(self.device)
        loss = self.loss_sum / max(self.steps, 1)
        peak_t = torch.tensor(float(peak), dtype=torch.float64, device=self.device)
        if dist.is_initialized():  # every peer's process group is torch.distributed underneath
            dist.all_reduce(loss)
            loss /= dist.get_world_size()
            dist.all_reduce(peak_t, op=dist.ReduceOp.MAX)
            dist.all_reduce(joules)
        samples = measured * batch_size * world_size
        total, counted = joules.tolist()
        energy = (
            energy_summary(
                total, "nvml_total_energy", gpus=world_size, seconds=seconds, samples=samples
            )
            if counted == world_size
            else None
        )
        return {
            "unique_samples_per_s": samples / seconds,
            "step_time_s": seconds / max(measured, 1),
            "measured_steps": measured,
            "optimizer_steps": self.steps,
            "train_s": end - self.t0,
            "warmup_excluded": excluded,
            "peak_memory_bytes": int(peak_t.item()),
            "peak_memory_kind": kind,
            "train_loss": loss.item(),
            "val_accuracy": None,
            "energy": energy,
            **({"losses": torch.stack(self.losses).tolist()} if self.losses else {}),  # rank 0's
        }


def write_result(
    out_dir: Path, program: str, cfg: RunConfig, device, world_size: int, summary: dict, **extra
) -> None:
    payload = {
        "program": program,
        "world_size": world_size,
        "precision": cfg.precision,
        "hardware": metrics.hardware(device, world_size),
        "data_real": cfg.data.source not in ("synthetic", "synthetic-text"),
        **extra,
        "summary": summary,
        "config": cfg.to_dict(),
    }
    metrics.write_json(out_dir / "result.json", payload)
    print(
        f"paratrain peer {program} x{world_size} {cfg.precision}: {summary['optimizer_steps']} "
        f"steps, {summary['unique_samples_per_s']:,.1f} unique samples/s -> {out_dir}/result.json",
        flush=True,
    )
