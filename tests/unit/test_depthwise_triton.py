"""model.depthwise_conv=triton: paratrain's depthwise kernels (models/depthwise_triton.py) give
nn.Conv2d's output and gradients. The kernels themselves run here in Triton's CPU interpreter
(TRITON_INTERPRET=1, read when the kernels are defined: hence a process of their own); on a GPU,
tests/gpu/test_gpu_depthwise.py compares them with cuDNN. Without CUDA or the interpreter the op
is PyTorch's convolution, checked in this process."""

import pytest
import torch
from conftest import assert_same_step_float64, run_in_triton_interpreter

from paratrain.models.depthwise import swap_depthwise
from paratrain.models.depthwise_triton import TritonDepthwise
from paratrain.models.vision import build_mobilenet_v2

pytest.importorskip("triton")

KERNELS = r"""
import torch, torch.nn.functional as F
from torch import nn
from paratrain.models.depthwise_triton import TritonDepthwise, depthwise_conv2d

# TritonDepthwise(conv)(x) against conv(x): the output (channels_last), the parameters'
# gradients and, when asked, the input's
def check(conv, x, needs_input_grad=True):
    x1, x2 = x.clone().requires_grad_(needs_input_grad), x.clone().requires_grad_(needs_input_grad)
    ref, out = conv(x1), TritonDepthwise(conv)(x2)
    assert out.shape == ref.shape and out.is_contiguous(memory_format=torch.channels_last)
    assert torch.allclose(out, ref, atol=1e-5), (out - ref).abs().max()
    g = torch.randn_like(ref)
    ref.backward(g)
    want = [q.grad.clone() for q in conv.parameters()]
    conv.zero_grad()
    out.backward(g)
    if needs_input_grad:
        assert torch.allclose(x2.grad, x1.grad, atol=1e-5), (x2.grad - x1.grad).abs().max()
    for a, q in zip(want, conv.parameters(), strict=True):
        assert torch.allclose(q.grad, a, atol=1e-4), (q.grad - a).abs().max()

torch.manual_seed(0)
# (channels, side, kernel, stride, padding, dilation, bias): 3x3 stride 1 and 2 as MobileNetV2's,
# a 5x5 (cuDNN's weight gradient), a dilated one; 70 channels: two channel blocks, the second
# partly masked
for c, side, k, s, p, d, bias in [
    (6, 13, 3, 1, 1, 1, False), (70, 12, 3, 2, 1, 1, True), (3, 11, 5, 2, 2, 1, True),
    (4, 11, 3, 1, 2, 2, False), (1, 9, 3, 1, 1, 1, True),  # one channel: no aliased outputs
    (5, 10, 3, 2, 1, 2, False), (4, 11, 3, 3, 1, 1, False),  # the input gradient's classes
    (96, 9, 3, 2, 1, 1, False),  # three blocks of 32 channels
]:
    conv = nn.Conv2d(c, c, k, s, p, d, groups=c, bias=bias)
    check(conv, torch.randn(2, c, side, side + 1).contiguous(memory_format=torch.channels_last))

# one input channel read by every output channel (model.stem_conv=depthwise: a grayscale stem):
# the weight gradient from the kernels; the input's, when it needs one, cuDNN's; none computed
# for an input without requires_grad (the images)
for c, side, s, bias, needs in [(6, 13, 2, False, False), (70, 9, 1, True, True)]:
    check(nn.Conv2d(1, c, 3, s, 1, bias=bias), torch.randn(2, 1, side, side + 2), needs)

# an NCHW input (made channels_last inside); bf16 under autocast: the interpreter rounds
# fp32 -> bf16 by truncation, not to nearest as GPUs do, so only a bf16-sized tolerance here
conv = nn.Conv2d(8, 8, 3, 2, 1, groups=8, bias=False)
x = torch.randn(2, 8, 12, 10)
with torch.autocast("cpu", dtype=torch.bfloat16):
    ref, out = conv(x), TritonDepthwise(conv)(x)
assert out.dtype == ref.dtype == torch.bfloat16
assert (out.float() - ref.float()).abs().max() < 0.05 * ref.float().abs().max()

# compiled: one op to inductor (its fake shapes and strides), gradients as eager
model = nn.Sequential(nn.Conv2d(8, 8, 1), TritonDepthwise(conv), nn.ReLU6())
x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
model(x1).sum().backward()
torch.compile(model)(x2).sum().backward()
assert torch.allclose(x1.grad, x2.grad, atol=1e-5)
print("kernels ok")
"""


def test_the_kernels_match_conv2d_in_tritons_interpreter():
    run_in_triton_interpreter(KERNELS)


def test_without_cuda_it_is_pytorchs_convolution():
    torch.manual_seed(0)
    model = build_mobilenet_v2(10, in_channels=1)
    ref = build_mobilenet_v2(10, in_channels=1)
    ref.load_state_dict(model.state_dict())
    assert swap_depthwise(model, TritonDepthwise) == 17
    assert model.state_dict().keys() == ref.state_dict().keys()
    # (the swapped layers hand on channels_last tensors: later layers sum in another order)
    assert_same_step_float64(model, ref)


def test_compiled_without_cuda_the_strides_are_what_the_op_declares():
    """PyTorch's convolution in the op's place must still return channels_last tensors, or
    inductor's stride check fails (an NCHW input here)."""
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(4, 4, 3, 1, 1, groups=4, bias=False)
    x = torch.randn(2, 4, 9, 9)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    torch.compile(TritonDepthwise(conv))(x1).square().sum().backward()
    conv(x2).square().sum().backward()
    assert torch.allclose(x1.grad, x2.grad, atol=1e-5)
