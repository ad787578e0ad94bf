"""One forward/backward of the tiny Llama, plain and under one-rank TP (sequence parallel, loss
parallel), on the same batch: per-parameter gradient differences, and for the embedding the rows
whose plain gradient is exactly zero (tokens absent from the batch), which AdamW turns any
nonzero noise into steps of ~lr. Then one AdamW step of each. Device: cuda if present.
  python benchmarks/device/diag_tp_grads.py"""

import copy
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import loss_parallel

from paratrain.models.causal_lm.build import build_causal_lm
from paratrain.models.causal_lm.loss import ChunkedLossLM
from paratrain.models.causal_lm.spec import CausalLMSpec
from paratrain.parallel.tp import apply_tp, replicate_partial_grads, split_by_kind

cuda = torch.cuda.is_available()
dev = "cuda" if cuda else "cpu"
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29533")
dist.init_process_group("nccl" if cuda else "gloo", rank=0, world_size=1)
mesh = init_device_mesh(dev, (1,))
torch.manual_seed(0)
lm = build_causal_lm(None, "random", "tiny", "sdpa", torch.float32, dev)
plain = ChunkedLossLM(lm, 0)
tp = copy.deepcopy(plain)
apply_tp(tp, CausalLMSpec().tp_plan(tp), mesh)
ids = torch.randint(0, 259, (4, 64), device=dev)
present = torch.zeros(320, dtype=torch.bool, device=dev)
present[ids.unique()] = True

plain(input_ids=ids, labels=ids).loss.backward()
with loss_parallel():
    tp(input_ids=ids, labels=ids).loss.full_tensor().backward()
tp_params = list(tp.parameters())
replicate_partial_grads([p for p in tp_params if hasattr(p, "placements")])


def whole(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t


grads = {n: whole(p.grad) for n, p in tp.named_parameters()}
for n, p in plain.named_parameters():
    g = grads[n]
    d = (p.grad - g).abs().max().item()
    rel = d / max(p.grad.abs().max().item(), 1e-30)
    print(f"{n:48s} grad max diff {d:.2e} (relative {rel:.1e})")
    if n.endswith("embed_tokens.weight"):
        zero_rows = (p.grad == 0).all(dim=1)
        print(
            f"  embedding: {int(present.sum())} of 320 tokens in the batch; rows with a zero plain "
            f"gradient {int(zero_rows.sum())}, of which nonzero under TP "
            f"{int((g[zero_rows] != 0).any(dim=1).sum())} (largest {g[zero_rows].abs().max().item():.1e});"
            f" rows zero under TP {int((g == 0).all(dim=1).sum())}"
        )

opt_a = torch.optim.AdamW(list(plain.parameters()), lr=0.01)
opt_b = torch.optim.AdamW(split_by_kind(tp_params), lr=0.01)
print("optimizer defaults:", {k: opt_a.defaults.get(k) for k in ("foreach", "fused")})
opt_a.step()
opt_b.step()
for (n, p), q in zip(plain.named_parameters(), tp.parameters(), strict=True):
    d = (p.detach() - whole(q.detach())).abs().max().item()
    if d > 1e-6:
        print(f"after one AdamW step {n}: max diff {d:.2e}")
    if n.endswith("embed_tokens.weight"):
        rows = ((p.detach() - whole(q.detach())).abs() > 1e-3).any(dim=1)
        print(
            f"  embedding rows moved apart by > 1e-3: {int(rows.sum())} "
            f"({int((rows & present).sum())} of them tokens in the batch)"
        )
print("done")
dist.destroy_process_group()
