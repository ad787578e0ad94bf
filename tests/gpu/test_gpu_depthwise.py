"""model.depthwise_conv=shift-add on CUDA: compiled, the same training step as cuDNN's depthwise
convolutions (bf16 autocast, channels_last). Marked `gpu`: skipped without CUDA."""

import copy

import pytest
import torch
import torch.nn.functional as F

from paratrain.models.depthwise import shift_add_depthwise
from paratrain.models.vision import build_mobilenet_v2

pytestmark = pytest.mark.gpu


def step(model, x, y):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = F.cross_entropy(model(x), y)
    loss.backward()
    grads = torch.cat([p.grad.flatten() for p in model.parameters()])
    return loss.detach(), grads


def test_compiled_shift_add_step_matches_cudnn():
    torch.manual_seed(0)
    native = build_mobilenet_v2(10, in_channels=1).cuda().to(memory_format=torch.channels_last)
    swapped = copy.deepcopy(native)
    assert shift_add_depthwise(swapped) == 17
    x = torch.randn(8, 1, 128, 128, device="cuda").contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (8,), device="cuda")
    loss_a, grads_a = step(native, x, y)
    loss_b, grads_b = step(torch.compile(swapped), x, y)
    assert abs(loss_a - loss_b) / loss_a < 1e-2  # bf16 roundings in different places
    cos = F.cosine_similarity(grads_a.float(), grads_b.float(), dim=0)
    assert cos > 0.99
