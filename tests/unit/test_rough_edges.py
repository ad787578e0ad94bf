"""A new user's rough edges (issue 16): a builder module in the working directory found by the
`paratrain` command itself; `run --help` names every strategy."""

import shutil
import subprocess
import sys

import pytest

from paratrain.parallel import STRATEGIES


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
