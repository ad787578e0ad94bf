"""model.kernels=triton-loss on CUDA: the kernel against compiled F.cross_entropy over a full
Llama-3 vocabulary, loss and gradients, under bf16 autocast with fp32 weights and with bf16
weights. Marked `gpu`."""

import pytest
import torch
from torch.nn import functional as F

from paratrain.models.causal_lm.ce_triton import triton_lm_loss

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)


@pytest.mark.parametrize("weights", [torch.float32, torch.bfloat16])
def test_triton_loss_equals_cross_entropy_on_the_gpu(weights):
    dev = torch.device("cuda", 0)
    torch.manual_seed(0)
    hidden = torch.randn(4, 512, 2048, device=dev, dtype=weights)
    weight = (torch.randn(128_256, 2048, device=dev) * 0.02).to(weights)
    labels = torch.randint(0, 128_256, (4, 512), device=dev)
    labels[1, 100:300] = -100

    def reference(h, w, y):
        shifted = F.pad(y, (0, 1), value=-100)[:, 1:].flatten()
        return F.cross_entropy((h.flatten(0, 1) @ w.t()).float(), shifted, ignore_index=-100)

    a = [hidden.clone().requires_grad_(), weight.clone().requires_grad_()]
    b = [hidden.clone().requires_grad_(), weight.clone().requires_grad_()]
    with torch.autocast("cuda", dtype=torch.bfloat16):
        ours = triton_lm_loss(a[0], labels, a[1])
        ref = torch.compile(reference)(b[0], b[1], labels)
    (ours * 0.5).backward()
    (ref * 0.5).backward()
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)
    for x, y in zip(a, b, strict=True):
        assert x.grad.dtype == weights
        torch.testing.assert_close(x.grad.float(), y.grad.float(), rtol=2e-2, atol=1e-5)
