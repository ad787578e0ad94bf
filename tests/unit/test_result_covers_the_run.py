"""A resumed run's result covers the whole run: its epochs and losses equal an uninterrupted
run's when the weights do, and its step log holds each step once."""

import json

import torch
from conftest import TINY_LM, final_weights, max_abs_diff, train

from paratrain.checkpoint import LoopState
from paratrain.config import load_config
from paratrain.trainer.losses import RunLosses

# 4 rows a step, 20 of the 24 rows trained on (the rest held out): 5 steps an epoch
LM = [*(s for s in TINY_LM if not s.startswith("data.source")), "data.source=python-docs"]
LM += ["data.batch_size=4", "data.limit_samples=24", "lora.enabled=false", "train.eval=true"]
LM += ["checkpoint.every_steps=4", "checkpoint.keep=0", "log.every_steps=1"]


def run(out, *settings):
    return train(load_config(None, [*LM, *settings, f"output_dir={out}"]))


def logged(out) -> list[dict]:
    return [json.loads(x) for x in (out / "steps.jsonl").read_text().splitlines()]


def test_a_run_resumed_from_an_earlier_checkpoint_reports_the_whole_runs_losses(tmp_path):
    """Straight to step 14 (3 epochs, the last cut short), against a run stopped at step 13 and
    resumed in its folder from step 12's checkpoint (two epochs done, the third mid-way; as a
    restart after a kill resumes from the newest checkpoint, behind the steps logged): the
    same epochs, losses and held-out metrics, bit for bit, and a step log of steps 1 to 14,
    each once."""
    straight = run(tmp_path / "straight", "train.max_steps=14")
    out = tmp_path / "resumed"
    run(out, "train.max_steps=13")
    resumed = run(
        out, "train.max_steps=14", f"checkpoint.resume={out / 'checkpoints' / 'step_00000012'}"
    )
    assert resumed["summary"]["steps_this_run"] == 2
    assert max_abs_diff(final_weights(out), final_weights(tmp_path / "straight")) == 0

    s, r = straight["summary"], resumed["summary"]
    assert r["train_loss"] == s["train_loss"]
    assert [p["step"] for p in logged(out)] == list(range(1, 15))
    assert [p["loss"] for p in logged(out)] == [p["loss"] for p in logged(tmp_path / "straight")]

    def losses(result):
        keys = ("epoch", "train_loss", "train_loss_steps", "val_loss")
        return [{k: e.get(k) for k in keys} for e in result["epochs"]]

    assert losses(resumed) == losses(straight)
    assert [e["train_loss_steps"] for e in resumed["epochs"]] == [[1, 5], [6, 10], [11, 14]]
    assert r["train_loss_steps"] == [11, 14]


def test_a_checkpoint_without_the_losses_says_which_steps_the_loss_covers():
    """A checkpoint written before the losses were carried, resumed mid-epoch: the epoch's loss
    counts the steps from the resume on, and says so."""
    state = LoopState(step=12, epoch=2, step_in_epoch=2)
    losses = RunLosses(state, rank=0, world=1, replicas=1, device=torch.device("cpu"))
    assert losses.begin(state) == 0.0 and losses.epochs == []
    state.step, state.step_in_epoch = 14, 4
    assert losses.covered(state) == [13, 14] and losses.good_steps(state) == 2


def test_the_losses_carried_to_other_ranks_keep_the_epochs_mean():
    """Written by 2 ranks (each summing 3 steps' losses), resumed by 1: rank 0 takes the whole
    sum at this run's count of replicas, and the epoch's mean and steps go on from there."""
    cpu = torch.device("cpu")
    state = LoopState(step=8, epoch=1, step_in_epoch=3, bad_steps=[7])
    state.losses = {
        "epochs": [{"epoch": 0, "train_loss": 2.0}],
        "epoch": 1,
        "sums": [3.0, 5.0],  # 2 good steps (6 and 8; 7 skipped) of 2 ranks: mean 2.0
        "replicas": 2,
        "good": 2,
        "from_in_epoch": 0,
    }
    losses = RunLosses(state, rank=0, world=1, replicas=1, device=cpu)
    assert losses.begin(state) == 4.0 and losses.epochs == [{"epoch": 0, "train_loss": 2.0}]
    state.step, state.step_in_epoch = 10, 5
    assert losses.covered(state) == [6, 10] and losses.good_steps(state) == 4
    losses.carry(state, torch.tensor(4.0 + 2.5 + 3.5, dtype=torch.float64))
    assert state.losses["sums"] == [10.0] and state.losses["good"] == 4
    assert state.losses["from_in_epoch"] == 0 and state.losses["replicas"] == 1
