"""train.optimizer=adamw8bit (torchao's 8-bit AdamW states): trains, checkpoints the quantized
states (their class is the one non-tensor value a checkpoint may hold, loaded without running
code) and resumes bit for bit."""

from conftest import TINY_LM, max_abs_diff, train

from paratrain.checkpoint import read_checkpoint
from paratrain.config import load_config

LM = [*TINY_LM, "lora.enabled=false", "train.optimizer=adamw8bit", "checkpoint.every_steps=2"]


def run(out, *settings):
    return train(load_config(None, [*LM, *settings, f"output_dir={out}"]))


def test_eight_bit_adamw_states_checkpoint_and_resume_bit_for_bit(tmp_path):
    run(tmp_path / "straight", "train.max_steps=4")
    ckpt = tmp_path / "straight" / "checkpoints"
    resumed = run(
        tmp_path / "resumed", "train.max_steps=4", f"checkpoint.resume={ckpt / 'step_00000002'}"
    )
    assert resumed["summary"]["steps_this_run"] == 2
    a = read_checkpoint(ckpt / "step_00000004")
    b = read_checkpoint(tmp_path / "resumed" / "checkpoints" / "step_00000004")
    assert max_abs_diff(a["model"], b["model"]) == 0.0
    first = read_checkpoint(ckpt / "step_00000002")
    assert max_abs_diff(a["model"], first["model"]) > 0  # it trained
