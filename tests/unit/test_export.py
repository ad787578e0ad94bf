"""`paratrain export`: a checkpoint as one consolidated model that the field's loaders read."""

import json

import torch
from conftest import TINY_LM, TINY_SETTINGS, adapter_logits, last_checkpoint, max_abs_diff, train

from paratrain.checkpoint import list_checkpoints, read_checkpoint
from paratrain.cli import main
from paratrain.config import load_config


def test_a_full_lm_checkpoint_exports_as_a_hugging_face_folder(tmp_path):
    from transformers import AutoModelForCausalLM

    run = tmp_path / "run"
    train(
        load_config(
            None, [*TINY_LM, "lora.enabled=false", "train.max_steps=2", f"output_dir={run}"]
        )
    )
    assert main(["export", str(run), str(tmp_path / "hf")]) == 0
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    held = read_checkpoint(list_checkpoints(run / "checkpoints")[-1])["model"]
    assert max_abs_diff({k: model.state_dict()[k] for k in held}, held) == 0.0
    assert json.loads((tmp_path / "hf" / "export.json").read_text())["format"] == "hf-model"


def test_a_lora_checkpoint_exports_as_a_peft_adapter_equal_to_the_runs_own(tmp_path):
    run = tmp_path / "run"
    train(load_config(None, [*TINY_LM, "train.max_steps=2", f"output_dir={run}"]))
    assert main(["export", str(run / "checkpoints"), str(tmp_path / "x" / "adapter")]) == 0
    exported, _, plain = adapter_logits(tmp_path / "x", last_checkpoint(run))
    own, _, _ = adapter_logits(run)
    assert torch.equal(exported, own) and not torch.equal(exported, plain)


def test_an_image_checkpoint_exports_as_one_safetensors_file(tmp_path):
    from safetensors.torch import load_file

    run = tmp_path / "run"
    settings = [*TINY_SETTINGS, "data.source=mnist-sample", "train.max_steps=2"]
    train(load_config(None, [*settings, f"output_dir={run}"]))
    assert main(["export", str(run), str(tmp_path / "out")]) == 0
    held = read_checkpoint(list_checkpoints(run / "checkpoints")[-1])["model"]
    assert max_abs_diff(load_file(tmp_path / "out" / "model.safetensors"), held) == 0.0


def test_export_into_a_folder_in_use_is_one_line_and_touches_nothing(tmp_path, capsys):
    run = tmp_path / "run"
    train(load_config(None, [*TINY_LM, "train.max_steps=1", f"output_dir={run}"]))
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "mine.txt").write_text("keep")
    capsys.readouterr()
    assert main(["export", str(run), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not empty" in err, err
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["mine.txt"]
