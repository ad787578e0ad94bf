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


def _objects(seed=0):
    """A model, data sets and a loss as a notebook defines them: the class is local, so a
    multi-process run's workers get it pickled by value."""
    import torch
    from torch import nn
    from torch.utils.data import TensorDataset

    class Regressor(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(6, 16), nn.Tanh())
            self.head = nn.Linear(16, 1)

        def forward(self, x):
            return self.head(self.body(x)).squeeze(-1)

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(96, 6, generator=g)
    y = x @ torch.linspace(-1, 1, 6) + 0.1 * torch.randn(96, generator=g)
    torch.manual_seed(0)
    return Regressor(), TensorDataset(x[:64], y[:64]), TensorDataset(x[64:], y[64:])


CUSTOM = {"device": "cpu", "data.num_workers": 0, "train.max_steps": 6, "train.lr": 0.05}
CUSTOM |= {"log.progress": False, "train.momentum": 0.9}


def test_your_own_model_data_and_loss_train_in_this_process(tmp_path):
    import torch
    import torch.nn.functional as F

    model, train_set, val_set = _objects()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    result = paratrain.train(
        None,
        {**CUSTOM, "data.batch_size": 16, "output_dir": str(tmp_path / "one")},
        model=model,
        train_data=train_set,
        val_data=val_set,
        loss=F.mse_loss,
    )
    s = result["summary"]
    assert result["task"] == "custom" and s["optimizer_steps"] == 6
    assert s["val_loss"] > 0 and s.get("val_accuracy") is None  # a regression: no accuracy
    assert "model" not in result["config"] and "source" not in result["config"]["data"]
    # the instance given is the one trained
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
    with pytest.raises(paratrain.UserError, match="model= and train_data= go together"):
        paratrain.train(None, CUSTOM, model=model)


@pytest.mark.dist
def test_your_own_objects_on_two_processes_equal_one_process(tmp_path):
    """ddp-ds over 2 processes at batch 8 each is one process at batch 16: the weights that
    come back into the model given are the single run's; and the check can fail."""
    import torch
    import torch.nn.functional as F

    one, train_set, val_set = _objects()
    paratrain.train(
        None,
        {**CUSTOM, "data.batch_size": 16, "output_dir": str(tmp_path / "one")},
        model=one,
        train_data=train_set,
        loss=F.mse_loss,
    )
    two, train_set, val_set = _objects()
    start = {k: v.clone() for k, v in two.state_dict().items()}
    result = paratrain.train(
        None,
        {
            **CUSTOM,
            **{"strategy": "ddp-ds", "launch.nproc": 2, "data.batch_size": 8},
            "output_dir": str(tmp_path / "two"),
        },
        model=two,
        train_data=train_set,
        val_data=val_set,
        loss=F.mse_loss,
    )
    assert result["world_size"] == 2 and result["summary"]["val_loss"] > 0
    for k, v in one.state_dict().items():
        torch.testing.assert_close(two.state_dict()[k], v, rtol=1e-5, atol=1e-6)
    assert max((start[k] - v).abs().max().item() for k, v in one.state_dict().items()) > 1e-3


def _lazy_objects():
    """The same regression with a lazy first layer (nn.LazyLinear: its input width is known
    only from a batch)."""
    from torch import nn

    model, train_set, val_set = _objects()

    class LazyRegressor(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.LazyLinear(16), nn.Tanh())
            self.head = nn.Linear(16, 1)

        def forward(self, x):
            return self.head(self.body(x)).squeeze(-1)

    import torch

    torch.manual_seed(0)
    return LazyRegressor(), train_set, val_set


@pytest.mark.dist
@pytest.mark.parametrize("strategy", ["ddp-ds", "fsdp"])
def test_lazy_modules_are_materialised_from_a_batch_under_every_strategy(tmp_path, strategy):
    """nn.LazyLinear under DDP and FSDP2 on 2 processes (batch 8 each) ends where one process
    at batch 16 ends: the weights were materialised from a real batch, the same on every rank,
    before wrapping."""
    import torch
    import torch.nn.functional as F

    one, train_set, _ = _lazy_objects()
    paratrain.train(
        None,
        {**CUSTOM, "data.batch_size": 16, "output_dir": str(tmp_path / "one")},
        model=one,
        train_data=train_set,
        loss=F.mse_loss,
    )
    two, train_set, _ = _lazy_objects()
    paratrain.train(
        None,
        {**CUSTOM, "strategy": strategy, "launch.nproc": 2, "data.batch_size": 8}
        | {"output_dir": str(tmp_path / "two")},
        model=two,
        train_data=train_set,
        loss=F.mse_loss,
    )
    assert one.body[0].weight.shape == (16, 6)
    for k, v in one.state_dict().items():
        torch.testing.assert_close(two.state_dict()[k], v, rtol=1e-5, atol=1e-6)
