"""What a run leaves behind and how much it says: a short run still has a loss curve; the
held-out set is scored whole when every rank must run as many batches (FSDP, tensor parallel);
the commands that write files write them under runs/ unless told where."""

import json
import math

import pytest
from conftest import TINY_SETTINGS, train

from paratrain.cli import build_parser
from paratrain.config import load_config
from paratrain.data.loader import held_out_order


def test_a_short_run_still_logs_a_curve(tmp_path):
    settings = [*TINY_SETTINGS, "strategy=single", "data.limit_samples=256", "train.max_steps=12"]
    train(load_config(None, [*settings, f"output_dir={tmp_path}"]))
    points = [json.loads(x) for x in (tmp_path / "steps.jsonl").read_text().splitlines()]
    assert [p["step"] for p in points] == list(range(1, 13))
    assert not (tmp_path / "flight_recorder").exists()


@pytest.mark.parametrize("n,world,batch", [(261, 2, 64), (257, 2, 64), (1000, 4, 32), (7, 3, 4)])
def test_every_held_out_sample_is_scored_in_as_many_batches_on_every_rank(n, world, batch):
    shares = [held_out_order(n, world, r, batch, even=True) for r in range(world)]
    seen = sorted(i for order, _ in shares for i in order)
    assert seen == list(range(n))  # each sample once (261 of 261, not 260)
    assert len({math.ceil(len(order) / size) for order, size in shares}) == 1
    assert all(size <= batch for _, size in shares)


def test_the_commands_that_write_files_write_them_under_runs():
    parser = build_parser()
    assert parser.parse_args(["doctor"]).out == "runs/doctor"
    assert parser.parse_args(["plan", "r.yaml"]).out is None  # runs/plan-<recipe>
    assert parser.parse_args(["tune", "r.yaml"]).out is None  # runs/tune-<recipe>


def test_fsdp2s_view_warning_is_left_out_for_the_root_alone():
    """The root's output goes into a loss that changes nothing in place: its warning is noise;
    another module's (a block feeding an in-place op) is kept."""
    import warnings

    from torch import nn

    from paratrain.trainer.setup import quiet_view_warning

    class FSDPNet(nn.Module):  # what fully_shard makes of class Net
        pass

    def warn(cls: str) -> list:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            quiet_view_warning(FSDPNet())
            warnings.warn(
                f"FSDP2-wrapped module ({cls}) returned a view tensor. ...",
                UserWarning,
                stacklevel=1,
            )
        return seen

    assert warn("FSDPNet") == []
    assert len(warn("FSDPBlock")) == 1
