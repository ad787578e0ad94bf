"""The collectives benchmark's arithmetic, sizes, expected values and its check."""

import pytest
import torch

from paratrain.comm import collectives as c
from paratrain.errors import UserError


def test_bus_bandwidth_factors_are_nccl_tests():
    assert c.bus_factor("all_reduce", 4) == 1.5
    assert c.bus_factor("all_gather", 4) == c.bus_factor("reduce_scatter", 4) == 0.75
    assert c.bus_factor("all_to_all", 8) == 0.875 and c.bus_factor("broadcast", 8) == 1.0


def test_sizes_and_their_spelling():
    assert c.parse_size("64K") == 65536 and c.parse_size("1G") == 2**30
    assert c.parse_size("4096") == 4096 and c.parse_size("2MiB") == 2 * 2**20
    assert c.sizes(1024, 8192) == [1024, 2048, 4096, 8192]
    for bad in ("lots", "1T", "-4K"):
        with pytest.raises(ValueError):
            c.parse_size(bad)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"ops": ["all_sum"]},
        {"dtype": "int8"},
        {"min_bytes": 8},
        {"max_bytes": 512},
        {"iters": 0},
        {"passes": 0},
    ],
)
def test_config_rejects(kwargs):
    with pytest.raises(ValueError):
        c.CommConfig(**kwargs)


@pytest.mark.parametrize("op", ["all_gather", "reduce_scatter", "all_to_all"])
def test_expected_values_are_what_the_collective_computes(op):
    """Simulate 4 ranks by hand: each rank's expected output equals the collective's definition
    applied to every rank's input."""
    n, nbytes = 4, 256
    bufs = [c._buffers(op, nbytes, torch.float32, r, n, "cpu") for r in range(n)]
    inputs = [b[0] for b in bufs]
    for r, (_, _, expect) in enumerate(bufs):
        if op == "all_gather":
            got = torch.cat(inputs)
        elif op == "reduce_scatter":
            got = torch.stack(inputs).sum(0).chunk(n)[r]
        else:  # rank r receives chunk r of every rank's input, in rank order
            got = torch.cat([x.chunk(n)[r] for x in inputs])
        assert torch.equal(got, expect), (op, r)


def test_measure_times_and_checks(one_rank_group, monkeypatch):
    cfg = c.CommConfig(iters=2, warmup=1, dtype="fp32")
    row = c.measure("all_reduce", 4096, cfg, torch.device("cpu"))
    assert row["bytes"] == 4096 and row["time_us"] > 0 and row["busbw_gbps"] == 0.0  # n = 1
    assert row["time_us_min"] <= row["time_us"] <= row["time_us_max"]
    monkeypatch.setattr(c, "_call", lambda op, x, out: out.zero_())  # a collective gone wrong
    with pytest.raises(UserError, match="all_reduce: rank 0 received wrong values"):
        c.measure("all_reduce", 4096, cfg, torch.device("cpu"))


def test_the_median_pass_is_reported(one_rank_group, monkeypatch):
    """Three passes of 1, 9 and 2 ms per call: the row says 2 ms, with 1-9 as its range."""
    ticks = iter([0.0, 0.001, 1.0, 1.009, 2.0, 2.002])
    monkeypatch.setattr(c.time, "perf_counter", lambda: next(ticks))
    row = c.measure(
        "broadcast", 1024, c.CommConfig(iters=1, warmup=0, passes=3), torch.device("cpu")
    )
    assert row["time_us"] == pytest.approx(2000)
    assert (row["time_us_min"], row["time_us_max"]) == pytest.approx((1000, 9000))
