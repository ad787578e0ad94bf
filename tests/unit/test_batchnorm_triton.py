"""model.batchnorm=triton: paratrain's training BatchNorm (+ ReLU6 / ReLU) kernels
(models/batchnorm_triton.py) against nn.BatchNorm2d and the activation after it: output, input
and parameter gradients, running statistics. The kernels run in Triton's CPU interpreter
(TRITON_INTERPRET=1, read when they are defined: a process of their own); on a GPU,
tests/gpu/test_gpu_depthwise.py compares a whole MobileNetV2 step. Without CUDA or the
interpreter the ops are the same arithmetic in torch, checked in this process."""

import pytest
import torch
from conftest import assert_same_step_float64, run_in_triton_interpreter
from torch import nn

from paratrain.cli import main
from paratrain.models.batchnorm_triton import TritonBatchNorm, triton_batchnorm
from paratrain.models.depthwise import swap_depthwise
from paratrain.models.depthwise_triton import TritonDepthwise
from paratrain.models.vision import build_mobilenet_v2

pytest.importorskip("triton")

KERNELS = r"""
import copy
import torch
from torch import nn
from paratrain.models.batchnorm_triton import NONE, RELU, RELU6, TritonBatchNorm

torch.manual_seed(0)
# with each activation: 6 channels (wide rows of 384: 64 pixels, 3 lane blocks); 70 (4,480: 35
# blocks); 130; 144 (1,152: MobileNetV2's, 9 blocks); each with a last wide row cut short
for c, act, module in [(6, RELU6, nn.ReLU6()), (70, NONE, nn.Identity()), (130, RELU, nn.ReLU()),
                       (144, RELU6, nn.ReLU6())]:
    bn = nn.BatchNorm2d(c)
    with torch.no_grad():
        bn.weight.uniform_(0.5, 2.0)
        bn.bias.uniform_(-1.0, 1.0)
    ref = nn.Sequential(copy.deepcopy(bn), module)
    mine = TritonBatchNorm(bn, act)
    # a mean far from 0 (the sums are taken from each channel's first value) and ReLU6's
    # both edges reached
    x = (torch.randn(3, c, 7, 9) * 3 + 20).contiguous(memory_format=torch.channels_last)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    a, b = ref(x1), mine(x2)
    assert b.is_contiguous(memory_format=torch.channels_last)
    assert torch.allclose(a, b, atol=2e-5), (a - b).abs().max()
    g = torch.randn_like(a)
    a.backward(g)
    b.backward(g)
    assert torch.allclose(x1.grad, x2.grad, atol=2e-5), (x1.grad - x2.grad).abs().max()
    for p, q in [(ref[0].weight, bn.weight), (ref[0].bias, bn.bias)]:
        assert torch.allclose(p.grad, q.grad, rtol=1e-4, atol=1e-4), (p.grad - q.grad).abs().max()
    for p, q in [(ref[0].running_mean, bn.running_mean), (ref[0].running_var, bn.running_var)]:
        assert torch.allclose(p, q, rtol=1e-5, atol=1e-5), (p - q).abs().max()
    assert bn.num_batches_tracked.item() == ref[0].num_batches_tracked.item() == 1

# bf16 under autocast (the interpreter rounds fp32 -> bf16 by truncation: a bf16 tolerance)
bn = nn.BatchNorm2d(8)
x = torch.randn(2, 8, 6, 6).bfloat16()
ref, out = nn.functional.relu6(copy.deepcopy(bn)(x.float())), TritonBatchNorm(bn, RELU6)(x)
assert out.dtype == torch.bfloat16 and (out.float() - ref).abs().max() < 0.05

# compiled: the op whole inside inductor's graph, the running statistics updated as eager
def model():
    torch.manual_seed(1)
    return nn.Sequential(nn.Conv2d(3, 8, 3), TritonBatchNorm(nn.BatchNorm2d(8), RELU6))
eager, compiled = model(), model()
x = torch.randn(2, 3, 9, 9)
x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
eager(x1).sum().backward()
torch.compile(compiled)(x2).sum().backward()
assert torch.allclose(x1.grad, x2.grad, atol=1e-5)
assert torch.allclose(eager[1].running_var, compiled[1].running_var, atol=1e-6)
# _col_sums' grid and loop choices (colsums_sweep.py times them on a GPU): the same sums with
# any programs, blocks a turn, block height and pipeline stages, a last turn's blocks past the end included
from paratrain.models.batchnorm_triton import _column_sums, _rows
for c in (6, 130, 96):
    x = (torch.randn(2, c, 30, 30) + 3).contiguous(memory_format=torch.channels_last)
    x2, g2 = _rows(x), _rows(torch.randn_like(x))
    w, b, mu = torch.rand(c) + 0.5, torch.randn(c), x2.mean(0)
    inv = torch.rand(c) + 0.5
    z = x2 * (w * inv) + (b - mu * w * inv)
    gm = torch.where((z > 0) & (z < 6), g2, 0.0)
    d = x2 - x2[0]
    want = {False: torch.stack([d.sum(0), (d * d).sum(0)]),
            True: torch.stack([gm.sum(0), (gm * (x2 - mu)).sum(0)])}
    for programs, unroll, rows, stages in [(4, 1, 0, 0), (3, 2, 0, 0), (2, 3, 0, 0),
                                           (5, 4, 0, 0), (1000, 2, 0, 0), (3, 2, 32, 3),
                                           (2, 1, 8, 2)]:
        for grad in (False, True):
            got = _column_sums(x2, g2 if grad else None, (w, b, mu, inv) if grad else None,
                               RELU6, programs, unroll, rows, 0, stages)
            assert torch.allclose(got, want[grad], rtol=1e-4, atol=1e-2), (c, programs, unroll)
print("kernels ok")
"""


def test_the_kernels_match_batchnorm_in_tritons_interpreter():
    run_in_triton_interpreter(KERNELS)


def test_mobilenet_v2_swapped_trains_and_evaluates_as_before():
    """All 52 BatchNorm layers swapped, the 35 ReLU6 after them joined; the state dict's keys
    unchanged; a training step (torch's arithmetic: no CUDA here) and eval as the original's.
    In float64: in fp32 the 52 layers at this tiny batch amplify rounding to 1-3% in some
    gradients, for both models alike."""
    torch.manual_seed(0)
    model, ref = build_mobilenet_v2(10, in_channels=1), build_mobilenet_v2(10, in_channels=1)
    ref.load_state_dict(model.state_dict())
    keys = model.state_dict().keys()
    assert swap_depthwise(model, TritonDepthwise) == 17
    assert triton_batchnorm(model) == 52
    assert sum(m.act != 0 for m in model.modules() if isinstance(m, TritonBatchNorm)) == 35
    assert not any(isinstance(m, nn.ReLU6) for m in model.modules())
    assert model.state_dict().keys() == keys
    assert_same_step_float64(model, ref, batch=4)
    for a, b in zip(model.buffers(), ref.buffers(), strict=True):
        assert torch.allclose(a, b, atol=1e-12)
    model.eval(), ref.eval()
    x = torch.randn(2, 1, 40, 40, dtype=torch.float64)
    assert torch.allclose(model(x), ref(x), atol=1e-12)


def test_a_run_with_both_kernels_on_the_cpu(tmp_path, tiny_overrides, capsys):
    """The settings through the CLI: MobileNetV2 with model.batchnorm=triton and
    model.depthwise_conv=triton trains; on the CPU the plan says PyTorch's arithmetic runs."""
    sets = ["model.name=mobilenet_v2", "model.batchnorm=triton", "model.depthwise_conv=triton"]
    sets += ["model.shift_add_min_side=0", "data.image_size=32", "train.max_steps=2"]
    args = [a for s in sets for a in ("--set", s)]
    assert main(["run", *tiny_overrides, *args, "--output-dir", str(tmp_path / "out")]) == 0
    out = capsys.readouterr()
    note = "model.depthwise_conv=triton and model.batchnorm=triton: Triton kernels need a GPU"
    assert note in out.out + out.err


def test_a_sequential_with_a_forward_of_its_own_keeps_its_activation():
    """Only a plain nn.Sequential runs its layers in order: a subclass's ReLU6 may be used
    elsewhere in its forward, so it is not joined to the BatchNorm before it."""

    class Residual(nn.Sequential):
        def forward(self, x):
            return x + self[1](self[0](x))

    model = nn.Sequential(nn.BatchNorm2d(3), nn.ReLU6(), Residual(nn.BatchNorm2d(3), nn.ReLU6()))
    assert triton_batchnorm(model) == 2
    assert isinstance(model[1], nn.Identity) and model[0].act != 0
    assert isinstance(model[2][1], nn.ReLU6) and model[2][0].act == 0
