"""model.kernels=triton-loss (models/causal_lm/ce_triton.py): the kernel, run in Triton's
interpreter, gives F.cross_entropy's loss and the gradients of hidden and lm_head's weight,
with ignored tokens, rows wider than one block and an incoming gradient other than 1; and a CPU
run is refused with one line."""

import os
import subprocess
import sys

import pytest

from paratrain.config import load_config
from paratrain.errors import UserError

CHECK = """
import torch
from torch.nn import functional as F
from paratrain.models.causal_lm import ce_triton
ce_triton.BLOCK = 128  # 300 columns: three blocks, the last one partly masked
torch.manual_seed(0)
for dtype in (torch.float32, torch.bfloat16):
    hidden = torch.randn(2, 7, 16, dtype=dtype)
    weight = torch.randn(300, 16, dtype=dtype)
    labels = torch.randint(0, 300, (2, 7))
    labels[0, 2:5] = -100
    a = [hidden.clone().requires_grad_(), weight.clone().requires_grad_()]
    b = [hidden.clone().requires_grad_(), weight.clone().requires_grad_()]
    ours = ce_triton.triton_lm_loss(a[0], labels, a[1])
    shifted = F.pad(labels, (0, 1), value=-100)[:, 1:].flatten()
    ref = F.cross_entropy((b[0].flatten(0, 1) @ b[1].t()).float(), shifted, ignore_index=-100)
    (ours / 3).backward()  # 1/3: inexact in bf16, so the scale must be applied in fp32
    (ref / 3).backward()
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    assert ours.dtype == torch.float32
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5 if dtype == torch.float32 else 1e-2)
    torch.testing.assert_close(a[0].grad, b[0].grad, **tol)
    torch.testing.assert_close(a[1].grad, b[1].grad, **tol)
    # the incoming gradient applied in fp32: 1/3 rounded to bf16 would scale every element 0.2%
    # up (against our own gradients at 1: the interpreter rounds bf16 its own way)
    c = [hidden.clone().requires_grad_(), weight.clone().requires_grad_()]
    ce_triton.triton_lm_loss(c[0], labels, c[1]).backward()
    for third, whole in ((a[0].grad, c[0].grad), (a[1].grad, c[1].grad)):
        ratio = 3 * (third.float() * whole.float()).sum() / (whole.float() ** 2).sum()
        assert abs(ratio.item() - 1) < 5e-4, (dtype, ratio.item())
print("same")
"""


def test_kernel_gives_cross_entropy_and_its_gradients():
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    out = subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True, text=True)
    assert out.returncode == 0 and "same" in out.stdout, out.stderr[-3000:]


def test_refused_on_the_cpu():
    from paratrain.runplan import resolve
    from paratrain.tasks.causal_lm import preflight

    cfg = load_config(
        None,
        [
            "model.kernels=triton-loss",
            "model.shape=tiny",
            "device=cpu",
            "model.init=random",
            "data.source=synthetic-text",
        ],
    )
    plan = resolve(cfg)
    with pytest.raises(UserError, match="model.kernels: triton-loss runs a Triton kernel on CUDA"):
        preflight(plan.config, plan.layout, cuda=False)
