"""Image classification: MNIST / ImageFolder / synthetic images, torchvision or user models."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from paratrain import dist as pdist
from paratrain.data.device import DeviceLoader
from paratrain.data.loader import build_data
from paratrain.models import build_model
from paratrain.parallel import STRATEGIES
from paratrain.tasks import Workload


def build(cfg, env: pdist.DistEnv, sampler_mode: str, policy, loader_batch: int) -> Workload:
    # A pipeline's stages all read the same batches (the first uses the images, the last the
    # labels), the held-out ones too: its data is one replica's.
    pipelined = STRATEGIES[cfg.strategy].pipelined
    data = build_data(
        cfg.data,
        sampler_mode=sampler_mode,
        rank=0 if pipelined else env.rank,
        world=1 if pipelined else env.world_size,
        seed=cfg.seed,
        device=env.device,
        loader_batch=loader_batch,
    )
    model = build_model(cfg.model, data.source.num_classes, data.source.channels)
    model = model.to(device=env.device, dtype=policy.param_dtype)
    if cfg.train.channels_last:
        model = model.to(memory_format=torch.channels_last)

    def device_loader(loader, prefetch: bool) -> DeviceLoader:
        return DeviceLoader(
            loader,
            env.device,
            dtype=policy.param_dtype,
            size=cfg.data.image_size,
            mean=data.source.mean,
            std=data.source.std,
            finish_on_device=cfg.data.resize_on == "gpu",
            non_blocking=cfg.data.non_blocking,
            channels_last=cfg.train.channels_last,
            prefetch=prefetch,
        )

    def loss(model, batch):
        x, y = batch
        return F.cross_entropy(model(x), y), None

    @torch.no_grad()
    def evaluate(model, loader) -> dict[str, float]:
        """Held-out accuracy; each rank scores its shard, the counts are summed over ranks."""
        model.eval()
        correct = torch.zeros((), device=env.device, dtype=torch.float64)
        total = 0
        for x, y in loader:
            with policy.autocast():
                correct += (model(x).argmax(dim=1) == y).sum()
            total += len(y)
        c, n = pdist.all_reduce_sum([correct.item(), float(total)], env.device)
        return {"val_accuracy": c / max(n, 1)}

    return Workload(
        model=model,
        train=device_loader(data.train, cfg.data.prefetch_to_device),
        val=device_loader(data.val, False) if data.val is not None else None,
        sampler=data.sampler,
        loss=loss,
        evaluate=evaluate,
        info={
            "data_real": data.source.real,
            "pin_memory": data.train.pin_memory,
            "num_classes": data.source.num_classes,
        },
    )
