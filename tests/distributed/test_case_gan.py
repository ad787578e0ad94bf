"""Seed 001 §6's GAN case study on 2 CPU processes (gloo): the two models' alternating step
against one process with the 2x batch, DDP's checkpoint resumed under FSDP, the sample grids."""

import math

import pytest
from conftest import final_weights, launch, max_abs_diff, read_result, run_cli, sets

from paratrain.cli import main

pytestmark = pytest.mark.dist

# fp32 SGD on the CPU: two ranks sum gradients in another order than one process (~1e-8 seen
# after 3 steps; the GAN's game amplifies rounding, so the runs stay short)
TOL = 1e-5


# gan.norm=none: BatchNorm would normalise each rank's half alone (see GanConfig.norm)
GAN = [
    "task=gan",
    "device=cpu",
    "data.source=mnist-sample",
    "data.limit_samples=256",
    "data.num_workers=0",
    "gan.norm=none",
    "gan.width=8",
    "gan.latent_dim=16",
    "gan.grid=4",
    "train.optimizer=sgd",
    "train.lr=0.1",
    "train.max_steps=3",
    "train.eval=false",
    "train.deterministic=true",
    "log.progress=false",
]


@pytest.fixture(scope="module")
def gan_runs(tmp_path_factory):
    """One process with batch 32 and with 16 (in this process); ddp-ds on 2 ranks with 16 each,
    checkpointing at step 2."""
    base = tmp_path_factory.mktemp("gan")
    single = {}
    for b in (16, 32):
        out = base / f"single{b}"
        assert main(["run", *sets(*GAN, f"data.batch_size={b}"), "--output-dir", str(out)]) == 0
        single[b] = out
    ddp = launch(
        base / "ddp", *GAN, "strategy=ddp-ds", "data.batch_size=16", "checkpoint.every_steps=2"
    )
    return single, ddp


def test_gan_ddp_two_ranks_equals_single_with_twice_the_batch(gan_runs):
    single, ddp = gan_runs
    got, want = final_weights(ddp), final_weights(single[32])
    for part in ("generator.", "discriminator."):  # both models, each under its own DDP
        keys = [k for k in want if k.startswith(part)]
        assert keys
        assert max_abs_diff({k: got[k] for k in keys}, {k: want[k] for k in keys}) < TOL, part
        other = final_weights(single[16])  # and the check can fail
        assert max_abs_diff({k: got[k] for k in keys}, {k: other[k] for k in keys}) > 1e-4, part
    r = read_result(ddp)
    assert r["world_size"] == 2 and r["summary"]["optimizer_steps"] == 3


def test_gan_resumed_under_fsdp_continues_the_ddp_run(tmp_path, gan_runs):
    """The DDP run's step-2 checkpoint (both models, both optimizers) resumed under FSDP: the
    last step, sharded, ends where DDP's did."""
    _, ddp = gan_runs
    out = tmp_path / "fsdp"
    settings = sets(*GAN, "strategy=fsdp", "data.batch_size=16")
    ckpt = ddp / "checkpoints" / "step_00000002"
    run_cli(["run", *settings, "--nproc", 2, "--resume", ckpt, "--output-dir", out])
    r = read_result(out)
    assert r["strategy"] == "fsdp" and r["summary"]["steps_this_run"] == 1
    assert max_abs_diff(final_weights(out), final_weights(ddp)) < TOL


def test_gan_learns_and_draws_a_grid_each_epoch(tmp_path, capsys):
    """Two short epochs with evaluation (in this process): both losses finite, a picture per
    epoch named as the console numbers the epoch."""
    out = tmp_path / "run"
    settings = [s for s in GAN if not s.startswith(("train.max_steps", "train.eval"))]
    extra = ["data.batch_size=32", "train.epochs=2", "data.val_fraction=0.1"]
    assert main(["run", *sets(*settings, *extra), "--output-dir", str(out)]) == 0
    epochs = read_result(out)["epochs"]
    assert len(epochs) == 2
    for e in epochs:
        assert math.isfinite(e["val_d_loss"]) and math.isfinite(e["val_g_loss"])
        assert 0.0 <= e["val_d_accuracy"] <= 1.0
    assert sorted(p.name for p in (out / "samples").iterdir()) == ["epoch_0.png", "epoch_1.png"]
    assert (out / "samples" / "epoch_1.png").read_bytes()[:4] == b"\x89PNG"
    d, g = epochs[-1]["val_d_loss"], epochs[-1]["val_g_loss"]
    assert f"held-out D loss {d:.4f}, G loss {g:.4f}" in capsys.readouterr().out
