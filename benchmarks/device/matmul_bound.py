"""The floor under a step: its matmuls and its attention timed alone on the GPU (issue 34).

For the two workloads of issue 34 it times the matmuls one training step must do, with the
model's own shapes and one weight per layer, and the attention's forward + backward:
  - LoRA, Llama-3 8B shape, 2 x 2,048 tokens: base weights frozen, so each projection's forward
    and its input's gradient (no weight gradient); lm_head the same;
  - full training, Llama-3.2-1B shape, 8 x 2,048 tokens: forward, input and weight gradients.
Each set is timed as the model has it (q, k, v and gate, up as separate matmuls) and fused
(one [q;k;v] and one [gate;up] weight, the same FLOPs in fewer, larger matmuls), to decide
whether fusing the projections is worth building. Attention runs through each sdpa backend,
with GQA's k/v repeated (transformers' sdpa path) and, where a backend takes it, enable_gqa.

The sum of the matmuls and the fastest attention is a floor for the step: a step cannot be
faster than the matmuls it must do at the speed cuBLAS does them on this GPU at its power limit.
    PYTHONPATH=src python3 benchmarks/device/matmul_bound.py            # on the GPU
    python3 benchmarks/device/matmul_bound.py --small                    # CPU check of the code
"""

import argparse
import json
import os
import time

import torch
import torch.nn.functional as F
from parts_bench import events  # the same CUDA-event timing (this folder)

SHAPES = {
    # name: tokens, hidden, q, kv, ffn, vocab, layers, heads, kv_heads, trains_weights
    "lora_8b": dict(
        m=4096,
        h=4096,
        q=4096,
        kv=1024,
        ff=14336,
        v=128256,
        layers=32,
        b=2,
        heads=32,
        kv_heads=8,
        weights=False,
    ),
    "full_1b": dict(
        m=16384,
        h=2048,
        q=2048,
        kv=512,
        ff=8192,
        v=128256,
        layers=16,
        b=8,
        heads=32,
        kv_heads=8,
        weights=True,
    ),
}
# the CPU check's shape: each workload's own trains_weights flag on one tiny model
TINY = dict(m=64, h=64, q=64, kv=16, ff=128, v=256, layers=2, b=2, heads=4, kv_heads=2)
SMALL = {name: {**TINY, "weights": s["weights"]} for name, s in SHAPES.items()}


def timer(dev):
    """Median milliseconds of fn over repeats: CUDA events on the GPU (parts_bench's events),
    the wall clock on CPU."""

    def wall(fn, repeats):
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
        return sorted(times)[len(times) // 2]

    def run(fn, repeats=10, warm=3):
        for _ in range(warm):
            fn()
        return (events if dev == "cuda" else wall)(fn, repeats)

    return run


def matmul_sets(s, dev, dtype):
    """One step's matmuls, separate and fused, as closures over per-layer weights ([out, in],
    the fused weight's rows are the separate weights: the same memory, the same values)."""
    h, m, q, kv, ff = s["h"], s["m"], s["q"], s["kv"], s["ff"]
    g = torch.Generator(device=dev).manual_seed(0)

    def rnd(*shape):
        return torch.randn(*shape, device=dev, dtype=dtype, generator=g) * 0.02

    layers = []
    for _ in range(s["layers"]):
        qkv, gu = rnd(q + 2 * kv, h), rnd(2 * ff, h)
        layers.append(dict(qkv=qkv, gu=gu, o=rnd(h, q), down=rnd(h, ff)))
    head = rnd(s["v"], h)
    x, xq, xf = rnd(m, h), rnd(m, q), rnd(m, ff)
    d_qkv, d_gu, d_h, d_v = rnd(m, q + 2 * kv), rnd(m, 2 * ff), rnd(m, h), rnd(m, s["v"])

    def projections(fused):
        """(weight, input, output-gradient) per matmul of one layer."""
        out = []
        for w in layers:
            if fused:
                out += [(w["qkv"], x, d_qkv), (w["gu"], x, d_gu)]
            else:
                sq = w["qkv"].split([q, kv, kv])
                sg = w["gu"].split([ff, ff])
                # the model's separate gradients are separate tensors: contiguous, made here
                dq = [t.contiguous() for t in d_qkv.split([q, kv, kv], dim=1)]
                dg = [t.contiguous() for t in d_gu.split([ff, ff], dim=1)]
                out += [(a, x, d) for a, d in zip(sq, dq, strict=True)] + [
                    (a, x, d) for a, d in zip(sg, dg, strict=True)
                ]
            out += [(w["o"], xq, d_h), (w["down"], xf, d_h)]
        return out + [(head, x, d_v)]

    def step(fused):
        work = projections(fused)

        def run():
            for w, inp, dy in work:
                torch.mm(inp, w.t())  # forward
                torch.mm(dy, w)  # the input's gradient
                if s["weights"]:
                    torch.mm(dy.t(), inp)  # the weight's gradient

        return run

    flops = 0
    for w, _, _ in projections(True):
        flops += 2 * m * w.shape[0] * w.shape[1] * (3 if s["weights"] else 2)
    return step(False), step(True), flops


def attention_rows(s, dev, dtype, run):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    b, heads, kvh = s["b"], s["heads"], s["kv_heads"]
    d = s["q"] // heads
    seq = s["m"] // b
    g = torch.Generator(device=dev).manual_seed(1)
    q = torch.randn(b, heads, seq, d, device=dev, dtype=dtype, generator=g)
    k = torch.randn(b, kvh, seq, d, device=dev, dtype=dtype, generator=g)
    v = torch.randn(b, kvh, seq, d, device=dev, dtype=dtype, generator=g)
    dout = torch.randn(b, heads, seq, d, device=dev, dtype=dtype, generator=g)
    rows = {}
    backends = {
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "flash": SDPBackend.FLASH_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "math": SDPBackend.MATH,
    }
    if dev != "cuda":
        backends = {"math": SDPBackend.MATH}
    for name, backend in backends.items():
        for gqa in (False, True):

            def one(gqa=gqa):
                qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
                if gqa:
                    o = F.scaled_dot_product_attention(qq, kk, vv, is_causal=True, enable_gqa=True)
                else:
                    rep = heads // kvh
                    o = F.scaled_dot_product_attention(
                        qq,
                        kk.repeat_interleave(rep, 1),
                        vv.repeat_interleave(rep, 1),
                        is_causal=True,
                    )
                o.backward(dout)

            label = f"{name}{' enable_gqa' if gqa else ''}"
            try:
                with sdpa_kernel([backend]):
                    rows[label] = run(one) * s["layers"]
            except RuntimeError as e:  # a backend that does not take this shape says so
                rows[label] = f"refused: {str(e).splitlines()[0][:80]}"
    if dev == "cuda":  # flex_attention, compiled, with a causal block mask
        try:
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention

            mask = create_block_mask(lambda b_, h_, qi, ki: qi >= ki, None, None, seq, seq)
            flex = torch.compile(flex_attention)

            def one_flex():
                qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
                flex(qq, kk, vv, block_mask=mask, enable_gqa=True).backward(dout)

            rows["flex compiled"] = run(one_flex) * s["layers"]
        except Exception as e:  # noqa: BLE001 - a row that cannot run says why
            rows["flex compiled"] = f"failed: {str(e).splitlines()[0][:80]}"
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--small", action="store_true", help="tiny shapes, to check the code on CPU")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    dev = "cuda" if torch.cuda.is_available() and not args.small else "cpu"
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    run = timer(dev)
    result = {
        "device": torch.cuda.get_device_name() if dev == "cuda" else "cpu",
        "torch": torch.__version__,
    }
    for name, s in (SMALL if args.small else SHAPES).items():
        separate, fused, flops = matmul_sets(s, dev, dtype)
        t_sep, t_fused = run(separate), run(fused)
        lt = None
        if dev == "cuda":  # cuBLASLt chosen for plain mm as well (torch's preferred_blas_library)
            torch.backends.cuda.preferred_blas_library("cublaslt")
            lt = run(separate)
            torch.backends.cuda.preferred_blas_library("cublas")
        att = attention_rows(s, dev, dtype, run)
        best = min(v for v in att.values() if isinstance(v, float))
        row = dict(
            matmul_flops=flops,
            separate_ms=t_sep,
            fused_ms=t_fused,
            separate_tflops=flops / t_sep / 1e9,
            fused_tflops=flops / t_fused / 1e9,
            separate_cublaslt_ms=lt,
            attention_ms_per_step=att,
            floor_ms=min(t_sep, t_fused) + best,
        )
        result[name] = row
        print(
            f"{name}: matmuls {flops / 1e12:.1f} TFLOP: separate {t_sep:.2f} ms "
            f"({flops / t_sep / 1e9:.0f} TFLOP/s), fused q/k/v and gate/up {t_fused:.2f} ms "
            f"({flops / t_fused / 1e9:.0f} TFLOP/s)",
            flush=True,
        )
        if lt is not None:
            print(f"  separate with cuBLASLt preferred: {lt:.2f} ms", flush=True)
        for label, ms in att.items():
            print(
                f"  attention {label:22s} "
                + (f"{ms:8.2f} ms a step" if isinstance(ms, float) else ms),
                flush=True,
            )
        print(f"  floor (matmuls + fastest attention): {row['floor_ms']:.1f} ms", flush=True)
        del separate, fused
        if dev == "cuda":
            torch.cuda.empty_cache()
    with open(os.path.join(args.out, "matmul_bound.json"), "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
