"""strategy=pipeline on 2 CPU processes (gloo): the tiny CNN cut into 2 stages, micro-batches on
GPipe and 1F1B schedules, against a single-process run on the whole batch; a checkpoint merged
from the stages resumes the pipeline and loads into any strategy."""

import pytest
from conftest import TINY, final_weights, max_abs_diff, read_ckpt, read_result, run_cli

pytestmark = pytest.mark.dist

# The tiny CNN has no BatchNorm: 4 micro-batches of 8 give the gradient of one batch of 32 (the
# schedule averages them), to rounding. Momentum makes the optimizer state matter on resume.
COMMON = [*TINY, "--set", "data.limit_samples=512", "--set", "train.momentum=0.9"]
COMMON += ["--set", "data.batch_size=32", "--set", "train.max_steps=12"]
TOL = 1e-5


def test_pipeline_stages_equal_single_and_resume_from_merged_checkpoints(tmp_path):
    single, gpipe, resumed = tmp_path / "single", tmp_path / "gpipe", tmp_path / "resumed"
    run_cli(["run", *COMMON, "--output-dir", single])
    pipe = ["--set", "strategy=pipeline", "--nproc", "2", "--set", "pipeline.microbatches=4"]
    run_cli(
        ["run", *COMMON, *pipe, "--set", "pipeline.schedule=gpipe"]
        + ["--set", "checkpoint.every_steps=6", "--set", "checkpoint.keep=0"]
        + ["--output-dir", gpipe]
    )
    # the stages' parts merged: the whole model under its own parameter names
    assert max_abs_diff(final_weights(gpipe), final_weights(single)) < TOL
    r = read_result(gpipe)
    assert r["summary"]["optimizer_steps"] == 12
    assert abs(r["summary"]["train_loss"] - read_result(single)["summary"]["train_loss"]) < 1e-4
    # the other schedule and another cut (the tiny CNN's 3 blocks as 1 + 2, not 2 + 1), resumed
    # from the step-6 checkpoint: the optimizer state came back too, whichever rank holds it now
    mid = gpipe / "checkpoints" / "step_00000006"
    run_cli(
        ["run", *COMMON, *pipe, "--set", "pipeline.schedule=1f1b", "--resume", mid]
        + ["--set", "pipeline.boundaries=[1]", "--output-dir", resumed]
    )
    assert max_abs_diff(final_weights(resumed), final_weights(single)) < TOL
    state = read_ckpt(mid)
    assert len(state["rng"]) == 2 and any(".momentum_buffer" in k for k in state["optimizer"])


def test_pipeline_held_out_accuracy_matches_single(tmp_path):
    """Every stage reads the same held-out batches (the last one short, padded); the last counts."""
    evals = ["--set", "train.eval=true", "--set", "train.max_steps=16"]
    run_cli(["run", *COMMON, *evals, "--output-dir", tmp_path / "single"])
    pipe = ["--set", "strategy=pipeline", "--nproc", "2", "--set", "pipeline.microbatches=2"]
    run_cli(["run", *COMMON, *evals, *pipe, "--output-dir", tmp_path / "pipe"])
    a = read_result(tmp_path / "single")["summary"]["val_accuracy"]
    b = read_result(tmp_path / "pipe")["summary"]["val_accuracy"]
    assert a == b and 0 < a < 1
