"""Speed of light: one process, one device, one synthetic batch made once on the device and
trained on again and again. No loader, no host-to-device copy, no communication: the ceiling
that the data path and the parallel loops are measured against. It honours the compute knobs
(precision, channels_last, torch.compile with its mode and options, cudnn_benchmark, the layer
swaps model.depthwise_conv and model.batchnorm): the same model step. With train.profile_steps,
the steps right after warm-up are profiled (profile.txt in OUT_DIR, as paratrain run writes it)
and left out of the measurement.

    python -m paratrain.bench.peers.sol CONFIG_YAML OUT_DIR
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from paratrain.bench.peers import common
from paratrain.errors import UserError
from paratrain.meters.profiling import StepProfiler
from paratrain.models import apply_layer_swaps


def main() -> None:
    cfg, out_dir = common.read_args("sol")
    device = common.pick_device(cfg, 0)
    common.set_float32_mode(cfg.precision, device)
    torch.backends.cudnn.benchmark = cfg.train.cudnn_benchmark
    torch.manual_seed(cfg.seed)

    # The source only tells the class count and one process's epoch length (for epochs mode).
    source = common.load_source(cfg)
    n_train = min(cfg.data.limit_samples or len(source.train), len(source.train))
    batch = cfg.data.batch_size
    total = common.planned_steps(cfg, n_train // batch)
    side = common.image_side(cfg)
    layout = torch.channels_last if cfg.train.channels_last else torch.contiguous_format

    model = common.build_model(cfg.model.name, source.num_classes)
    try:
        apply_layer_swaps(model, cfg.model)  # as paratrain's models.build_model does
    except UserError as e:
        common.fail(str(e))
    model = model.to(device, memory_format=layout)
    if cfg.train.compile:
        # compiled on the first step, inside the warm-up; the same mode paratrain would use
        model = torch.compile(model, **cfg.train.compile_kwargs())
    optimizer = common.build_optimizer(model.parameters(), cfg)
    amp_dtype = common.AUTOCAST.get(cfg.precision)
    # Keep the scaler for fp16: its unscale and inf check are part of a real fp16 step's cost.
    scaler = common.grad_scaler(cfg, device)
    images = torch.randn(batch, 1, side, side, device=device).contiguous(memory_format=layout)
    labels = torch.randint(0, source.num_classes, (batch,), device=device)
    warmup, profiled = cfg.train.warmup_steps, cfg.train.profile_steps
    meter = common.Meter(device, warmup + profiled, total)
    profiler = StepProfiler(device, profiled, out_dir, is_main=True)

    model.train()
    meter.start()
    for step in range(total):
        if step == warmup:
            profiler.start()
        optimizer.zero_grad()
        with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            loss = F.cross_entropy(model(images), labels)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        if step + 1 == warmup + profiled:
            profiler.stop()  # before meter.step opens the measured window: its work is not timed
        meter.step(loss)
    profiler.stop()  # a run too short to reach its measured steps

    summary = meter.summary(batch, 1)
    summary["profile"] = profiler.summary
    common.write_result(
        out_dir,
        "sol",
        cfg,
        device,
        1,
        summary,
        data_real=False,
        image_side=side,
        channels_last=cfg.train.channels_last,
        compile=cfg.train.compile,
        compile_mode=cfg.train.compile_mode if cfg.train.compile else None,
        compile_options=cfg.train.compile_options if cfg.train.compile else None,
    )


if __name__ == "__main__":
    main()
