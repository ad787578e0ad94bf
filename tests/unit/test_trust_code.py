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
from paratrain.trust import TRUST_ENV

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
