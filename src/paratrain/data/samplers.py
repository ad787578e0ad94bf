"""The seed's three ways of giving data to ranks (000 §2.1), plus the resume wrapper.

- full (seed's "DDP"): every rank iterates every index; W ranks do W times the work.
- round-robin (seed's DDP-RR): rank r takes positions r, r+W, r+2W, ... of the epoch's order.
- distributed (seed's DDP-DS): torch.utils.data.DistributedSampler, used as it is.

Shuffling uses the same recipe as DistributedSampler (torch.randperm with a generator seeded by
seed + epoch), so one rank with batch W*b sees exactly the union of what W ranks see with batch
b: that is what makes ddp-ds comparable to single in the tests.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import torch
from torch.utils.data import DistributedSampler, Sampler


def epoch_order(n: int, shuffle: bool, seed: int, epoch: int) -> list[int]:
    if not shuffle:
        return list(range(n))
    g = torch.Generator()
    g.manual_seed(seed + epoch)
    return torch.randperm(n, generator=g).tolist()


class FullSampler(Sampler[int]):
    """Every index, in the epoch's order, on every rank."""

    def __init__(self, n: int, *, shuffle: bool = True, seed: int = 0):
        self.n, self.shuffle, self.seed, self.epoch = n, shuffle, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        return iter(epoch_order(self.n, self.shuffle, self.seed, self.epoch))

    def __len__(self) -> int:
        return self.n


class RoundRobinSampler(Sampler[int]):
    """Positions rank, rank+W, rank+2W, ... of the epoch's order.

    even=True (training) cuts every rank to n // W indices: DDP ranks must run the same number of
    steps or the last all-reduce waits forever. even=False (evaluation) keeps the remainder.
    """

    def __init__(
        self,
        n: int,
        num_replicas: int,
        rank: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        even: bool = True,
    ):
        assert 0 <= rank < num_replicas
        self.n, self.world, self.rank = n, num_replicas, rank
        self.shuffle, self.seed, self.even, self.epoch = shuffle, seed, even, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        order = epoch_order(self.n, self.shuffle, self.seed, self.epoch)[self.rank :: self.world]
        return iter(order[: len(self)])

    def __len__(self) -> int:
        if self.even:
            return self.n // self.world
        return len(range(self.rank, self.n, self.world))


def held_out_batch(n: int, world: int, batch: int) -> int:
    """The held-out batch size that gives every rank the same number of batches while every
    sample is scored (a forward that is a collective, FSDP's or tensor parallelism's, must run
    as often on every rank). Round-robin shares differ by at most one sample; they take the
    same number of batches of b unless b divides the smaller share: the largest such b <= batch.
    0 when no b does (fewer samples than ranks): the caller cuts to equal shares."""
    small, large = n // world, -(-n // world)
    if small == large:
        return batch
    return next((b for b in range(batch, 1, -1) if small % b), 0)


class EpochSampler(Sampler[int]):
    """Wraps a sampler: forwards set_epoch and skips the epoch's first `skip` indices (resume)."""

    def __init__(self, base: Sampler[int]):
        self.base, self.skip = base, 0
        self.epoch = 0  # read by tasks whose samples depend on the epoch (masked_lm's masks)

    def set_epoch(self, epoch: int, skip: int = 0) -> None:
        self.epoch = epoch
        if hasattr(self.base, "set_epoch"):
            self.base.set_epoch(epoch)
        self.skip = skip

    def __iter__(self) -> Iterator[int]:
        return itertools.islice(iter(self.base), self.skip, None)

    def __len__(self) -> int:
        return max(0, len(self.base) - self.skip)


def build_sampler(
    mode: str, n: int, *, rank: int, world: int, shuffle: bool, seed: int
) -> Sampler[int]:
    if mode == "full":
        return FullSampler(n, shuffle=shuffle, seed=seed)
    if mode == "round-robin":
        return RoundRobinSampler(n, world, rank, shuffle=shuffle, seed=seed)
    if mode == "distributed":
        return DistributedSampler(
            range(n), num_replicas=world, rank=rank, shuffle=shuffle, seed=seed
        )
    raise AssertionError(mode)
