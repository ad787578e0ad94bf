import pytest
import torch

from paratrain.data.samplers import EpochSampler, FullSampler, RoundRobinSampler, build_sampler


def shards(mode, n, world, epoch=0, shuffle=True):
    out = []
    for rank in range(world):
        s = build_sampler(mode, n, rank=rank, world=world, shuffle=shuffle, seed=3)
        s.set_epoch(epoch)
        out.append(list(s))
    return out


@pytest.mark.parametrize("mode", ["distributed", "round-robin"])
@pytest.mark.parametrize("world", [2, 4])
def test_ddp_ds_and_rr_partition_the_data(mode, world):
    n = 96
    parts = shards(mode, n, world)
    assert all(len(p) == n // world for p in parts)
    flat = [i for p in parts for i in p]
    assert sorted(flat) == list(range(n))  # disjoint and complete


def test_full_gives_every_rank_everything():
    parts = shards("full", 50, 4)
    assert all(sorted(p) == list(range(50)) for p in parts)
    assert all(p == parts[0] for p in parts)  # same order: pure redundancy


def test_round_robin_takes_every_wth_position_without_shuffle():
    parts = shards("round-robin", 10, 3, shuffle=False)
    assert parts == [[0, 3, 6], [1, 4, 7], [2, 5, 8]]  # even lengths: 9 is left for next epoch


def test_round_robin_eval_keeps_remainder():
    s = [list(RoundRobinSampler(10, 3, r, shuffle=False, even=False)) for r in range(3)]
    assert s == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]


@pytest.mark.parametrize("mode", ["distributed", "round-robin"])
def test_shards_of_a_step_are_the_single_rank_batch(mode):
    """W ranks with batch b see, at every step, exactly the samples one rank with batch W*b sees."""
    n, world, b = 64, 2, 4
    single = list(FullSampler(n, seed=3))
    parts = shards(mode, n, world)
    for step in range(n // (world * b)):
        union = sorted(i for p in parts for i in p[step * b : (step + 1) * b])
        assert union == sorted(single[step * world * b : (step + 1) * world * b])


def test_epochs_reshuffle_and_set_epoch_is_deterministic():
    a, b = shards("distributed", 40, 2, epoch=0), shards("distributed", 40, 2, epoch=1)
    assert a != b and shards("distributed", 40, 2, epoch=1) == b


def test_epoch_sampler_skips_for_resume():
    base = FullSampler(20, seed=1)
    s = EpochSampler(base)
    s.set_epoch(2)
    whole = list(s)
    s.set_epoch(2, skip=8)
    assert list(s) == whole[8:] and len(s) == 12
    s.set_epoch(3)
    assert len(list(s)) == 20


def test_distributed_sampler_is_torchs():
    s = build_sampler("distributed", 10, rank=0, world=2, shuffle=False, seed=0)
    assert isinstance(s, torch.utils.data.DistributedSampler)
