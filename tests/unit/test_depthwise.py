"""model.depthwise_conv=shift-add: the same function and gradients as nn.Conv2d."""

import pytest
import torch
from torch import nn

from paratrain.models.depthwise import ShiftAddDepthwise, shift_add_depthwise
from paratrain.models.vision import build_mobilenet_v2


def assert_same_as_conv(conv: nn.Conv2d, mine: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """mine(x) against conv(x) in float64: the output, and the gradients of the parameters
    (the same Parameter objects) and, when x requires one, of the input. -> conv(x)."""
    x1, x2 = (x.detach().clone().requires_grad_(x.requires_grad) for _ in range(2))
    ref, out = conv(x1), mine(x2)
    assert out.shape == ref.shape and torch.allclose(out, ref, atol=1e-12)
    g = torch.randn_like(ref)
    ref.backward(g)
    grads = [p.grad.clone() for p in conv.parameters()]
    conv.zero_grad()
    out.backward(g)
    if x.requires_grad:
        assert torch.allclose(x2.grad, x1.grad, atol=1e-12)
    for a, p in zip(grads, conv.parameters(), strict=True):
        assert torch.allclose(p.grad, a, atol=1e-12)
    return ref.detach()


@pytest.mark.parametrize(
    "stride,padding,dilation,bias,side",
    [(1, 1, 1, False, 13), (2, 1, 1, False, 13), (2, 1, 1, True, 12), (1, 2, 2, True, 11)],
)
def test_same_output_and_gradients_as_conv2d(stride, padding, dilation, bias, side):
    torch.manual_seed(0)
    conv = nn.Conv2d(6, 6, 3, stride, padding, dilation, groups=6, bias=bias).double()
    x = torch.randn(2, 6, side, side, dtype=torch.float64, requires_grad=True)
    assert_same_as_conv(conv, ShiftAddDepthwise(conv), x)


def test_autocast_dtype_and_channels_last():
    torch.manual_seed(0)
    conv = nn.Conv2d(8, 8, 3, 1, 1, groups=8, bias=False)
    x = torch.randn(2, 8, 10, 10).contiguous(memory_format=torch.channels_last)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref, out = conv(x), ShiftAddDepthwise(conv)(x)
    assert out.dtype == ref.dtype == torch.bfloat16
    assert (out.float() - ref.float()).abs().max() < 0.05  # bf16 rounding, not a different sum


def test_swaps_only_depthwise_layers_and_keeps_the_state_dict():
    model = build_mobilenet_v2(10, in_channels=1)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert shift_add_depthwise(model) == 17  # MobileNetV2's 17 depthwise 3x3 layers
    assert sum(isinstance(m, ShiftAddDepthwise) for m in model.modules()) == 17
    assert sum(type(m) is nn.Conv2d for m in model.modules()) == 35  # stem, 1x1s, last 1x1
    after = model.state_dict()
    assert after.keys() == before.keys()
    assert all(torch.equal(after[k], before[k]) for k in before)
    model.eval()
    x = torch.randn(2, 1, 64, 64)
    ref = build_mobilenet_v2(10, in_channels=1)
    ref.load_state_dict(before)
    ref.eval()
    assert torch.allclose(model(x), ref(x), atol=1e-5)


def test_below_min_side_it_is_the_native_convolution(monkeypatch):
    torch.manual_seed(0)
    conv = nn.Conv2d(4, 4, 3, 1, 1, groups=4, bias=False)
    mine = ShiftAddDepthwise(conv, min_side=10)
    calls = []
    real = torch.nn.functional.conv2d
    monkeypatch.setattr(
        torch.nn.functional, "conv2d", lambda *a, **k: calls.append(1) or real(*a, **k)
    )
    small, big = torch.randn(1, 4, 9, 12), torch.randn(1, 4, 10, 10)
    assert torch.allclose(mine(small), conv(small), atol=1e-6)
    assert len(calls) == 2  # ours and the reference: the native path
    assert torch.allclose(mine(big), conv(big), atol=1e-6)
    assert len(calls) == 3  # only the reference: shift-add


def test_a_one_channel_stem_as_a_broadcast_depthwise_convolution():
    """model.stem_conv=depthwise: MobileNetV2's stem on grayscale images (1 -> 32) in the
    depthwise form, the same function and gradients as nn.Conv2d; below min_side the native
    convolution (groups=1, not the weight's channels)."""
    torch.manual_seed(0)
    conv = nn.Conv2d(1, 5, 3, 2, 1, bias=True).double()
    x = torch.randn(2, 1, 11, 12, dtype=torch.float64)
    ref = assert_same_as_conv(conv, ShiftAddDepthwise(conv), x)
    assert torch.allclose(ShiftAddDepthwise(conv, min_side=50)(x), ref, atol=1e-12)


def test_stem_conv_swaps_the_one_channel_stem_only():
    from paratrain.config import load_config
    from paratrain.errors import UserError
    from paratrain.models import apply_depthwise_conv
    from paratrain.models.depthwise import is_one_channel

    cfg = load_config(None, ["model.depthwise_conv=shift-add", "model.stem_conv=depthwise"])
    model = build_mobilenet_v2(10, in_channels=1)
    apply_depthwise_conv(model, cfg.model)
    assert isinstance(model.features[0][0], ShiftAddDepthwise)
    assert sum(isinstance(m, ShiftAddDepthwise) for m in model.modules()) == 18
    assert not any(is_one_channel(m) for m in model.modules())
    rgb = build_mobilenet_v2(10, in_channels=3)  # no one-channel convolution: said, not ignored
    with pytest.raises(UserError, match="model.stem_conv"):
        apply_depthwise_conv(rgb, cfg.model)
    with pytest.raises(ValueError, match="stem_conv: depthwise needs"):
        load_config(None, ["model.stem_conv=depthwise", "model.depthwise_conv=native"])
    # left at auto, the depthwise layers are the plan's: on this CPU native, so refused there
    from paratrain.runplan import plan_of

    with pytest.raises(ValueError, match="stem_conv: depthwise needs"):
        plan_of(None, ["model.stem_conv=depthwise"])


def test_strided_layers_can_take_their_own_min_side():
    """model.strided_min_side: the stride-2 depthwise layers swapped from their own input side
    (Triton beat cuDNN at stride 2 at every MobileNetV2 size on H200), the others from
    shift_add_min_side; unset, one threshold for all."""
    from paratrain.config import load_config
    from paratrain.models import apply_depthwise_conv

    sets = ["model.depthwise_conv=triton", "model.shift_add_min_side=200"]
    for extra, strided_side in [([], 200), (["model.strided_min_side=0"], 0)]:
        model = build_mobilenet_v2(10, in_channels=1)
        apply_depthwise_conv(model, load_config(None, [*sets, *extra]).model)
        swapped = [m for m in model.modules() if hasattr(m, "min_side")]
        assert len(swapped) == 17
        for m in swapped:
            assert m.min_side == (strided_side if max(m.stride) > 1 else 200), m
    with pytest.raises(ValueError, match="strided_min_side: must be >= 0"):
        load_config(None, ["model.strided_min_side=-1"])
