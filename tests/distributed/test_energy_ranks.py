"""The run's energy is every rank's GPU summed, and no rank invents one another lacks: the
collective in trainer/result.energy on 2 gloo processes, against the one-process arithmetic."""

import pytest
import torch
import torch.distributed as dist
from conftest import spawn_ranks

from paratrain.trainer import result as results

pytestmark = pytest.mark.dist

KW = {"gpus": 2, "seconds": 4.0, "samples": 200, "tokens": 0.0, "device": torch.device("cpu")}
CASES = {"both": [300.0, 500.0], "one": [300.0, None], "none": [None, None]}  # J per rank


def _rank(rank: int, init: str, out) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        telemetry = [{"power_w_mean": 100.0 * (r + 1)} for r in range(2)]
        out.put((rank, {k: results.energy(j[rank], telemetry, 2, **KW) for k, j in CASES.items()}))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def got(tmp_path_factory):
    by_rank = spawn_ranks(_rank, 2, tmp_path_factory.mktemp("energy"), timeout=120)
    assert by_rank[0] == by_rank[1]  # every rank holds the same figures
    return by_rank[0]


def test_ranks_sum_their_counters(got):
    one = results.energy(800.0, [None], 1, **KW)  # one process that measured both GPUs
    assert got["both"] == one and got["both"]["joules_per_sample"] == 4.0


def test_a_rank_without_a_counter_gives_no_figure(got):
    assert got["one"] is None  # half a counter is not an energy; no mix with mean power


def test_no_counters_fall_back_to_mean_power(got):
    # the mean of 100 W and 200 W, x 2 GPUs x 4 s
    assert got["none"]["method"] == "mean_power_x_time" and got["none"]["joules"] == 1_200.0
