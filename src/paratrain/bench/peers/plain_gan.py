"""Plain PyTorch DCGAN training, written the way PyTorch's DCGAN example shows it: per-sample
transforms to [-1, 1] in the loader workers, a generator and a discriminator each with its own
Adam, the alternating step (the discriminator on real then on detached fakes, the generator
through the updated discriminator), DDP around each model when torchrun starts several
processes. The same networks and initialisation as paratrain's `gan` task (models/gan.py), so
the two rows differ in the loop only: the baseline of the GAN case study.

    python -m torch.distributed.run --standalone --nproc-per-node=N \
        -m paratrain.bench.peers.plain_gan CONFIG_YAML OUT_DIR
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler
from torchvision.transforms import v2

from paratrain.bench.peers import common
from paratrain.models.gan import GAN


class Digits(Dataset):
    """uint8 [N, 1, 28, 28] -> float in [-1, 1], one image at a time (ToTensor + Normalize(.5, .5))."""

    def __init__(self, images: torch.Tensor):
        self.images = images
        self.transform = v2.Compose(
            [v2.ToDtype(torch.float32, scale=True), v2.Normalize([0.5], [0.5])]
        )

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.transform(self.images[i])


def main() -> None:
    cfg, out_dir = common.read_args("plain_gan")
    if cfg.task != "gan" or cfg.data.source != "mnist-sample":
        common.fail("plain_gan: runs task=gan on data.source=mnist-sample")
    rank, local_rank, world_size, device = common.start(cfg)
    g = cfg.gan
    model = GAN(g.latent_dim, g.width, 1, g.norm).to(device)
    G, D = model.generator, model.discriminator
    if dist.is_initialized():
        ids = [local_rank] if device.type == "cuda" else None
        G, D = DDP(G, device_ids=ids), DDP(D, device_ids=ids)
    betas = (cfg.train.adam_beta1, cfg.train.adam_beta2)
    opt_g = torch.optim.Adam(G.parameters(), lr=cfg.train.lr, betas=betas)
    opt_d = torch.optim.Adam(D.parameters(), lr=cfg.train.lr, betas=betas)
    scaler = common.grad_scaler(cfg, device)
    dtype = common.AUTOCAST.get(cfg.precision)

    def autocast():
        return torch.autocast(device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None)

    source = common.load_source(cfg)
    n = cfg.data.limit_samples or len(source.train.images)
    dataset = Digits(source.train.images[:n])
    sampler = DistributedSampler(dataset, world_size, rank, shuffle=True, seed=cfg.seed)
    loader = DataLoader(
        dataset,
        batch_size=cfg.data.batch_size,
        sampler=sampler,
        num_workers=cfg.data.num_workers,
        pin_memory=cfg.data.pin_memory and device.type == "cuda",
        drop_last=True,
    )
    total = common.planned_steps(cfg, len(loader))
    meter = common.Meter(device, cfg.train.warmup_steps, total)
    meter.start()
    epoch = 0
    while meter.steps < total:
        sampler.set_epoch(epoch)
        for real in loader:
            if meter.steps == total:
                break
            real = real.to(device, non_blocking=True)
            z = torch.randn(len(real), g.latent_dim, 1, 1, device=device)
            # as the example: real and fake each forward and backward apart (under DDP a
            # module may not run twice before one backward)
            with autocast():
                out = D(real)
                loss_real = F.binary_cross_entropy_with_logits(out, torch.ones_like(out))
            scaler.scale(loss_real).backward()
            with autocast():
                fake = G(z)
                out = D(fake.detach())
                loss_fake = F.binary_cross_entropy_with_logits(out, torch.zeros_like(out))
            scaler.scale(loss_fake).backward()
            scaler.step(opt_d)
            opt_d.zero_grad(set_to_none=True)
            with autocast():
                out = D(fake)
                loss_g = F.binary_cross_entropy_with_logits(out, torch.ones_like(out))
            scaler.scale(loss_g).backward()
            scaler.step(opt_g)
            scaler.update()
            opt_g.zero_grad(set_to_none=True)
            opt_d.zero_grad(set_to_none=True)  # the generator's backward reached D too
            meter.step((loss_real + loss_fake + loss_g).detach())
        epoch += 1
    summary = meter.summary(cfg.data.batch_size, world_size)
    if rank == 0:
        common.write_result(out_dir, "plain_gan", cfg, device, world_size, summary)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
