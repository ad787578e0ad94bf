"""Cross-entropy over whole bf16 logits [16,384 x 128,256] (the Llama-3.2-1B shape at 8 x 2,048),
compiled, forward + backward: F.cross_entropy on the fp32 upcast (paratrain's WholeLoss) against
the same loss written as log-sum-exp minus the target logit, whose backward needs only the bf16
logits and one number per row. Measured on one H200 (2026-12-04, issue 34): 5.21 against
6.57 ms, so WholeLoss keeps cross_entropy. Prints each one's time (CUDA
events, median of 20) and how far its loss and gradient are from the first one's.
    PYTHONPATH=src python3 benchmarks/device/ce_bench.py"""

import torch
import torch.nn.functional as F

IGNORE = -100
N, V = 16_384, 128_256


def upcast_ce(logits, labels):
    return F.cross_entropy(logits.float(), labels, ignore_index=IGNORE)


def lse_ce(logits, labels):
    keep = labels != IGNORE
    lse = torch.logsumexp(logits.float(), dim=-1)
    target = logits.gather(-1, labels.clamp(min=0)[:, None]).squeeze(-1).float()
    return ((lse - target) * keep).sum() / keep.sum()


def timed(fn, logits, labels):
    compiled = torch.compile(fn)
    x = logits.detach().requires_grad_()
    for _ in range(3):
        compiled(x, labels).backward()
        x.grad = None
    times = []
    for _ in range(20):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        loss = compiled(x, labels)
        loss.backward()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
        grad = x.grad
        x.grad = None
    return sorted(times)[len(times) // 2], loss.detach(), grad


def main():
    torch.manual_seed(0)
    logits = (torch.randn(N, V, device="cuda") * 2).to(torch.bfloat16)
    labels = torch.randint(0, V, (N,), device="cuda")
    labels[::97] = IGNORE
    rows = {}
    for name, fn in (("upcast F.cross_entropy", upcast_ce), ("log-sum-exp - target", lse_ce)):
        rows[name] = timed(fn, logits, labels)
    ref_loss, ref_grad = rows["upcast F.cross_entropy"][1:]
    for name, (ms, loss, grad) in rows.items():
        dl = (loss - ref_loss).abs().item()
        dg = (grad.float() - ref_grad.float()).abs().max().item()
        print(
            f"{name:28s} {ms:7.3f} ms  loss {loss.item():.6f}  |dloss| {dl:.2e}  max|dgrad| {dg:.2e}"
        )


if __name__ == "__main__":
    main()
