"""The printed plan says what the user set: every lever set, as set, before the ones decided; a
resumed run prints its levers too (its config.yaml holds the decided values, which are not the
user's); a setting this model or task does not read is refused where its value switches on
what the model lacks, else said in a note."""

import pytest
from conftest import RECIPES, one_error_line

from paratrain.cli import main
from paratrain.config import from_dict
from paratrain.config.run import RunConfig
from paratrain.runplan import plan_of, resolve

TINY = str(RECIPES / "tiny_cpu.yaml")
LLAMA = str(RECIPES / "tiny_llama_python_docs_cpu.yaml")
QUICK = ["strategy=single", "log.progress=false", "data.num_workers=0", "checkpoint.keep=0"]


def sets(*settings):
    return [a for s in [*QUICK, *settings] for a in ("--set", s)]


def lever_lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip().startswith("lever")]


def test_a_lever_set_on_the_command_line_is_listed_as_set_before_the_decided_ones():
    lines = lever_lines("\n".join(plan_of(TINY, ["train.channels_last=true"]).lines()))
    assert lines[0] == "lever      train.channels_last=true (set)"
    assert lines[-1].startswith("levers     the others plain (on the cpu")
    untouched = lever_lines("\n".join(plan_of(TINY).lines()))
    assert untouched == [untouched[0]] and untouched[0].startswith("levers     plain (")


def test_a_resumed_run_prints_its_levers_line_with_what_was_set(tmp_path, capsys):
    out = tmp_path / "run"
    first = sets("train.max_steps=2", "train.channels_last=true")
    assert main(["run", TINY, *first, "--output-dir", str(out)]) == 0
    said_first = lever_lines(capsys.readouterr().out)
    assert main(["run", "--resume", str(out), "--set", "train.max_steps=3"]) == 0
    said = lever_lines(capsys.readouterr().out)
    # as the first run said it: the set lever as set, the decided ones as decided (its
    # config.yaml holds train.compile=false and the rest, which the user did not set)
    assert said == said_first
    assert said[0] == "lever      train.channels_last=true (set)"
    assert said[1].startswith("levers     the others plain (on the cpu")


def test_setting_a_lever_again_on_resume_lists_it_as_set(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", TINY, *sets("train.max_steps=2"), "--output-dir", str(out)]) == 0
    capsys.readouterr()
    again = ["--set", "train.max_steps=3", "--set", "train.cudnn_benchmark=false"]
    assert main(["run", "--resume", str(out), *again]) == 0
    said = lever_lines(capsys.readouterr().out)
    assert said[0] == "lever      train.cudnn_benchmark=false (set)" and len(said) == 2


@pytest.mark.parametrize(
    ("recipe", "setting", "needle"),
    [
        (TINY, "model.kernels=triton-loss", "a language model's kernels"),
        (TINY, "model.fp8=tensorwise", "float8"),
        (TINY, "model.loss_chunk_tokens=1024", "a chunk of tokens"),
        (LLAMA, "model.depthwise_conv=triton", "an image model's depthwise convolutions"),
        (LLAMA, "train.channels_last=true", "(NHWC)"),
        (str(RECIPES / "cases" / "gan_mnist_cpu.yaml"), "train.channels_last=true", "task gan"),
    ],
)
def test_a_setting_that_switches_on_what_the_model_lacks_is_refused_in_one_line(
    recipe, setting, needle, capsys
):
    key = setting.split("=")[0]
    assert main(["run", recipe, "--set", setting, "--print-config"]) == 2
    one_error_line(capsys, f"error: {key}: ", needle, "would change nothing", f"set {key}=")


def test_a_setting_the_task_does_not_read_is_said_in_a_note():
    image = plan_of(TINY, ["model.tokenizer=bytes", "data.max_length=64", "lora.r=4"])
    assert image.notes == (
        "model.tokenizer=bytes: task image_classification does not read it; it does nothing here",
        "data.max_length=64: task image_classification does not read it; it does nothing here",
        "lora.r=4: task image_classification does not read it; it does nothing here",
    )
    text = "\n".join(image.lines())
    assert "note       model.tokenizer=bytes: task image_classification does not read it" in text
    lm = plan_of(LLAMA, ["data.image_size=64", "model.kernels=none"])
    assert lm.notes == (
        "data.image_size=64: task causal_lm does not read it; it does nothing here",
    )


def test_the_off_value_of_another_models_setting_and_a_saved_config_say_nothing():
    """Setting model.kernels=none on an image model asks for nothing; a run folder's
    config.yaml holds every key (each lever as decided), and resolves without a note."""
    assert plan_of(TINY, ["model.kernels=none", "model.fp8=none"]).notes == ()
    for recipe in (TINY, LLAMA, str(RECIPES / "cases" / "gan_mnist_cpu.yaml")):
        plan = plan_of(recipe)
        again = resolve(from_dict(RunConfig, plan.config.to_dict()))
        assert again.notes == ()
