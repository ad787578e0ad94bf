"""Checkpoints resumed on another layout (DCP reshards on load), against one process straight:
one process -> a 2-stage pipeline -> FSDP over 2 -> one process again.

The sample order is the same global order whatever the layout: an epoch's permutation comes
from the seed, a data-parallel rank reads its share of each global batch, and a checkpoint
records how many samples of the epoch were trained (samples_in_epoch), which the next layout
skips. Exact when the global batch (data.batch_size x data-parallel ranks) is the same on both
sides, as here; with another global batch the resumed run starts at the nearest step boundary
before that position. The random streams restart (a new layout has other ranks); these runs
draw none (no dropout, synthetic rows).
"""

import pytest
from conftest import TINY_LM, final_weights, max_abs_diff, read_result, run_cli, train

from paratrain.config import load_config

pytestmark = pytest.mark.dist

LM = [*TINY_LM, "train.lr=0.01", "lora.enabled=false", "checkpoint.every_steps=2"]
TOL = 1e-4  # AdamW over a different reduction order (see test_model_parallel.py)


def single(out, *settings):
    train(load_config(None, [*LM, *settings, f"output_dir={out}"]))
    return out


def parallel(out, nproc, *settings):
    sets = [a for s in [*LM, *settings] for a in ("--set", s)]
    return run_cli(["run", *sets, "--nproc", nproc, "--output-dir", out])


def step(run_dir, n):
    return run_dir / "checkpoints" / f"step_{n:08d}"


def test_one_process_to_a_pipeline_to_fsdp_and_back_to_one_process(tmp_path):
    """Steps 1-2 in one process, 3-4 in a 2-stage pipeline (1 -> 2, each stage loading its own
    layers), 5-6 under FSDP over 2 (pipeline -> FSDP; its checkpoints saved asynchronously), 7-8 in one process (2 -> 1); against one
    process straight to step 8."""
    straight = single(tmp_path / "straight", "data.batch_size=4", "train.max_steps=8")
    single(tmp_path / "a", "data.batch_size=4", "train.max_steps=2")
    p = parallel(
        tmp_path / "b",
        2,
        *("strategy=pipeline", "pipeline.microbatches=2", "data.batch_size=4"),
        *("train.max_steps=4", f"checkpoint.resume={step(tmp_path / 'a', 2)}"),
    )
    assert "resharded to pp=2" in p.stdout, p.stdout[-2000:]
    p = parallel(
        tmp_path / "c",
        2,
        *("strategy=fsdp", "data.batch_size=2", "train.max_steps=6"),
        "checkpoint.async_mode=async",  # written by a thread while FSDP trains on
        f"checkpoint.resume={step(tmp_path / 'b', 4)}",
    )
    assert "resharded to dp_shard=2" in p.stdout, p.stdout[-2000:]
    last = single(
        tmp_path / "d",
        *("data.batch_size=4", "train.max_steps=8"),
        f"checkpoint.resume={step(tmp_path / 'c', 6)}",
    )
    assert read_result(last)["summary"]["steps_this_run"] == 2
    assert max_abs_diff(final_weights(last), final_weights(straight)) < TOL
