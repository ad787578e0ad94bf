"""train.bf16_weights: bf16 model weights, fp32 masters in MasterAdamW. The update equals torch's
AdamW on the fp32 weights (the reference arithmetic and the Triton kernel, run in Triton's
interpreter), the guard's skip and the clip's divisor act as in torch's fused AdamW, the masters
survive a checkpoint in fp32, and a run trains, resumes bit for bit and refuses what it does not
cover."""

import os
import subprocess
import sys

import pytest
import torch
from conftest import TINY_LM, max_abs_diff, train

from paratrain.checkpoint import read_checkpoint
from paratrain.config import load_config
from paratrain.errors import UserError
from paratrain.optim.master_adamw import MasterAdamW, to_bf16_weights
from paratrain.runplan import resolve

SHAPES = [(33, 17), (5,), (3000,)]  # odd sizes: the kernel's masked tail block


def weights():
    gen = torch.Generator().manual_seed(0)
    return [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in SHAPES]


def grads(step: int):
    gen = torch.Generator().manual_seed(100 + step)
    return [torch.randn(s, generator=gen) for s in SHAPES]


def pair(wd=0.1):
    """torch's AdamW on fp32 weights, and MasterAdamW on their bf16 copies."""
    fp32 = weights()
    low = weights()
    model = torch.nn.Module()
    for i, p in enumerate(low):
        model.register_parameter(f"w{i}", p)
    masters = to_bf16_weights(model)
    kw = dict(lr=0.01, betas=(0.9, 0.95), weight_decay=wd)
    return fp32, torch.optim.AdamW(fp32, **kw), low, MasterAdamW(low, masters, **kw)


def step_both(fp32, ref, low, opt, step, scale=None, inf=None):
    for p, q, g in zip(fp32, low, grads(step), strict=True):
        p.grad = g.clone()
        q.grad = g.to(torch.bfloat16)  # what a bf16 backward hands over
    ref.step()
    opt.grad_scale, opt.found_inf = scale, inf
    opt.step()
    opt.grad_scale = opt.found_inf = None


def check_tracks(fp32, low, opt):
    for p, q in zip(fp32, low, strict=True):
        master = opt.state[q]["master"]
        assert q.dtype == torch.bfloat16 and master.dtype == torch.float32
        # the gradients were rounded to bf16 on the way, so the masters follow closely, not exactly
        torch.testing.assert_close(master, p.detach(), rtol=0, atol=2e-4)
        assert torch.equal(q.detach(), master.to(torch.bfloat16))  # the weight is the rounding


def test_masters_follow_torch_adamw():
    fp32, ref, low, opt = pair()
    for p, q in zip(fp32, low, strict=True):  # step 0: the masters are the fp32 weights
        assert torch.equal(opt.state[q]["master"], p.detach())
    for step in range(3):
        step_both(fp32, ref, low, opt, step)
    check_tracks(fp32, low, opt)
    assert float(opt.state[low[0]]["step"]) == 3.0


def test_the_kernel_equals_the_torch_arithmetic():
    """The Triton kernel in Triton's interpreter, in a process of its own (TRITON_INTERPRET is
    read when the kernels are defined): an update with the clip's divisor, then a skipped one."""
    pytest.importorskip("triton")
    code = (
        "import torch, os\n"
        "from paratrain.optim import master_adamw as m\n"
        "from paratrain.optim.master_adamw_triton import adamw_master_step\n"
        "torch.manual_seed(0)\n"
        "w = torch.randn(5000).to(torch.bfloat16); g = torch.randn(5000).to(torch.bfloat16)\n"
        "def state():\n"
        "    return {'master': torch.randn(5000, generator=torch.Generator().manual_seed(1)),\n"
        "            'exp_avg': torch.full((5000,), 0.1), 'exp_avg_sq': torch.full((5000,), 0.2),\n"
        "            'step': torch.tensor(4.0)}\n"
        "kw = dict(lr=0.01, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1,\n"
        "          grad_scale=torch.tensor(2.0), found_inf=torch.tensor(0.0))\n"
        "a, b = state(), state(); wa, wb = w.clone(), w.clone()\n"
        "m.adamw_master_reference(wa, g, a, **kw); adamw_master_step(wb, g, b, **kw)\n"
        "for k in ('master', 'exp_avg', 'exp_avg_sq'):\n"
        "    torch.testing.assert_close(a[k], b[k], rtol=1e-6, atol=1e-7)\n"
        # the interpreter truncates to bf16 where the GPU rounds to nearest: within one step
        "r = b['master'].to(torch.bfloat16).float()\n"
        "assert ((wb.float() - r).abs() <= r.abs() * 2 ** -7).all()\n"
        "assert not torch.equal(wb, w)\n"
        "kept = {k: v.clone() for k, v in b.items()}; wk = wb.clone()\n"
        "adamw_master_step(wb, g, b, **{**kw, 'found_inf': torch.tensor(1.0)})\n"
        "assert torch.equal(wb, wk) and all(torch.equal(b[k], kept[k]) for k in kept)\n"
        "print('same')\n"
    )
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0 and "same" in out.stdout, out.stderr[-2000:]


def test_skip_and_divisor_act_as_torch_fused_adamw():
    fp32, ref, low, opt = pair(wd=0.0)
    step_both(fp32, ref, low, opt, 0)
    before = {k: v.clone() for k, v in opt.state[low[0]].items()}
    weight = low[0].detach().clone()
    # found_inf set: nothing moves, the step is not counted (torch's fused AdamW)
    for q, g in zip(low, grads(1), strict=True):
        q.grad = g.to(torch.bfloat16)
    opt.found_inf = torch.tensor(1.0)
    opt.step()
    opt.found_inf = None
    assert torch.equal(low[0].detach(), weight)
    for k, v in before.items():
        assert torch.equal(opt.state[low[0]][k], v), k
    # grad_scale 2: the same update as gradients halved first
    halved = [g / 2 for g in grads(1)]
    for p, g in zip(fp32, halved, strict=True):
        p.grad = g
    ref.step()
    for q, g in zip(low, grads(1), strict=True):
        q.grad = g.to(torch.bfloat16)
    opt.grad_scale = torch.tensor(2.0)
    opt.step()
    opt.grad_scale = None
    check_tracks(fp32, low, opt)


def test_state_dict_round_trip_keeps_fp32_masters():
    fp32, ref, low, opt = pair()
    step_both(fp32, ref, low, opt, 0)
    saved = opt.state_dict()
    fresh_weights = [torch.nn.Parameter(q.detach().clone()) for q in low]
    fresh = MasterAdamW(fresh_weights, lr=0.01, betas=(0.9, 0.95), weight_decay=0.1)
    fresh.load_state_dict(saved)  # torch's own would round the masters to the weights' bf16
    for q, f in zip(low, fresh_weights, strict=True):
        for k in ("master", "exp_avg", "exp_avg_sq", "step"):
            assert fresh.state[f][k].dtype == torch.float32
            assert torch.equal(fresh.state[f][k], opt.state[q][k]), k


LM = [*TINY_LM, "lora.enabled=false", "precision=bf16", "train.optimizer=adamw"]
LM += ["train.bf16_weights=true", "train.max_grad_norm=1.0", "checkpoint.every_steps=2"]


def test_run_trains_in_bf16_and_resumes_bit_for_bit(tmp_path):
    def run(out, *settings):
        return train(load_config(None, [*LM, "train.max_steps=4", *settings, f"output_dir={out}"]))

    plain = run(tmp_path / "fp32 weights", "train.bf16_weights=false")
    straight = run(tmp_path / "straight")
    ckpt = tmp_path / "straight" / "checkpoints"
    resumed = run(tmp_path / "resumed", f"checkpoint.resume={ckpt / 'step_00000002'}")
    assert resumed["summary"]["steps_this_run"] == 2
    a = read_checkpoint(ckpt / "step_00000004")
    b = read_checkpoint(tmp_path / "resumed" / "checkpoints" / "step_00000004")
    assert all(v.dtype == torch.bfloat16 for v in a["model"].values())
    assert max_abs_diff(a["model"], b["model"]) == 0.0
    masters = {k: v for k, v in a["optimizer"].items() if "master" in k}
    assert masters and all(v.dtype == torch.float32 for v in masters.values())
    assert max_abs_diff(masters, {k: b["optimizer"][k] for k in masters}) == 0.0
    assert max_abs_diff(a["model"], read_checkpoint(ckpt / "step_00000002")["model"]) > 0
    # the same training as fp32 weights under autocast, to bf16's rounding
    ours = [e["train_loss"] for e in straight["epochs"]]
    theirs = [e["train_loss"] for e in plain["epochs"]]
    assert ours == pytest.approx(theirs, rel=2e-2), (ours, theirs)


@pytest.mark.parametrize(
    "setting, says",
    [
        ("precision=fp32", "precision=bf16"),
        ("train.optimizer=sgd", "train.optimizer sgd"),
        ("lora.enabled=true", "not with lora"),
        ("strategy=fsdp", "FSDP's mixed precision"),
        ("strategy=tp", "tensor / pipeline parallelism are not covered"),
        ("strategy=ddp-ds sync.mode=local_sgd train.max_grad_norm=null", "not their fp32 masters"),
        ("strategy=ddp-ds sync.mode=stale train.max_grad_norm=null", "outside DDP's fp32 sum"),
        ("strategy=split", "one process or DDP"),
        ("strategy=ddp-ds ddp.gradient_compression=int8", "int8 is not covered"),
    ],
)
def test_refusals_name_the_key(setting, says):
    cfg = load_config(None, [*LM, *setting.split()])
    with pytest.raises(UserError) as e:
        resolve(cfg, given=("strategy",))
    assert str(e.value).startswith("train.bf16_weights:") and says in str(e.value)


def test_ddp_is_taken():
    """Under DDP the gradients are summed in fp32 (tests/distributed/test_bf16_weights_ddp.py)."""
    for extra in ([], ["ddp.gradient_compression=bf16"]):
        cfg = load_config(None, [*LM, "strategy=ddp-ds", *extra])
        assert resolve(cfg, given=("strategy",)).layout.uses == {"ddp"}


def test_an_image_task_is_refused_by_name():
    settings = ["train.bf16_weights=true", "precision=bf16", "train.optimizer=adamw"]
    cfg = load_config(None, ["data.source=synthetic", "model.name=tiny_cnn", *settings])
    with pytest.raises(UserError) as e:
        resolve(cfg, given=("strategy",))
    assert str(e.value).startswith("train.bf16_weights:") and "task causal_lm" in str(e.value)
