"""The same training through Hugging Face Accelerate, written the way its docs show: an
Accelerator with mixed_precision, prepare(model, optimizer, dataloader) (Accelerate shards the
loader and wraps the model in DDP itself), accelerator.backward(loss).

    python -m torch.distributed.run --standalone --nproc-per-node=N \
        -m paratrain.bench.peers.accelerate_ref CONFIG_YAML OUT_DIR
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from paratrain.bench.peers import common

MIXED = {"fp32": "no", "tf32": "no", "fp16": "fp16", "bf16": "bf16"}


def main() -> None:
    common.require("accelerate")
    cfg, out_dir = common.read_args("accelerate_ref")
    import accelerate
    from accelerate import Accelerator
    from accelerate.utils import GradScalerKwargs

    use_cpu = not common.use_cuda(cfg)
    # Accelerate builds its own GradScaler for fp16; these kwargs give it paratrain's settings.
    scaler_kwargs = GradScalerKwargs(
        init_scale=cfg.scaler.init_scale,
        growth_factor=cfg.scaler.growth_factor,
        backoff_factor=cfg.scaler.backoff_factor,
        growth_interval=cfg.scaler.growth_interval,
    )
    try:
        accelerator = Accelerator(
            mixed_precision=MIXED[cfg.precision], cpu=use_cpu, kwargs_handlers=[scaler_kwargs]
        )
    except ValueError as e:  # e.g. a precision this Accelerate refuses on this device
        common.fail(f"precision: {cfg.precision}: Accelerate refused it ({e})")
    if MIXED[cfg.precision] != "no" and not accelerator.native_amp:
        # Accelerate runs fp16 on a CPU as plain fp32 (no autocast, no scaler): refuse to
        # report fp32 numbers under an fp16 label.
        common.fail(f"precision: Accelerate has no {cfg.precision} on {accelerator.device.type}")
    device, world_size = accelerator.device, accelerator.num_processes
    common.set_float32_mode(cfg.precision, device)
    torch.manual_seed(cfg.seed)

    source = common.load_source(cfg)
    dataset = common.PeerImages(source, cfg)
    # An ordinary shuffled loader: prepare() hands each process its own share of the batches.
    loader = common.image_loader(dataset, cfg, device)
    pin = loader.pin_memory  # as the loader applied it (False on a CPU)
    model = common.build_model(cfg.model.name, source.num_classes)
    optimizer = common.build_optimizer(model.parameters(), cfg)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    total = common.planned_steps(cfg, len(loader))
    meter = common.Meter(device, cfg.train.warmup_steps, total)

    model.train()
    meter.start()
    epoch = 0
    while meter.steps < total:
        loader.set_epoch(epoch)  # Accelerate also counts epochs itself; this makes it explicit
        for images, labels in loader:  # already on the device
            optimizer.zero_grad()
            loss = F.cross_entropy(model(images), labels)  # prepare() put autocast in forward
            accelerator.backward(loss)  # scales the loss for fp16; DDP all-reduces here
            optimizer.step()  # the scaler's step/update for fp16
            meter.step(loss)
            if meter.steps == total:
                break
        epoch += 1

    summary = meter.summary(cfg.data.batch_size, world_size)
    if accelerator.is_main_process:
        common.write_result(
            out_dir,
            "accelerate_ref",
            cfg,
            device,
            world_size,
            summary,
            backend=str(accelerator.state.backend),
            effective={"pin_memory": pin, "num_workers": cfg.data.num_workers},
            versions={"accelerate": accelerate.__version__},
        )
    accelerator.end_training()  # destroys the process group


if __name__ == "__main__":
    main()
