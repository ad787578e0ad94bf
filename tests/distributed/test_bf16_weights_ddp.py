"""train.bf16_weights under DDP, on CPU processes (gloo): the ranks' bf16 gradients are summed in
fp32 and rounded to bf16 once (parallel/ddp.py's fp32_sum_hook), and a run trains as one process
with the whole batch does, to the same distance the fp32-weights recipe keeps."""

import os

import pytest
import torch
import torch.distributed as dist
from conftest import (
    TINY_LM,
    last_checkpoint,
    max_abs_diff,
    read_ckpt,
    run_cli,
    spawn_ranks,
)
from torch import nn

from paratrain.cli import main
from paratrain.config.parallel import DDPConfig
from paratrain.parallel.ddp import apply_ddp, broadcast_masters, fp32_sum_hook

pytestmark = pytest.mark.dist

WORLD, N = 3, 4096  # three ranks: a ring all-reduce in bf16 rounds after each of its additions


def rank_gradient(rank: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(10 + rank)
    return torch.randn(N, generator=g).to(torch.bfloat16)


class Bucket:
    """What the hook reads of DDP's GradBucket: its flat buffer."""

    def __init__(self, buffer):
        self._buffer = buffer

    def buffer(self):
        return self._buffer


def _rank(rank: int, init: str, out) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=WORLD)
    g = rank_gradient(rank)
    mean = fp32_sum_hook(None, Bucket(g)).wait()
    masters = {"w": torch.full((3,), float(rank)), "b": torch.arange(2.0) + rank}
    broadcast_masters(masters)
    got = [t.tolist() for t in masters.values()]
    out.put((rank, (mean.dtype == torch.bfloat16, mean.float().tolist(), got)))
    out.close()
    out.join_thread()
    dist.barrier()
    os._exit(0)  # no gloo teardown at exit (test_sync_modes.py says why)


def beyond_half_ulp(got: torch.Tensor, exact: torch.Tensor, terms: torch.Tensor) -> int:
    """How many elements of bf16 `got` are more than half a bf16 step from the exact value
    (more than a correct rounding errs), with fp32's own rounding of the sum of `terms` (the
    sum of the addends' magnitudes: cancelling addends leave fp32 errors of their size) as
    slack."""
    nearest = exact.to(torch.bfloat16).double().abs().clamp(min=2.0**-126)
    step = 2.0 ** (torch.floor(torch.log2(nearest)) - 7)  # bf16's spacing at each value
    return int(((got.double() - exact).abs() > step / 2 + terms * 2.0**-21).sum())


def test_fp32_sum_hook_rounds_the_mean_once_and_masters_follow_rank_0(tmp_path):
    got = spawn_ranks(_rank, WORLD, tmp_path)
    assert all(g[2] == [[0.0] * 3, [0.0, 1.0]] for g in got.values())  # rank 0's masters
    exact = sum(rank_gradient(r).double() for r in range(WORLD)) / WORLD
    terms = sum(rank_gradient(r).double().abs() for r in range(WORLD)) / WORLD
    for rank, (is_bf16, mean, _) in got.items():
        assert is_bf16, rank
        assert beyond_half_ulp(torch.tensor(mean, dtype=torch.float64), exact, terms) == 0, rank
    # and the check can fail: the mean summed in bf16, one rounding per addition, errs more
    in_bf16 = torch.zeros(N, dtype=torch.bfloat16)
    for r in range(WORLD):
        in_bf16 = in_bf16 + rank_gradient(r) / WORLD
    assert beyond_half_ulp(in_bf16, exact, terms) > 500


def test_ddp_registers_the_fp32_sum_for_bf16_weights(one_rank_group):
    """The hook apply_ddp registers: fp32_sum_hook for bf16 weights, bf16's own compression
    when asked for, none (the reducer's plain all-reduce) otherwise."""

    def hook(**kw):
        model = nn.Linear(4, 4).to(torch.bfloat16)
        ddp = apply_ddp(model, torch.device("cpu"), **kw)
        return ddp._get_ddp_logging_data().get("comm_hook") or None

    assert hook(fp32_sum=True) == "fp32_sum_hook"
    assert hook(fp32_sum=True, ddp=DDPConfig(gradient_compression="bf16")) == "bf16_compress_hook"
    assert hook() is None


LM = [*TINY_LM, "lora.enabled=false", "precision=bf16", "train.optimizer=adamw"]
LM += ["train.max_grad_norm=1.0", "train.eval=false", "train.max_steps=6"]


def run(out, *settings, nproc=None):
    args = [a for s in [*LM, *settings] for a in ("--set", s)]
    if nproc:
        run_cli(["run", *args, "--nproc", nproc, "--output-dir", out])
    else:
        assert main(["run", *args, "--output-dir", str(out)]) == 0
    return read_ckpt(last_checkpoint(out))


def masters(ckpt) -> dict:
    return {k: v for k, v in ckpt["optimizer"].items() if k.endswith(".master")}


def test_ddp_trains_like_one_process(tmp_path):
    """The pieces together, end to end: 2 ranks x 4 rows against one process with the 8 rows,
    as close as the fp32-weights recipe's DDP run is to its one process (bf16 forwards over
    half batches round otherwise; 0.00264 against 0.00265 here), and closer than one process
    with 4 rows (other data) is; the checkpoint holds bf16 weights and fp32 masters. It does not
    tell the hook's sum from a bf16 all-reduce (with two ranks both round one addition once,
    and AdamW barely moves for a gradient's scale): the three-rank test above does."""
    bf16 = ["train.bf16_weights=true"]
    ddp = ["strategy=ddp-ds", "data.batch_size=4"]
    straight = run(tmp_path / "ddp", *bf16, *ddp, nproc=2)
    whole = run(tmp_path / "one", *bf16, "strategy=single", "data.batch_size=8")
    half = run(tmp_path / "half", *bf16, "strategy=single", "data.batch_size=4")
    fp32_ddp = run(tmp_path / "fp32 ddp", *ddp, nproc=2)
    fp32_one = run(tmp_path / "fp32 one", "strategy=single", "data.batch_size=8")

    ours = max_abs_diff(masters(straight), masters(whole))
    recipe = max_abs_diff(fp32_ddp["model"], fp32_one["model"])
    other_data = max_abs_diff(masters(straight), masters(half))
    assert ours < 1.25 * recipe and ours < 0.5 * other_data, (ours, recipe, other_data)
    assert all(v.dtype == torch.bfloat16 for v in straight["model"].values())
    assert masters(straight) and all(v.dtype == torch.float32 for v in masters(straight).values())
