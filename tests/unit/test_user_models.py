"""Models users bring: timm's by name (timm:NAME: its in_chans, random weights), builders that
take only what they need (their signature is read), a refused argument named in one line,
model.sync_batchnorm's one-line refusals where torch's SyncBatchNorm cannot run."""

import sys

import pytest
from conftest import train

from paratrain.cli import main
from paratrain.config import load_config
from paratrain.errors import UserError

IMAGE = [
    *("strategy=single", "device=cpu", "data.source=mnist-sample", "train.max_steps=2"),
    *("log.progress=false", "data.num_workers=0", "train.eval=false", "data.batch_size=8"),
    *("checkpoint.at_end=false", "data.limit_samples=64"),
]


def run(tmp_path, *settings):
    return train(load_config(None, [*IMAGE, *settings, f"output_dir={tmp_path / 'run'}"]))


@pytest.mark.parametrize(
    "settings",
    [
        ["model.name=timm:test_resnet"],
        ["model.name=timm:create_model", "model.kwargs.model_name=test_resnet"],
    ],
    ids=["timm:NAME", "timm:create_model"],
)
def test_a_timm_model_trains_with_its_own_argument_names(tmp_path, settings):
    """One grey channel and 10 classes reach timm as in_chans / num_classes."""
    pytest.importorskip("timm")
    r = run(tmp_path, *settings)
    assert r["summary"]["optimizer_steps"] == 2 and r["summary"]["trainable_parameters"] > 0


def test_a_misspelt_timm_model_is_one_line(tmp_path):
    pytest.importorskip("timm")
    with pytest.raises(
        UserError,
        match=r"model.name: timm has no model 'test_resnett'; did you mean timm:test_resnet\?",
    ):
        run(tmp_path, "model.name=timm:test_resnett")


def test_a_builder_gets_only_what_it_takes_and_a_refused_argument_is_named(tmp_path):
    (tmp_path / "mine.py").write_text(
        "from torch import nn\n"
        "def classes_only(num_classes):\n"
        "    return nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, num_classes))\n"
        "class Net(nn.Module):\n"
        "    def __init__(self, num_classes):\n"
        "        super().__init__()\n"
        "        self.fc = nn.Linear(28 * 28, num_classes)\n"
        "    def forward(self, x):\n"
        "        return self.fc(x.flatten(1))\n"
        "def passes_everything(**kwargs):\n"
        "    return Net(**kwargs)\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        assert run(tmp_path, "model.name=mine:classes_only")["summary"]["optimizer_steps"] == 2
        with pytest.raises(UserError) as e:
            run(tmp_path / "b", "model.name=mine:passes_everything")
    finally:
        sys.path.remove(str(tmp_path))
    assert str(e.value).startswith(
        "model.name: mine:passes_everything does not take in_channels, which paratrain passes "
        "(in_channels=1)"
    )


@pytest.mark.parametrize(
    "args,message",
    [
        (
            ["--set", "model.sync_batchnorm=true", "--set", "device=cpu", "--nproc", "2"],
            "model.sync_batchnorm: torch's SyncBatchNorm runs on GPUs",
        ),
        (
            ["--set", "model.sync_batchnorm=true", "--set", "strategy=fsdp", "--nproc", "2"],
            "model.sync_batchnorm: converts BatchNorm for DDP's replicas; this run's "
            "data-parallel wrapper is fsdp",
        ),
        (
            ["--set", "model.sync_batchnorm=true", "--set", "model.batchnorm=triton"],
            "model.sync_batchnorm: takes PyTorch's BatchNorm layers; model.batchnorm=triton",
        ),
    ],
)
def test_sync_batchnorm_where_it_cannot_run_is_one_line(tmp_path, capsys, args, message):
    assert main(["run", *args, "--output-dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
