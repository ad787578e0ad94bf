"""paratrain from Python: paratrain.train(recipe, {"dotted.key": value}) runs what `paratrain
run` runs and returns the result; a mistake raises UserError with the command's one line."""

import pytest
from conftest import RECIPES, TINY_LM

import paratrain


def settings(out, **more):
    base = dict(s.split("=", 1) for s in TINY_LM)
    return {**base, "train.max_steps": 2, "output_dir": str(out), **more}


def test_train_in_this_process_returns_the_result(tmp_path):
    result = paratrain.train(RECIPES / "tiny_lora_cpu.yaml", settings(tmp_path / "a"))
    assert result["summary"]["optimizer_steps"] == 2
    assert (tmp_path / "a" / "result.json").is_file()
    cfg = paratrain.load_config(None, {"train.lr": 0.5, "lora.enabled": False})
    assert cfg.train.lr == 0.5 and cfg.lora.enabled is False


def test_a_mistake_raises_one_line(tmp_path):
    with pytest.raises(paratrain.UserError, match="train.lr") as e:
        paratrain.train(None, settings(tmp_path / "b", **{"train.lr": float("nan")}))
    assert "\n" not in str(e.value)


@pytest.mark.dist
def test_train_on_two_processes_from_python(tmp_path):
    result = paratrain.train(
        RECIPES / "tiny_lora_cpu.yaml",
        settings(tmp_path / "c", **{"strategy": "ddp-ds", "launch.nproc": 2}),
    )
    assert result["world_size"] == 2 and result["summary"]["optimizer_steps"] == 2
