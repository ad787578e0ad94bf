"""strategy=pipeline on 2 CPU processes (gloo): the tiny CNN cut into 2 stages, micro-batches on
GPipe and 1F1B schedules, against a single-process run on the whole batch (weights, loss and
held-out accuracy); a checkpoint merged from the stages resumes the pipeline and loads into any
strategy."""

import pytest
from conftest import TINY, final_weights, max_abs_diff, read_ckpt, read_result, run_cli, train

from paratrain.config import load_config

pytestmark = pytest.mark.dist

# The tiny CNN has no BatchNorm: 4 micro-batches of 8 give the gradient of one batch of 32 (the
# schedule averages them), to rounding. Momentum makes the optimizer state matter on resume.
COMMON = [*TINY, "--set", "data.limit_samples=512", "--set", "train.momentum=0.9"]
COMMON += ["--set", "data.batch_size=32", "--set", "train.max_steps=12"]
TOL = 1e-5
EVAL = ["--set", "train.eval=true"]


def test_pipeline_stages_equal_single_and_resume_from_merged_checkpoints(tmp_path):
    """Also held-out accuracy: every stage reads the same held-out batches (the last one short,
    padded to the batch the stages' buffers were sized for); the last stage counts."""
    single, gpipe, resumed = tmp_path / "single", tmp_path / "gpipe", tmp_path / "resumed"
    # the reference: one process, in this one (COMMON's settings without their "--set")
    train(load_config(None, [*COMMON[1::2], *EVAL[1::2], f"output_dir={single}"]))
    pipe = ["--set", "strategy=pipeline", "--nproc", "2", "--set", "pipeline.microbatches=4"]
    run_cli(
        ["run", *COMMON, *EVAL, *pipe, "--set", "pipeline.schedule=gpipe"]
        + ["--set", "checkpoint.every_steps=6", "--set", "checkpoint.keep=0"]
        + ["--output-dir", gpipe]
    )
    # the stages' parts merged: the whole model under its own parameter names
    assert max_abs_diff(final_weights(gpipe), final_weights(single)) < TOL
    r, alone = read_result(gpipe)["summary"], read_result(single)["summary"]
    assert r["optimizer_steps"] == 12
    assert abs(r["train_loss"] - alone["train_loss"]) < 1e-4
    assert r["val_accuracy"] == alone["val_accuracy"] and 0 < alone["val_accuracy"] < 1
    # the other schedule and another cut (the tiny CNN's 3 blocks as 1 + 2, not 2 + 1), resumed
    # from the step-6 checkpoint: the optimizer state came back too, whichever rank holds it now
    mid = gpipe / "checkpoints" / "step_00000006"
    run_cli(
        ["run", *COMMON, *EVAL, *pipe, "--set", "pipeline.schedule=1f1b", "--resume", mid]
        + ["--set", "pipeline.boundaries=[1]", "--output-dir", resumed]
    )
    assert max_abs_diff(final_weights(resumed), final_weights(single)) < TOL
    assert read_result(resumed)["summary"]["val_accuracy"] == alone["val_accuracy"]
    state = read_ckpt(mid)
    assert len(state["rng"]) == 2 and any(".momentum_buffer" in k for k in state["optimizer"])
