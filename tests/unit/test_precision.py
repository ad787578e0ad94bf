import pytest
import torch

from paratrain.errors import UserError
from paratrain.trainer.precision import ScalerConfig, build_policy, build_scaler

CPU = torch.device("cpu")


def test_grad_scaler_skips_inf_step_and_backs_off():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = build_scaler("fp16", ScalerConfig(init_scale=1024.0, backoff_factor=0.5), CPU)
    policy = build_policy("fp16", CPU)

    def step(poison: bool):
        with policy.autocast():
            loss = model(torch.randn(3, 4)).float().sum()
        scaler.scale(loss).backward()
        if poison:
            model.weight.grad[0, 0] = float("inf")
        before = model.weight.detach().clone()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        return before

    before = step(poison=True)
    assert torch.equal(before, model.weight)  # the step was skipped
    assert scaler.get_scale() == 512.0  # and the scale backed off by backoff_factor
    before = step(poison=False)
    assert not torch.equal(before, model.weight)  # a clean step updates
    assert scaler.get_scale() == 512.0  # no growth before growth_interval clean steps


def test_scaler_grows_after_interval():
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = build_scaler("fp16", ScalerConfig(init_scale=8.0, growth_interval=2), CPU)
    for _ in range(2):
        scaler.scale(model(torch.ones(1, 2)).sum()).backward()
        scaler.step(opt)
        scaler.update()
    assert scaler.get_scale() == 16.0


@pytest.mark.parametrize(
    "mode,param,autocast",
    [
        ("fp64", torch.float64, None),
        ("fp32", torch.float32, None),
        ("fp16", torch.float32, torch.float16),
        ("bf16", torch.float32, torch.bfloat16),
    ],
)
def test_policy(mode, param, autocast):
    p = build_policy(mode, CPU)
    assert p.param_dtype == param and p.autocast_dtype == autocast
    with p.autocast():
        y = torch.nn.Linear(4, 4).to(param)(torch.randn(2, 4, dtype=param))
    assert y.dtype == (autocast or param)


def test_only_fp16_gets_a_scaler():
    assert build_scaler("bf16", ScalerConfig(), CPU) is None
    assert build_scaler("fp32", ScalerConfig(), CPU) is None


def test_tf32_needs_cuda():
    with pytest.raises(UserError, match="tf32"):
        build_policy("tf32", CPU)
