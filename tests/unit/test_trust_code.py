"""Code a handed recipe or run folder names runs only when the user says so: `module:function`
of the standard library, an installed package or a file inside a run folder is refused in one
line naming it and --trust-code; the user's own module beside them needs no flag."""

import pytest
import yaml
from conftest import one_error_line

import paratrain
from paratrain.cli import main
from paratrain.config import load_config, to_yaml
from paratrain.errors import UserError
from paratrain.trust import CONFIG_FOLDER_ENV, TRUST_ENV

TINY = [
    "model.name=tiny_cnn",
    "data.source=synthetic",
    "data.limit_samples=64",
    "data.num_workers=0",
    "device=cpu",
    "strategy=single",
    "train.max_steps=2",
    "train.eval=false",
    "log.progress=false",
]


@pytest.fixture(autouse=True)
def no_trust(monkeypatch):
    monkeypatch.delenv(TRUST_ENV, raising=False)


def handed_config(path, marker, name="os:system", argument="command"):
    """A config as a forger writes it: the builder a shell, its argument a command."""
    raw = yaml.safe_load(to_yaml(load_config(None, TINY)))
    raw["model"]["name"] = name
    raw["model"]["kwargs"] = {argument: f"touch {marker}"}
    path.write_text(yaml.safe_dump(raw))
    return path


def test_a_run_folder_naming_a_shell_runs_nothing_on_resume(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    marker = tmp_path / "it-ran"
    handed = tmp_path / "handed"
    handed.mkdir()
    handed_config(handed / "config.yaml", marker)
    (handed / "steps.jsonl").write_text("")
    assert main(["run", "--resume", str(handed)]) == 2
    one_error_line(capsys, "model.name: the config asks to import os (", "--trust-code")
    assert not marker.exists()


def test_a_recipe_naming_an_installed_module_is_refused_from_the_command_and_python(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    marker = tmp_path / "it-ran"
    recipe = handed_config(tmp_path / "recipe.yaml", marker, "subprocess:getoutput", "cmd")
    assert main(["run", str(recipe), "--output-dir", str(tmp_path / "out")]) == 2
    one_error_line(capsys, "import subprocess (Python's standard library", "--trust-code")
    with pytest.raises(UserError, match="trust_code=True"):
        paratrain.train(str(recipe), {"output_dir": str(tmp_path / "out2")})
    assert not marker.exists() and not (tmp_path / "out").exists()


def test_a_module_inside_a_run_folder_runs_only_with_trust_code(tmp_path, monkeypatch, capsys):
    """A handed run folder that ships its own module: refused from inside it; --trust-code
    (or trust_code=True) imports it and trains."""
    handed = tmp_path / "handed"
    handed.mkdir()
    (handed / "config.yaml").write_text(to_yaml(load_config(None, TINY)))
    (handed / "result.json").write_text("{}")
    (handed / "shipped.py").write_text(
        "from torch import nn\n"
        "def build(num_classes, in_channels):\n"
        "    return nn.Sequential(nn.Flatten(), nn.LazyLinear(num_classes))\n"
    )
    monkeypatch.chdir(handed)
    args = ["run", *[a for s in TINY for a in ("--set", s)], "--set", "model.name=shipped:build"]
    assert main([*args, "--output-dir", str(tmp_path / "a")]) == 2
    one_error_line(capsys, "import shipped (a file inside the run folder ")
    assert main([*args, "--output-dir", str(tmp_path / "b"), "--trust-code"]) == 0
    monkeypatch.delenv(TRUST_ENV)
    sets = dict(s.split("=", 1) for s in [*TINY, "model.name=shipped:build"])
    result = paratrain.train(None, {**sets, "output_dir": str(tmp_path / "c")}, trust_code=True)
    assert result["summary"]["optimizer_steps"] == 2
    assert TRUST_ENV not in __import__("os").environ  # the call's trust ends with it


# ------------------------------------------------------------------ a module beside a handed run


def handed_bundle(root, marker, package="experiment"):
    """An archive as a forger packs it: experiment/{run/ (a run folder), models.py (the code
    its config names)}, unpacked into `root`. (A test that imports through the working
    directory names its own package: paratrain keeps the working directory it imported a
    user's module from on sys.path, so an earlier test's folder would be found first.)"""
    exp = root / package
    run = exp / "run"
    run.mkdir(parents=True)
    (exp / "models.py").write_text(
        f"import os\nos.makedirs({str(marker)!r}, exist_ok=True)\n"
        "from paratrain.models.vision import build_tiny_cnn as build\n"
    )
    raw = yaml.safe_load(to_yaml(load_config(None, TINY)))
    raw["model"]["name"] = f"{package}.models:build"
    raw["output_dir"] = str(run)
    (run / "config.yaml").write_text(yaml.safe_dump(raw))
    (run / "steps.jsonl").write_text("")
    return run


def test_a_module_beside_a_handed_run_folder_runs_only_with_trust_code(
    tmp_path, monkeypatch, capsys
):
    """Resumed from the folder it was unpacked into: the bundle's module lies in no run folder,
    yet it came with the run; one line names it and the flag."""
    marker = tmp_path / "it-ran"
    handed_bundle(tmp_path, marker)
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--resume", "experiment/run"]) == 2
    one_error_line(capsys, "import experiment.models (a file under ", "--trust-code")
    assert not marker.exists()
    assert CONFIG_FOLDER_ENV not in __import__("os").environ  # the command's folder ends with it


def test_a_run_folders_config_named_as_the_recipe_is_read_as_resume_reads_it(
    tmp_path, monkeypatch, capsys
):
    """`paratrain run experiment/run/config.yaml` and paratrain.train(recipe=...) on the same
    file: the bundle's module beside the run folder is refused as on --resume; the rule ends
    with the command and the call."""
    import os

    marker = tmp_path / "it-ran"
    handed_bundle(tmp_path, marker, "unpacked")
    monkeypatch.chdir(tmp_path)
    config = "unpacked/run/config.yaml"
    assert main(["run", config, "--output-dir", str(tmp_path / "out")]) == 2
    one_error_line(capsys, "import unpacked.models (a file under ", "--trust-code")
    with pytest.raises(UserError, match="a file under .*trust_code=True"):
        paratrain.train(config, {"output_dir": str(tmp_path / "out2")})
    assert not marker.exists() and CONFIG_FOLDER_ENV not in os.environ


def test_export_reads_a_run_folders_config_as_the_run_does(tmp_path, monkeypatch):
    """export's model is built with the run folder's config as the config's folder (a module
    beside it the bundle's), also when --config names that file; a --config in no run folder
    is a recipe of the user's."""
    import os

    from test_checkpoint_forgery import small_model, write

    import paratrain.export.consolidate as export

    run = handed_bundle(tmp_path, tmp_path / "it-ran")
    write(run / "checkpoints", *small_model())
    seen = []
    monkeypatch.setattr(
        export, "_export", lambda *a: seen.append(os.environ.get(CONFIG_FOLDER_ENV))
    )
    export.export(run, tmp_path / "out")
    export.export(run, tmp_path / "out", config=run / "config.yaml")
    (tmp_path / "mine.yaml").write_text((run / "config.yaml").read_text())
    export.export(run, tmp_path / "out", config=tmp_path / "mine.yaml")
    assert seen == [str(run.resolve()), str(run.resolve()), None]
    assert CONFIG_FOLDER_ENV not in os.environ


def test_the_config_folder_marks_what_lies_beside_it_not_the_working_directory(
    tmp_path, monkeypatch
):
    """A module under the config's folders is the bundle's; the working directory's own
    files (and those of folders above it) stay the user's."""
    from paratrain import trust

    marker = tmp_path / "it-ran"
    run = handed_bundle(tmp_path, marker)
    (tmp_path / "mine.py").write_text("")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    with trust.reading_config_of(run):
        assert "under " in trust.not_own("experiment.models")
        assert trust.not_own("mine") is None  # the folder you run from is yours
    assert trust.not_own("experiment.models") is None  # no run folder's config: a recipe's
    monkeypatch.chdir(tmp_path / "experiment")  # run from inside the bundle: its code is yours
    with trust.reading_config_of(run):
        assert trust.not_own("experiment.models") is None
    assert not marker.exists()


def test_a_run_folder_is_known_by_its_ledger_too(tmp_path, monkeypatch):
    """A handed run folder without plan.json, result.json, steps.jsonl or checkpoints/ (its
    checkpoints elsewhere) is still one: its .paratrain/ says so."""
    from paratrain import trust

    handed = tmp_path / "handed"
    (handed / ".paratrain").mkdir(parents=True)
    (handed / "config.yaml").write_text("")
    (handed / "helper.py").write_text("")
    monkeypatch.syspath_prepend(str(handed))
    assert "a file inside the run folder" in trust.not_own("helper")


# ------------------------------------------------------------------ compile_options' commands


def cxx(marker) -> str:
    """Inductor's C++ compiler command, as a forger sets it: a shell, then the compiler."""
    return f'["sh -c \'touch {marker}; exec g++ \\"$@\\"\' g++"]'


def test_compile_options_naming_a_command_are_refused_unless_trusted(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    marker = tmp_path / "it-ran"
    command = f"train.compile_options.cpp.cxx={cxx(marker)}"
    sets = [a for s in [*TINY, "train.compile=true", command] for a in ("--set", s)]
    assert main(["run", *sets, "--output-dir", str(tmp_path / "a")]) == 2
    one_error_line(capsys, "train.compile_options: cpp.cxx is ['sh -c", "--trust-code")
    # a handed run folder's config.yaml names it
    handed = tmp_path / "handed"
    handed.mkdir()
    raw = yaml.safe_load(to_yaml(load_config(None, TINY)))
    raw["train"]["compile"] = True
    raw["train"]["compile_options"] = {"cpp.cxx": [f"sh -c 'touch {marker}' g++"]}
    (handed / "config.yaml").write_text(yaml.safe_dump(raw))
    (handed / "steps.jsonl").write_text("")
    assert main(["run", "--resume", str(handed)]) == 2
    one_error_line(capsys, "train.compile_options: cpp.cxx is ", "--trust-code")
    given = dict(s.split("=", 1) for s in TINY)
    given["train.compile_options.cpp.cxx"] = [f"sh -c 'touch {marker}' g++"]
    with pytest.raises(UserError, match="trust_code=True"):
        paratrain.load_config(None, given)
    for path in ("cuda.cuda_cxx", "trace.debug_dir"):  # a path or a command, each refused
        with pytest.raises(UserError, match="--trust-code"):
            load_config(None, [*TINY, f"train.compile_options.{path}=/tmp/x"])
    assert not marker.exists()
    # numbers and true / false are the tuning knobs: taken as before
    knobs = ["coordinate_descent_tuning=true", "triton.cudagraphs=false"]
    cfg = load_config(None, [*TINY, *(f"train.compile_options.{k}" for k in knobs)])
    assert cfg.train.compile_options == {
        "coordinate_descent_tuning": True,
        "triton.cudagraphs": False,
    }
    monkeypatch.setenv(TRUST_ENV, "1")  # --trust-code: the user's own command line
    cfg = load_config(None, [*TINY, command])
    assert cfg.train.compile_options["cpp.cxx"][0].startswith("sh -c")


def test_config_reads_the_trust_variable_trust_sets():
    from paratrain.config import train

    assert train._TRUST_ENV == TRUST_ENV


# ------------------------------------------------------------------ a Hugging Face folder's code


def hf_folder(path, marker):
    """A model folder whose config.json and tokenizer_config.json ask for modules of its own
    (auto_map), which make `marker` when imported."""
    path.mkdir()
    auto = {
        "AutoConfig": "evil.EvilConfig",
        "AutoModelForCausalLM": "evil.EvilModel",
        "AutoModelForMaskedLM": "evil.EvilModel",
        "AutoTokenizer": ["evil.EvilTokenizer", None],
    }
    config = {"model_type": "evilgpt", "auto_map": auto, "vocab_size": 256}
    (path / "config.json").write_text(__import__("json").dumps(config))
    tokenizer = {"auto_map": {"AutoTokenizer": auto["AutoTokenizer"]}}
    tokenizer["tokenizer_class"] = "EvilTokenizer"
    (path / "tokenizer_config.json").write_text(__import__("json").dumps(tokenizer))
    (path / "evil.py").write_text(f"import os\nos.makedirs({str(marker)!r}, exist_ok=True)\n")
    return path


@pytest.fixture
def asked(monkeypatch):
    """transformers' question on the terminal ("Do you wish to run the custom code?"): each
    time it was asked, answered no."""
    questions = []
    monkeypatch.setattr("builtins.input", lambda prompt="": questions.append(prompt) or "n")
    return questions


def test_a_model_folders_own_code_is_refused_in_one_line_never_asked(
    tmp_path, monkeypatch, capsys, asked
):
    import torch

    from paratrain.data.text.tokenizer import load_tokenizer
    from paratrain.models.bert import build_bert
    from paratrain.models.causal_lm.build import build_causal_lm

    marker = tmp_path / "it-ran"
    hf = hf_folder(tmp_path / "hf", marker)
    bert = {"shape": None, "attn": "sdpa", "dtype": torch.float32, "device": "cpu"}
    calls = {
        "causal LM, random": lambda: build_causal_lm(
            str(hf), "random", None, "sdpa", torch.float32
        ),
        "causal LM, pretrained": lambda: build_causal_lm(
            str(hf), "pretrained", None, "sdpa", torch.float32
        ),
        "BERT, random": lambda: build_bert(path=str(hf), init="random", **bert),
        "BERT, pretrained": lambda: build_bert(path=str(hf), init="pretrained", **bert),
        "tokenizer": lambda: load_tokenizer(str(hf)),
    }
    for what, call in calls.items():
        with pytest.raises(UserError) as caught:
            call()
        line = str(caught.value)
        assert "asks to run code of its own" in line and "--trust-code" in line, (what, line)
        assert "\n" not in line and not asked and not marker.exists(), what
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()  # transformers' notes on the calls above
    recipe = str(paratrain_recipes() / "cases" / "gpt2_tiny_cpu.yaml")
    sets = [f"model.path={hf}", "model.init=random", "model.shape=none", "train.max_steps=1"]
    args = [a for s in [*sets, "strategy=single"] for a in ("--set", s)]
    assert main(["run", recipe, *args, "--output-dir", str(tmp_path / "out")]) == 2
    one_error_line(capsys, f"model.path: {hf} asks to run code of its own", "--trust-code")
    assert not asked and not marker.exists()


def paratrain_recipes():
    from conftest import RECIPES

    return RECIPES
