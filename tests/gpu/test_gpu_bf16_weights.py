"""train.bf16_weights on CUDA: the Triton kernel against the torch arithmetic it replaces, and
MasterAdamW's masters against torch's fused AdamW on fp32 weights. Marked `gpu`."""

import pytest
import torch

from paratrain.optim.master_adamw import MasterAdamW, adamw_master_reference, to_bf16_weights

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)


def state(n, device):
    gen = torch.Generator(device=device).manual_seed(1)
    return {
        "master": torch.randn(n, device=device, generator=gen),
        "exp_avg": torch.randn(n, device=device, generator=gen) * 0.1,
        "exp_avg_sq": torch.rand(n, device=device, generator=gen) * 0.2,
        "step": torch.tensor(4.0, device=device),
    }


@pytest.mark.parametrize("n", [7, 2048, 1_000_003])
def test_kernel_equals_torch_arithmetic_on_the_gpu(n):
    from paratrain.optim.master_adamw_triton import adamw_master_step

    dev = torch.device("cuda", 0)
    g = torch.randn(n, device=dev).to(torch.bfloat16)
    kw = dict(lr=3e-4, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1)
    flags = dict(grad_scale=torch.tensor(1.7, device=dev), found_inf=torch.zeros((), device=dev))
    a, b = state(n, dev), state(n, dev)
    wa = torch.empty(n, device=dev, dtype=torch.bfloat16)
    wb = wa.clone()
    adamw_master_reference(wa, g, a, **kw, **flags)
    adamw_master_step(wb, g, b, **kw, **flags)
    for k in ("master", "exp_avg", "exp_avg_sq"):
        torch.testing.assert_close(b[k], a[k], rtol=2e-6, atol=1e-7)
    # the weight is the master rounded to nearest, as torch rounds
    assert torch.equal(wb, b["master"].to(torch.bfloat16))
    kept, wk = {k: v.clone() for k, v in b.items()}, wb.clone()
    adamw_master_step(wb, g, b, **kw, grad_scale=None, found_inf=torch.ones((), device=dev))
    assert torch.equal(wb, wk) and all(torch.equal(b[k], kept[k]) for k in kept)


def test_masters_follow_torch_fused_adamw_on_the_gpu():
    dev = torch.device("cuda", 0)
    torch.manual_seed(0)
    shapes = [(512, 300), (300,), (4096, 64)]
    fp32 = [torch.nn.Parameter(torch.randn(s, device=dev)) for s in shapes]
    model = torch.nn.Module()
    for i, p in enumerate(fp32):
        model.register_parameter(f"w{i}", torch.nn.Parameter(p.detach().clone()))
    masters = to_bf16_weights(model)
    low = list(model.parameters())
    kw = dict(lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    ref = torch.optim.AdamW(fp32, fused=True, **kw)
    opt = MasterAdamW(low, masters, **kw)
    for _ in range(5):
        for p, q in zip(fp32, low, strict=True):
            g = torch.randn_like(p)
            p.grad, q.grad = g.to(torch.bfloat16).float(), g.to(torch.bfloat16)
        ref.step()
        opt.step()
    for p, q in zip(fp32, low, strict=True):
        torch.testing.assert_close(opt.state[q]["master"], p.detach(), rtol=1e-5, atol=1e-6)
        assert torch.equal(q.detach(), opt.state[q]["master"].to(torch.bfloat16))
