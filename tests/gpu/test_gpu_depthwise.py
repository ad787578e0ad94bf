"""model.depthwise_conv=shift-add and =triton on CUDA, compiled, against cuDNN's depthwise
convolutions (channels_last). Marked `gpu`: skipped without CUDA.

A whole random-init MobileNetV2 is compared in fp32 (TF32 off): in bf16 its gradients are too
sensitive to where roundings fall to compare (on CPU, compiled against eager with no swap at
all: cosine 0.62). The bf16 numerics are compared one layer at a time."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from paratrain.models.depthwise import ShiftAddDepthwise, swap_depthwise
from paratrain.models.depthwise_triton import TritonDepthwise
from paratrain.models.vision import build_mobilenet_v2

pytestmark = pytest.mark.gpu


@pytest.fixture
def no_tf32():
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def mobilenet_without_dropout() -> nn.Module:
    """No dropout: two steps on one batch would draw different masks (the classifier's
    Dropout(0.2) made an earlier form of these tests fail)."""
    torch.manual_seed(0)
    model = build_mobilenet_v2(10, in_channels=1).cuda().to(memory_format=torch.channels_last)
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
    return model


def compare_steps(native: nn.Module, swapped: nn.Module) -> None:
    """One fp32 step of each on one batch: the swapped model compiled, the same loss and
    gradients as the native one, eager."""
    x = torch.randn(8, 1, 128, 128, device="cuda").contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (8,), device="cuda")

    def step(model):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        return loss.detach(), torch.cat([p.grad.flatten() for p in model.parameters()])

    loss_a, grads_a = step(native)
    loss_b, grads_b = step(torch.compile(swapped))
    assert abs(loss_a - loss_b) / loss_a < 1e-4
    assert F.cosine_similarity(grads_a, grads_b, dim=0) > 0.999


def bf16_passes(modules, x):
    """Forward and backward of each module under bf16 autocast, one input and one output
    gradient: -> (outputs, [input gradient, parameters' gradients] each), in fp32."""
    grad_out, outs, grads = None, [], []
    for module in modules:
        xi = x.clone().requires_grad_(True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = module(xi)
        assert out.dtype == torch.bfloat16
        grad_out = torch.randn_like(out) if grad_out is None else grad_out
        out.backward(grad_out)
        outs.append(out.float())
        grads.append([xi.grad.float(), *(p.grad.float() for p in module.parameters())])
    return outs, grads


@pytest.mark.parametrize("form", [ShiftAddDepthwise, TritonDepthwise])
def test_compiled_step_matches_cudnn_fp32(no_tf32, form):
    native = mobilenet_without_dropout()
    swapped = copy.deepcopy(native)
    assert swap_depthwise(swapped, form) == 17
    compare_steps(native, swapped)


@pytest.mark.parametrize("form", [ShiftAddDepthwise, TritonDepthwise])
@pytest.mark.parametrize("channels,stride", [(32, 1), (96, 2)])  # MobileNetV2's 250 px layers
def test_compiled_layer_matches_cudnn_bf16(channels, stride, form):
    torch.manual_seed(0)
    conv = nn.Conv2d(channels, channels, 3, stride, 1, groups=channels, bias=False).cuda()
    conv = conv.to(memory_format=torch.channels_last)
    layer = torch.compile(form(copy.deepcopy(conv)))
    x = torch.randn(4, channels, 250, 250, device="cuda").contiguous(
        memory_format=torch.channels_last
    )
    outs, grads = bf16_passes((conv, layer), x)
    assert (outs[0] - outs[1]).abs().max() < 0.05 * outs[0].abs().max()
    for a, b in zip(grads[0], grads[1], strict=True):
        assert F.cosine_similarity(a.flatten(), b.flatten(), dim=0) > 0.999


def test_compiled_triton_stem_matches_cudnn_bf16():
    """model.stem_conv=depthwise: MobileNetV2's one-channel stem (1 -> 32, stride 2) at the
    seed's 500 px as the Triton op (its input gradient, asked for here, cuDNN's)."""
    torch.manual_seed(0)
    conv = nn.Conv2d(1, 32, 3, 2, 1, bias=False).cuda().to(memory_format=torch.channels_last)
    layer = torch.compile(TritonDepthwise(copy.deepcopy(conv)))
    x = torch.randn(8, 1, 500, 500, device="cuda").contiguous(memory_format=torch.channels_last)
    outs, grads = bf16_passes((conv, layer), x)
    assert (outs[0] - outs[1]).abs().max() < 0.05 * outs[0].abs().max()
    for a, b in zip(grads[0], grads[1], strict=True):
        assert F.cosine_similarity(a.flatten(), b.flatten(), dim=0) > 0.999
    # as in training: images without requires_grad, so no input gradient is computed
    conv.weight.grad = layer.weight.grad = None
    g = torch.randn_like(outs[0]).bfloat16()  # the layers output bf16 under autocast
    for module in (conv, layer):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            module(x).backward(g)
    a, b = conv.weight.grad.flatten(), layer.weight.grad.flatten()
    assert F.cosine_similarity(a, b, dim=0) > 0.999


def test_compiled_triton_batchnorm_step_matches_native_fp32(no_tf32):
    """model.batchnorm=triton (with the Triton depthwise layers) on a whole MobileNetV2 step."""
    from paratrain.models.batchnorm_triton import triton_batchnorm

    native = mobilenet_without_dropout()
    swapped = copy.deepcopy(native)
    assert swap_depthwise(swapped, TritonDepthwise) == 17 and triton_batchnorm(swapped) == 52
    compare_steps(native, swapped)
    bufs = zip(native.buffers(), swapped.buffers(), strict=True)
    assert all(torch.allclose(a.float(), b.float(), rtol=1e-3, atol=1e-4) for a, b in bufs)


# MobileNetV2's 250 px BatchNorm layers; 144 channels (125 px in the model): wide rows of 1,152
@pytest.mark.parametrize("channels", [32, 96, 144])
def test_triton_batchnorm_relu6_layer_matches_native_bf16(channels):
    from paratrain.models.batchnorm_triton import RELU6, TritonBatchNorm

    torch.manual_seed(0)
    bn = nn.BatchNorm2d(channels).cuda()
    native, mine = nn.Sequential(copy.deepcopy(bn), nn.ReLU6()), TritonBatchNorm(bn, RELU6)
    x = torch.randn(4, channels, 250, 250, device="cuda", dtype=torch.bfloat16) * 2 + 1
    x = x.contiguous(memory_format=torch.channels_last)
    outs, grads = bf16_passes((native, mine), x)
    assert (outs[0] - outs[1]).abs().max() < 0.05
    for a, b in zip(grads[0], grads[1], strict=True):
        assert F.cosine_similarity(a.flatten(), b.flatten(), dim=0) > 0.999
    assert torch.allclose(native[0].running_var, bn.running_var, rtol=1e-3)
