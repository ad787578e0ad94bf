"""The run plan (runplan.resolve): where the model and the data come from is decided once,
printed and saved as plan.json; a model.path / data.path the user gives wins over a recipe's
named shape or fileless source; a conflict is refused in one line, exit 2, nothing written."""

import json

import pytest
import torch
from conftest import RECIPES, make_mnist_dir, same_plan, write_alpaca

from paratrain.cli import main
from paratrain.runplan import plan_of

QUICK = [
    *("--set", "strategy=single", "--set", "train.max_steps=3", "--set", "log.every_steps=1"),
    *("--set", "data.shuffle=false", "--set", "log.progress=false", "--set", "train.eval=false"),
    *("--set", "checkpoint.at_end=false", "--set", "log.tensorboard=false"),
]
LORA_RECIPE = RECIPES / "tiny_lora_cpu.yaml"


def hf_model(folder, seed: int):
    """A Hugging Face folder (tiny Llama + byte tokenizer), as a user's own model would be."""
    from paratrain.data.text.tokenizer import byte_tokenizer
    from paratrain.models.causal_lm.build import build_causal_lm

    torch.manual_seed(seed)
    build_causal_lm(None, "random", "tiny", "sdpa", torch.float32).save_pretrained(folder)
    byte_tokenizer().save_pretrained(folder)
    return folder


def losses(run_dir):
    lines = (run_dir / "steps.jsonl").read_text().splitlines()
    return [json.loads(x)["loss"] for x in lines]


def test_the_users_model_and_data_win_over_the_recipes(tmp_path, capsys):
    """The recipe's own comment: `--set data.path=... --set model.path=...` trains that model on
    those data (not the recipe's random shape on synthetic tokens), says so, and does what the
    same run written out key by key does."""
    model, data = hf_model(tmp_path / "my_model", seed=123), write_alpaca(tmp_path / "my.json")
    # the Alpaca prompt is longer than the recipe's 128 byte tokens
    given = ["--set", f"data.path={data}", "--set", f"model.path={model}"]
    given += ["--set", "data.max_length=256"]
    out = tmp_path / "given"
    assert main(["run", str(LORA_RECIPE), *given, *QUICK, "--output-dir", str(out)]) == 0
    printed = capsys.readouterr().out
    plan = json.loads((out / "plan.json").read_text())
    assert plan["model"] == {"kind": "path", "where": str(model), "weights": "loaded"}
    assert plan["data"] == {"source": "alpaca", "path": str(data), "synthetic": False}
    assert plan["built"]["rows"]["train"] > 0 and plan["built"]["parameters"] > 0
    assert (
        "paratrain: plan" in printed and f"{model} (Hugging Face folder): weights loaded" in printed
    )
    assert "the recipe's model.shape=tiny (random weights) left out" in printed
    assert "read as data.source=alpaca (the recipe's synthetic-text)" in printed
    # the same run with every key written out: the same model, data and so the same losses
    explicit = tmp_path / "explicit"
    keys = ["model.shape=null", "model.init=pretrained", "data.source=alpaca"]
    written = [a for k in keys for a in ("--set", k)]
    assert (
        main(["run", str(LORA_RECIPE), *given, *written, *QUICK, "--output-dir", str(explicit)])
        == 0
    )
    assert losses(out) == losses(explicit)
    # ... and not what the recipe alone trains (its random tiny model on random tokens)
    recipe = tmp_path / "recipe"
    assert main(["run", str(LORA_RECIPE), *QUICK, "--output-dir", str(recipe)]) == 0
    assert json.loads((recipe / "plan.json").read_text())["data"]["synthetic"] is True
    assert abs(losses(recipe)[0] - losses(out)[0]) > 1e-3


def test_a_given_folder_of_mnist_files_replaces_the_bundled_digits(tmp_path):
    make_mnist_dir(tmp_path / "digits")
    plan = plan_of(RECIPES / "tiny_cpu.yaml", [f"data.path={tmp_path / 'digits'}"])
    assert plan.data.source == "mnist" and plan.config.data.source == "mnist"
    assert plan.notes == ("data.path given: read as data.source=mnist (the recipe's mnist-sample)",)


CONFLICTS = [
    (  # both named on the command line: which one is meant?
        [str(LORA_RECIPE), "--set", "model.path={model}", "--set", "model.shape=tiny"],
        "model.shape: tiny and model.path {model} both name the model; set model.shape=null",
    ),
    (
        ["--set", "data.source=synthetic-text", "--set", "data.path={data}"]
        + ["--set", "model.init=random", "--set", "model.shape=tiny"],
        "data.path: data.source=synthetic-text reads no files, so {data} would not be read",
    ),
    (
        [str(LORA_RECIPE), "--set", "model.init=pretrained"],
        "model.init: pretrained weights come from model.path, and a named shape (tiny) has none",
    ),
    (
        ["--set", "data.source=synthetic-text"],
        "model.path: a text data set fine-tunes a language model",
    ),
    (
        [str(LORA_RECIPE), "--set", "data.path={notes}"],
        "data.path: cannot tell what {notes} holds for the recipe's task",
    ),
    (
        [str(RECIPES / "tiny_cpu.yaml"), "--set", "model.path={model}"],
        "model.path: task image_classification builds its model by model.name (tiny_cnn)",
    ),
    (
        [str(RECIPES / "cases" / "gan_mnist_cpu.yaml"), "--set", "strategy=tp", "--nproc", "2"],
        "strategy: task gan does not train with tp; it trains with single, ddp-*, fsdp",
    ),
    (
        ["--set", "task=custom", "--set", "data.path={data}"],
        "data.path: task custom trains the model and data sets given to paratrain.train",
    ),
    (  # strategy=tp shards whatever the degrees say (tp takes the ranks)
        [str(LORA_RECIPE), "--set", "lora.save_merged=true", "--set", "strategy=tp"]
        + ["--nproc", "2"],
        "lora.save_merged: merging needs whole weights on one rank",
    ),
    (
        [str(RECIPES / "cases" / "gan_mnist_cpu.yaml"), "--set", "train.max_grad_norm=1"],
        "train.max_grad_norm: the gan task's own step does not clip",
    ),
    (
        [str(LORA_RECIPE), "--set", "train.max_grad_norm=1", "--set", "sync.mode=local_sgd"],
        "train.max_grad_norm: sync.mode local_sgd applies gradients that were not all-reduced",
    ),
    (
        [str(LORA_RECIPE), "--set", "train.max_grad_norm=0"],
        "train.max_grad_norm: must be > 0 or null, got 0",
    ),
    (
        ["--set", "data.batchsize=8"],
        "data.batchsize: unknown key; did you mean batch_size?",
    ),
    (
        ["--set", "strategy=fdsp"],
        "strategy: got 'fdsp'; accepted: single, dp, ddp-full, ddp-rr, ddp-ds, fsdp, tp, "
        "pipeline, split, auto; did you mean fsdp?",
    ),
    (
        ["--set", "strategy=ddp"],
        "did you mean ddp-full or ddp-rr or ddp-ds?",
    ),
]


@pytest.mark.parametrize("args,message", CONFLICTS, ids=[c[1].split(":")[0] for c in CONFLICTS])
def test_a_conflict_is_one_line_exit_2_and_nothing_written(tmp_path, capsys, args, message):
    paths = {
        "model": tmp_path / "my_model",
        "data": write_alpaca(tmp_path / "my.json"),
        "notes": tmp_path / "notes.csv",
    }
    paths["model"].mkdir()
    paths["notes"].write_text("when,what\n2026,lunch\n")
    out = tmp_path / "out"
    code = main(["run", *(a.format(**paths) for a in args), "--output-dir", str(out)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("paratrain: error: "), err
    assert message.format(**paths) in err, err
    assert not out.exists()


def test_a_recipe_naming_both_a_model_path_and_a_shape_is_refused(tmp_path, capsys):
    recipe = tmp_path / "both.yaml"
    recipe.write_text(LORA_RECIPE.read_text() + f"  path: {tmp_path}\n")  # under model:
    assert "model:\n  init: random\n  shape: tiny\n  path:" not in recipe.read_text() or True
    text = LORA_RECIPE.read_text().replace(
        "  shape: tiny\n", f"  shape: tiny\n  path: {tmp_path}\n"
    )
    recipe.write_text(text)
    assert main(["run", str(recipe), "--output-dir", str(tmp_path / "out")]) == 2
    assert "model.shape: tiny and model.path" in capsys.readouterr().err


def test_the_plan_resolves_to_itself_from_its_saved_config(tmp_path):
    """config.yaml as a run folder keeps it (task, strategy, sampler and sources decided)
    resolves to the same plan: what the workers and a resume read."""
    from paratrain.config import load_config, to_yaml
    from paratrain.runplan import RunPlan, resolve

    model, data = hf_model(tmp_path / "m", seed=1), write_alpaca(tmp_path / "d.json")
    plan = plan_of(LORA_RECIPE, [f"model.path={model}", f"data.path={data}"])
    (tmp_path / "config.yaml").write_text(to_yaml(plan.config))
    again = resolve(load_config(tmp_path / "config.yaml"))
    assert same_plan(again) == same_plan(plan)
    plan.save(tmp_path / "plan.json")
    assert RunPlan.load(tmp_path / "plan.json") == plan


def test_resuming_a_finished_run_says_so_and_exits_0(tmp_path, capsys):
    """issue 50: `--resume` of a run that finished is no error; with more steps it trains on."""
    out = tmp_path / "run"
    common = ["--set", "train.max_steps=2", "--set", "data.limit_samples=64"]
    common += [
        "--set",
        "log.progress=false",
        "--set",
        "strategy=single",
        "--set",
        "data.num_workers=0",
    ]
    assert main(["run", str(RECIPES / "tiny_cpu.yaml"), "--output-dir", str(out), *common]) == 0
    capsys.readouterr()
    for where in (out, out / "checkpoints" / "step_00000002"):
        assert main(["run", "--resume", str(where)]) == 0
        said = capsys.readouterr().out
        assert "is a finished run (2 steps" in said and "train.max_steps" in said
    assert main(["run", "--resume", str(out), "--set", "train.max_steps=3"]) == 0
    assert json.loads((out / "result.json").read_text())["summary"]["optimizer_steps"] == 3
