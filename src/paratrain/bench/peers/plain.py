"""Plain PyTorch DDP, written the way seed 000 shows it and nothing more: a per-sample Dataset
resized on the CPU in the loader workers, DistributedSampler with set_epoch, DDP, autocast and a
GradScaler for fp16, then zero_grad / backward / step.

    python -m torch.distributed.run --standalone --nproc-per-node=N \
        -m paratrain.bench.peers.plain CONFIG_YAML OUT_DIR
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DistributedSampler

from paratrain.bench.peers import common


def main() -> None:
    cfg, out_dir = common.read_args("plain")
    rank, local_rank, world_size = common.world()
    device = common.pick_device(cfg, local_rank)
    backend = "nccl" if device.type == "cuda" else "gloo"
    if "WORLD_SIZE" in os.environ:
        dist.init_process_group(backend)  # torchrun's env:// rendezvous
    else:  # started without torchrun: a group of one, so the code below stays the same
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    common.set_float32_mode(cfg.precision, device)
    torch.manual_seed(cfg.seed)  # same initial weights on every rank (DDP broadcasts them too)

    source = common.load_source(cfg)
    dataset = common.PeerImages(source, cfg)
    sampler = DistributedSampler(
        dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=cfg.seed
    )
    loader = common.image_loader(dataset, cfg, device, sampler)
    pin = loader.pin_memory  # as the loader applied it (False on a CPU)

    model = common.build_model(cfg.model.name, source.num_classes).to(device)
    model = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None)
    optimizer = common.build_optimizer(model.parameters(), cfg)
    amp_dtype = common.AUTOCAST.get(cfg.precision)
    scaler = common.grad_scaler(cfg, device)
    total = common.planned_steps(cfg, len(loader))
    meter = common.Meter(device, cfg.train.warmup_steps, total)

    model.train()
    meter.start()
    epoch = 0
    while meter.steps < total:
        sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank
        for images, labels in loader:
            images = images.to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True)
            optimizer.zero_grad()
            with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
                loss = F.cross_entropy(model(images), labels)
            scaler.scale(loss).backward()  # DDP all-reduces gradient buckets during backward
            scaler.step(optimizer)
            scaler.update()
            meter.step(loss)
            if meter.steps == total:
                break
        epoch += 1

    summary = meter.summary(cfg.data.batch_size, world_size)
    if rank == 0:
        effective = {"pin_memory": pin, "num_workers": cfg.data.num_workers}
        common.write_result(
            out_dir, "plain", cfg, device, world_size, summary, backend=backend, effective=effective
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
