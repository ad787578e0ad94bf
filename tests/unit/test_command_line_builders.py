"""The command line as a new user meets it: a builder module in the working directory found by the
`paratrain` command itself; `run --help` names every strategy."""

import shutil
import subprocess
import sys

import pytest

from paratrain.runplan.strategies import STRATEGIES


def test_the_paratrain_command_finds_a_builder_in_the_working_directory(tmp_path):
    command = shutil.which("paratrain")
    if command is None:
        pytest.skip("the paratrain console script is not installed")
    (tmp_path / "my_models.py").write_text(
        "from torch import nn\n\n"
        "def build(num_classes, in_channels):\n"
        "    return nn.Sequential(nn.Flatten(), nn.LazyLinear(num_classes))\n"
    )
    settings = ["model.name=my_models:build", "strategy=single", "device=cpu"]
    settings += ["data.source=synthetic", "train.max_steps=2", "log.progress=false"]
    settings += ["data.num_workers=0", "train.eval=false", "data.limit_samples=64"]
    p = subprocess.run(
        [command, "run", *[a for s in settings for a in ("--set", s)], "--output-dir", "out"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    assert (tmp_path / "out" / "result.json").is_file()


def test_run_help_names_every_strategy():
    p = subprocess.run(
        [sys.executable, "-m", "paratrain", "run", "--help"], capture_output=True, text=True
    )
    assert all(name in p.stdout for name in STRATEGIES), p.stdout


def test_builder_keyword_arguments_and_a_result_without_the_other_tasks_keys(tmp_path):
    """model.kwargs reach the user's builder (a keyword it does not take is one line naming
    model.kwargs); an image run's result.json has no lora.* or model.shape, a language
    model's no model.name or data.image_size."""
    from conftest import train

    from paratrain.config import load_config
    from paratrain.errors import UserError

    (tmp_path / "wide.py").write_text(
        "from torch import nn\n\n"
        "def build(num_classes, in_channels, width=8):\n"
        "    return nn.Sequential(nn.Flatten(), nn.LazyLinear(width), nn.ReLU(),"
        " nn.Linear(width, num_classes))\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        common = ["model.name=wide:build", "strategy=single", "device=cpu"]
        common += ["data.source=synthetic", "train.max_steps=1", "log.progress=false"]
        common += [
            "data.num_workers=0",
            "train.eval=false",
            "data.limit_samples=32",
            "data.batch_size=8",
        ]
        common += ["checkpoint.at_end=false"]
        out = tmp_path / "img"
        r = train(load_config(None, [*common, "model.kwargs.width=5", f"output_dir={out}"]))
        assert r["summary"]["optimizer_steps"] == 1
        assert "lora" not in r["config"] and "shape" not in r["config"]["model"]
        assert r["config"]["model"]["kwargs"] == {"width": 5}
        assert "max_length" not in r["config"]["data"] and "image_size" in r["config"]["data"]
        bad = load_config(None, [*common, "model.kwargs.depth=3", f"output_dir={tmp_path / 'b'}"])
        with pytest.raises(UserError, match=r"model.kwargs: wide:build does not take them"):
            train(bad)
    finally:
        sys.path.remove(str(tmp_path))
    lm = load_config(
        None,
        [
            *("task=causal_lm", "data.source=synthetic-text", "model.init=random"),
            *("model.shape=tiny", "device=cpu", "data.max_length=16", "data.batch_size=2"),
            *("train.max_steps=1", "data.num_workers=0", "log.progress=false"),
            *("checkpoint.at_end=false", f"output_dir={tmp_path / 'lm'}"),
        ],
    )
    r = train(lm)
    assert "lora" in r["config"] and r["config"]["model"]["shape"] == "tiny"
    assert "name" not in r["config"]["model"] and "image_size" not in r["config"]["data"]
