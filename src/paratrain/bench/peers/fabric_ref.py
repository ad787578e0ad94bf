"""The same training through Lightning Fabric, written the way its docs show: a Fabric with the
ddp strategy and a precision plugin, setup(model, optimizer), setup_dataloaders(loader)
(Fabric swaps in a DistributedSampler and moves batches to the device), fabric.backward(loss).

    python -m torch.distributed.run --standalone --nproc-per-node=N \
        -m paratrain.bench.peers.fabric_ref CONFIG_YAML OUT_DIR
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
import torch.nn.functional as F

from paratrain.bench.peers import common

PRECISION = {"fp32": "32-true", "tf32": "32-true", "fp16": "16-mixed", "bf16": "bf16-mixed"}


def main() -> None:
    common.require("lightning")
    cfg, out_dir = common.read_args("fabric_ref")
    import lightning
    from lightning.fabric import Fabric
    from lightning.fabric.plugins import MixedPrecision

    accel = "cuda" if common.use_cuda(cfg) else "cpu"
    _, _, world_size = common.world()
    # Fabric checks devices x nodes against torchrun's WORLD_SIZE; devices is per node.
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    precision, plugins = PRECISION[cfg.precision], None
    if cfg.precision == "fp16":
        # Fabric's "16-mixed" makes a default GradScaler; the plugin carries paratrain's settings.
        scaler = torch.amp.GradScaler(
            accel,
            init_scale=cfg.scaler.init_scale,
            growth_factor=cfg.scaler.growth_factor,
            backoff_factor=cfg.scaler.backoff_factor,
            growth_interval=cfg.scaler.growth_interval,
        )
        precision, plugins = None, [MixedPrecision("16-mixed", accel, scaler=scaler)]
    fabric = Fabric(
        accelerator=accel,
        devices=per_node,
        num_nodes=world_size // per_node,
        strategy="ddp",
        precision=precision,
        plugins=plugins,
    )
    # Needed for ddp; under torchrun it starts no processes, only the process group.
    fabric.launch()
    device = fabric.device
    common.set_float32_mode(cfg.precision, device)
    torch.manual_seed(cfg.seed)

    source = common.load_source(cfg)
    dataset = common.PeerImages(source, cfg)
    loader = common.image_loader(dataset, cfg, device)
    pin = loader.pin_memory  # as the loader applied it (False on a CPU)
    model = common.build_model(cfg.model.name, source.num_classes)
    optimizer = common.build_optimizer(model.parameters(), cfg)
    model, optimizer = fabric.setup(model, optimizer)
    loader = fabric.setup_dataloaders(loader)  # DistributedSampler; set_epoch on each iter()
    total = common.planned_steps(cfg, len(loader))
    meter = common.Meter(device, cfg.train.warmup_steps, total)

    model.train()
    meter.start()
    while meter.steps < total:
        for images, labels in loader:  # already on the device
            optimizer.zero_grad()
            loss = F.cross_entropy(model(images), labels)  # the precision plugin autocasts forward
            fabric.backward(loss)  # scales the loss for fp16; DDP all-reduces here
            optimizer.step()  # the scaler's step/update for fp16
            meter.step(loss)
            if meter.steps == total:
                break

    summary = meter.summary(cfg.data.batch_size, fabric.world_size)
    if fabric.global_rank == 0:
        common.write_result(
            out_dir,
            "fabric_ref",
            cfg,
            device,
            fabric.world_size,
            summary,
            backend=dist.get_backend(),
            effective={"pin_memory": pin, "num_workers": cfg.data.num_workers},
            versions={"lightning": lightning.__version__},
        )
    fabric.barrier()
    dist.destroy_process_group()  # Fabric leaves it to the script; NCCL warns otherwise


if __name__ == "__main__":
    main()
