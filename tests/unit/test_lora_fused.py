"""lora.fused (models/causal_lm/lora_matmul.py): each adapter's product inside its base layer's
matmul, against peft's own layer; which layers it takes; what the plan decides for it."""

import copy

import pytest
import torch
from conftest import RECIPES
from peft import LoraConfig, get_peft_model
from test_levers import H100, chosen, on  # noqa: F401 - `on` is a fixture

from paratrain.models.causal_lm.lora_matmul import fits, fuse_adapters


class Two(torch.nn.Module):
    def __init__(self, bias: bool):
        super().__init__()
        self.q = torch.nn.Linear(32, 24, bias=bias)
        self.k = torch.nn.Linear(32, 8, bias=False)

    def forward(self, x):
        return self.q(x).sum(-1) + self.k(x).sum(-1)


def adapted(dtype, bias=False, **lora):
    torch.manual_seed(0)
    model = get_peft_model(
        Two(bias).to(dtype), LoraConfig(r=4, lora_alpha=12, target_modules=["q"], **lora)
    )
    for name, p in model.named_parameters():
        if p.requires_grad:
            p.data = p.data.float()  # as apply_lora keeps them
            if "lora_B" in name:  # peft starts B at zero, which would hide A's gradient
                torch.nn.init.normal_(p)
    return model


def step(model, x, autocast: bool):
    x = x.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        y = model(x)
    y.sum().backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.requires_grad}
    return y.detach(), x.grad, grads


@pytest.mark.parametrize("bias", [False, True])
def test_the_fused_layer_computes_peft_s_forward_and_gradients(bias):
    ref = adapted(torch.float32, bias)
    new = copy.deepcopy(ref)
    assert fuse_adapters(new) == (1, [])
    x = torch.randn(3, 5, 32)
    (y0, dx0, g0), (y1, dx1, g1) = step(ref, x, False), step(new, x, False)
    torch.testing.assert_close(y1, y0)
    torch.testing.assert_close(dx1, dx0)
    assert g0.keys() == g1.keys() and len(g0) == 2
    for name in g0:
        assert g1[name].dtype == torch.float32  # the fp32 adapters' gradients stay fp32
        torch.testing.assert_close(g1[name], g0[name], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("base", [torch.bfloat16, torch.float32])
def test_under_bf16_autocast_and_compiled_it_stays_within_bf16_rounding(base):
    """The recipe's bf16 base, and an fp32 one that autocast casts per matmul."""
    ref = adapted(base)
    new = copy.deepcopy(ref)
    assert fuse_adapters(new) == (1, [])
    x = torch.randn(4, 32, dtype=base)
    y0, dx0, g0 = step(ref, x, True)
    y1, dx1, g1 = step(new, x, True)

    # one rounding fewer (the sum in the matmul's accumulator): within bf16's rounding
    def apart(a, b):
        return ((a.float() - b.float()).norm() / b.float().norm()).item()

    assert apart(y1, y0) < 2**-7 and apart(dx1, dx0) < 2**-7
    for name in g0:
        assert apart(g1[name], g0[name]) < 2**-7, name
    compiled = torch.compile(new, fullgraph=True)  # no graph break: one graph a layer
    y2, dx2, _ = step(compiled, x, True)
    assert apart(y2, y1) < 2**-7 and apart(dx2, dx1) < 2**-7


def test_layers_it_does_not_fit_keep_peft_s_forward():
    assert "dropout" in fits(adapted(torch.float32, lora_dropout=0.1).base_model.model.q)
    trained = adapted(torch.float32)
    trained.base_model.model.q.base_layer.weight.requires_grad_(True)
    assert "trained" in fits(trained.base_model.model.q)
    patched, kept = fuse_adapters(adapted(torch.float32, lora_dropout=0.1))
    assert patched == 0 and "dropout" in kept[0]
    # peft's switches still act on a patched layer: adapters off, the base layer alone
    ref = adapted(torch.float32)
    model = copy.deepcopy(ref)
    fuse_adapters(model)
    x = torch.randn(2, 32)
    with model.disable_adapter(), ref.disable_adapter():
        torch.testing.assert_close(model(x), ref(x))
        base = ref(x)
    assert (model(x) - base).abs().max() > 1e-3  # on again: adapted


def test_the_plan_fuses_lora_where_measured_and_refuses_it_where_it_cannot(on):  # noqa: F811
    recipe = RECIPES / "llama3_8b_lora_random.yaml"
    assert chosen(on(H100, recipe))["lora.fused"] is True
    assert chosen(on(H100, recipe, ["model.fp8=delayed"]))["lora.fused"] is False
    assert chosen(on(H100, recipe, ["lora.dropout=0.05"]))["lora.fused"] is False
    full = on(H100, RECIPES / "llama3.2_1b_full_random.yaml")
    assert chosen(full)["lora.fused"] is False
    with pytest.raises(Exception, match="lora.fused"):
        on(H100, recipe, ["model.fp8=delayed", "lora.fused=true"])
    with pytest.raises(Exception, match="dropout"):
        on(H100, recipe, ["lora.dropout=0.05", "lora.fused=true"])


def test_the_two_ops_pass_torch_s_custom_op_checks():
    """Schema, fake tensors (what compile traces), autograd registration, AOT dispatch."""
    from paratrain.models.causal_lm.lora_matmul import lora_backward, lora_forward

    rows, w = torch.randn(6, 8, requires_grad=True), torch.randn(5, 8)
    a, b = torch.randn(2, 8, requires_grad=True), torch.randn(5, 2, requires_grad=True)
    for bias in (None, torch.randn(5)):
        torch.library.opcheck(lora_forward, (rows, w, bias, a, b, 2.0))
    low = rows.detach() @ a.detach().t()
    for need in (True, False):
        args = (torch.randn(6, 5), rows.detach(), low, w, a.detach(), b.detach(), 2.0, need)
        torch.library.opcheck(lora_backward, args)


def test_auto_leaves_a_quantized_checkpoint_to_peft(tmp_path):
    import json
    import types

    from paratrain.tasks import lm_levers

    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "llama", "quantization_config": {"quant_method": "bitsandbytes"}})
    )
    cfg = types.SimpleNamespace(model=types.SimpleNamespace(path=str(tmp_path)))
    assert lm_levers.quantized(cfg)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert not lm_levers.quantized(cfg)
