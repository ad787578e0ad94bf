"""DataConfig and the loaders built from it: source -> prepared dataset -> sampler -> DataLoader."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.data import DataLoader

from paratrain.config.data import DataConfig
from paratrain.data import sources
from paratrain.data.samplers import (
    EpochSampler,
    RoundRobinSampler,
    build_sampler,
    held_out_batch,
)
from paratrain.data.transforms import Prepared
from paratrain.errors import UserError


@dataclass
class Data:
    train: DataLoader
    val: DataLoader | None
    sampler: EpochSampler
    source: sources.ImageSource

    def rows(self) -> dict[str, int]:
        """Samples in the training and held-out sets (all ranks'), for the run's plan."""
        val = len(self.val.dataset) if self.val is not None else 0
        return {"train": len(self.train.dataset), "val": val}


def load_source(cfg: DataConfig, seed: int) -> sources.ImageSource:
    if cfg.source == "mnist":
        src = sources.load_mnist(cfg.path)
    elif cfg.source == "mnist-sample":
        src = sources.load_mnist_sample()
    elif cfg.source == "imagefolder":
        src = sources.load_imagefolder(
            cfg.path,
            cfg.val_path,
            cfg.val_fraction,
            cfg.channels or 3,
            seed,
            skip_bad=cfg.bad_images == "skip",
        )
    else:
        src = sources.load_synthetic(
            cfg.synthetic_samples, cfg.channels or 1, cfg.synthetic_size, cfg.num_classes, seed
        )
    if cfg.limit_samples is not None and cfg.limit_samples < len(src.train):
        src.train = torch.utils.data.Subset(src.train, range(cfg.limit_samples))
    return src


def loader_workers(asked: int) -> int:
    """data.num_workers, capped to the cores this process may run on: more workers than cores
    only contend (DataLoader warns of it), as on a 2-core machine with the default 4."""
    from paratrain.distributed.host import cores

    return min(asked, cores())


def rank_loaders(
    train_set,
    val_set,
    cfg: DataConfig,
    *,
    sampler: str,
    rank: int,
    world: int,
    seed: int,
    loader_batch: int,
    even_val: bool,
    **loader_kw,
):
    """A data-parallel rank's training loader (its shard of each epoch's order, drop_last: every
    step one shape, every rank the same step count) and held-out loader (round-robin, not
    shuffled; even_val: the same batch count on every rank, for forwards that are collectives),
    over map-style data sets -> (train, val or None, the epoch sampler). loader_kw: collate_fn
    and the like, for both."""
    order = EpochSampler(
        build_sampler(
            sampler, len(train_set), rank=rank, world=world, shuffle=cfg.shuffle, seed=seed
        )
    )
    train = DataLoader(
        train_set,
        batch_size=loader_batch,
        sampler=order,
        drop_last=True,
        generator=torch.Generator().manual_seed(seed + rank),
        **loader_kw,
    )
    val = None
    if val_set is not None:
        held_out, size = held_out_order(len(val_set), world, rank, loader_batch, even_val)
        val = DataLoader(val_set, batch_size=size, sampler=held_out, **loader_kw)
    return train, val, order


def held_out_order(n: int, world: int, rank: int, batch: int, even: bool):
    """-> (this rank's held-out sampler, its batch size): every sample scored once; `even`
    (forwards that are collectives): the same number of batches on every rank too."""
    size = held_out_batch(n, world, batch) if even else batch
    cut = even and size == 0  # fewer samples than ranks: equal shares, the rest left out
    order = RoundRobinSampler(n, world, rank, shuffle=False, even=cut)
    return order, size or batch


class OnDevice:
    """A loader whose batches come out on the device: move(batch) -> the moved batch."""

    def __init__(self, loader, move):
        self.loader, self.move = loader, move

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        for batch in self.loader:
            yield self.move(batch)


def build_data(
    cfg: DataConfig,
    *,
    sampler_mode: str,
    rank: int,
    world: int,
    seed: int,
    device: torch.device,
    loader_batch: int,
    even_val: bool = False,
) -> Data:
    src = load_source(cfg, seed)
    on_cpu = cfg.resize_on == "cpu"
    train_set = Prepared(src.train, cfg.image_size, src.mean, src.std, on_cpu)
    if len(train_set) < loader_batch * (world if sampler_mode != "full" else 1):
        raise UserError(
            f"data.batch_size: {len(train_set)} training samples are fewer than one batch on every"
            f" rank ({loader_batch} x {world}); lower the batch size"
        )
    sampler = EpochSampler(
        build_sampler(
            sampler_mode, len(train_set), rank=rank, world=world, shuffle=cfg.shuffle, seed=seed
        )
    )
    pin = cfg.pin_memory and device.type == "cuda"  # pinning needs an accelerator to pin for
    common = dict(
        num_workers=loader_workers(cfg.num_workers),
        pin_memory=pin,
        persistent_workers=cfg.persistent_workers,
        prefetch_factor=cfg.prefetch_factor,
    )
    # drop_last: every step has the same shape (and under DDP every rank the same step count).
    # The generator gives workers their base seed without drawing from the global RNG, so a
    # resumed run's dropout stream is not shifted by when its loader iterator was created.
    train = DataLoader(
        train_set,
        batch_size=loader_batch,
        sampler=sampler,
        drop_last=True,
        generator=torch.Generator().manual_seed(seed + rank),
        **common,
    )
    val = None
    if src.val is not None:
        val_set = Prepared(src.val, cfg.image_size, src.mean, src.std, on_cpu)
        val_sampler, size = held_out_order(len(val_set), world, rank, loader_batch, even_val)
        val = DataLoader(
            val_set,
            batch_size=size,
            sampler=val_sampler,
            generator=torch.Generator().manual_seed(seed + rank),
            **common,
        )
    return Data(train, val, sampler, src)
