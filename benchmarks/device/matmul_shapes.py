"""Issue 61, item 1: matmul and attention rates by shape on one GPU: the table that the analytic
plan (forecast/analytic/step.py: one rate for every matmul today) is to interpolate by (M, N, K).

GEMMs: a Llama decoder layer's q/k/v fused ("qkv") and apart ("q"; "kv" is each of k and v), o,
gate/up fused ("gate_up") and apart ("gate" is each of gate and up), down, and the lm_head, of
Llama 3.2-1B, 3.1-8B, 70B, 405B split t = 1, 2, 4, 8 ways as torchtitan's TP plan splits them
(q/k/v, gate/up, lm_head by columns: N / t; o, down by rows: K / t; sequence parallel gathers the
tokens first, so M stays the micro-batch's T tokens), T = 2,048 ... 16,384, as three GEMMs each:
    forward      Y  = X W^T    (M, N, K) = (T, out, in)   A row-major,    B column-major
    grad_input   dX = dY W     (M, N, K) = (T, in, out)   A row-major,    B row-major
    grad_weight  dW = dY^T X   (M, N, K) = (out, in, T)   A column-major, B row-major
405B only at t >= 4 (below, its training does not fit 80 GB). bf16 by torch.mm; float8 by
torch._scaled_mm as torchao 0.18's Float8Linear calls it (A row-major, B column-major: its casts,
not timed, lay them out so): tensorwise, e4m3 x e4m3 forward with fast accumulation, e5m2 gradient
x e4m3 without; rowwise, e4m3, the forward with (M, 1) x (1, N) fp32 scales and fast accumulation,
the gradients' on the tensorwise kernel, unit scales, no fast accumulation (torchao scales their
output after); the lm_head in bf16 only (torchtitan's). A shape met again (a fused op at 2t is the
separate one at t) is timed once, reported under each name ("shared": the numbers are another's).
Attention: sdpa causal, forward and backward apart, bf16, k/v expanded to the query heads
(torchtitan's repeat_kv) and, as "<backend>_gqa", shared through enable_gqa (transformers' sdpa
path on torch >= 2.5: paratrain's decoder), flash and cuDNN, each model's heads / t, seq 2,048 / 4,096 / 8,192 at
batch 16,384 / seq; FLOPs 4 b h s^2 d / 2 forward (the causal half), 2.5x that backward.

Timing (CUDA events after a warm-up, as matmul_bound.py, work_kinds_calibrate.py): a large GEMM runs
--heat s first, to the power-limited clock; then each measurement is held the same --hold (40%
warm-up, three back-to-back windows, their median) in shuffled order, so the power manager (a ~1 s
average: issue 52's power calls) sees one steady mix and no run of small shapes lifts the clock,
with NVML's SM clock and power (read only). Calls under 0.1 ms replay a CUDA graph, unpadded by
Python's launches. The hold shrinks to keep within --budget.
    PYTHONUNBUFFERED=1 python3 benchmarks/device/matmul_shapes.py --out $OUT --budget 240
    python3 benchmarks/device/matmul_shapes.py --small --out /tmp/ms     # CPU check of the code
    python3 benchmarks/device/matmul_shapes.py --attention-only --out $OUT --budget 120
-> --out/matmul_shapes.json ({"meta": ..., "rows": [...]}, a row a line), matmul_shapes.md.
"""

import argparse
import contextlib
import itertools
import json
import math
import os
import random
import statistics
import time

import torch
import torch.nn.functional as F

# fmt: off
MODELS = {  # hidden, ffn, heads, kv heads: the config.json fields (as in forecast/shapes.py)
    "llama3.2-1b": (2048, 8192, 32, 8), "llama3.1-8b": (4096, 14336, 32, 8),
    "llama3.1-70b": (8192, 28672, 64, 8), "llama3.1-405b": (16384, 53248, 128, 8),
}
FULL = dict(models=MODELS, vocab=128256, tps=(1, 2, 4, 8), tokens=(2048, 4096, 8192, 16384),
            seqs=(2048, 4096, 8192), att_tokens=16384,
            skip={("llama3.1-405b", 1), ("llama3.1-405b", 2)})
SMALL = dict(models={"tiny": (64, 128, 4, 2)}, vocab=256, tps=(1, 2), tokens=(32, 64),
             seqs=(32, 64), att_tokens=64, skip=set())
OPS = ("qkv", "q", "kv", "o", "gate_up", "gate", "down", "lm_head")
FORMS = ("forward", "grad_input", "grad_weight")
BF16_LAYOUT = {"forward": ("row", "col"), "grad_input": ("row", "row"), "grad_weight": ("col", "row")}
# float8 scaling -> form -> (A dtype, B dtype, rowwise scales in the kernel, fast accumulation)
F8 = {
    "tensorwise": {"forward": ("e4m3", "e4m3", False, True),
                   "grad_input": ("e5m2", "e4m3", False, False),
                   "grad_weight": ("e5m2", "e4m3", False, False)},
    "rowwise": {"forward": ("e4m3", "e4m3", True, True),
                "grad_input": ("e4m3", "e4m3", False, False),
                "grad_weight": ("e4m3", "e4m3", False, False)},
}
# fmt: on
DTYPES = (("bf16", None), *(("float8", s) for s in F8))
F8_DTYPES = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
KERNELS = {"flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION"}  # sdpa backends timed
PASSES = ("forward", "backward")


def gemm_grid(g):
    """Every (model, t, T, op, form, dtype) as a row, and the distinct GEMMs they need."""
    rows, specs = [], {}
    for model, tp, tokens in itertools.product(g["models"], g["tps"], g["tokens"]):
        h, f, heads, kvh = g["models"][model]
        kv = kvh * (h // heads)  # a TP rank's (in, out) features of each weight:
        ins = dict(qkv=h, q=h, kv=h, o=h // tp, gate_up=h, gate=h, down=f // tp, lm_head=h)
        outs = dict(qkv=(h + 2 * kv) // tp, q=h // tp, kv=kv // tp, o=h, gate_up=2 * f // tp)
        outs.update(gate=f // tp, down=h, lm_head=g["vocab"] // tp)
        for op, (dtype, scaling) in itertools.product(OPS, DTYPES):
            if (model, tp) in g["skip"] or (dtype == "float8" and op == "lm_head"):
                continue  # torchtitan keeps the lm_head in bf16
            i, o = ins[op], outs[op]
            mnks = ((tokens, o, i), (tokens, i, o), (o, i, tokens))  # forward, grad_input, _weight
            for form, mnk in zip(FORMS, mnks, strict=True):
                key = (form, *mnk, dtype, scaling)
                specs.setdefault(key, gemm_spec(*key))
                rows.append(dict(model=model, tp=tp, op=op, tokens=tokens, key=key))
    return rows, specs


def gemm_spec(form, m, n, k, dtype, scaling):
    a, b, rowwise, fast = F8[scaling][form] if scaling else ("bf16", "bf16", False, None)
    layout = "A {}, B {}".format(*BF16_LAYOUT[form]) if not scaling else "A row, B col"
    spec = dict(kind="gemm", form=form, M=m, N=n, K=k, dtype=dtype, scaling=scaling, a_dtype=a)
    return dict(spec, b_dtype=b, fast_accum=fast, rowwise_scales=rowwise, layout=layout)


def footprint(s):
    """Elements of an operand set, and the sets rotated: past the L2 cache together (METHOD.md)."""
    size = s["M"] * s["K"] + s["K"] * s["N"]
    return size, min(64, -(-(1 << 27) // size))


def make_pools(specs, dev):
    """A random buffer per dtype, every operand a view of it (A, B, set after set): no allocation
    or cast per measurement; float8 values fill the range as torchao's scales make them."""
    need = {"bf16": 1, "float8": 0}
    for s in specs.values():
        need[s["dtype"]] = max(need[s["dtype"]], math.prod(footprint(s)))
    torch.manual_seed(0)
    pools = {"bf16": torch.randn(max(need.values()), device=dev, dtype=torch.bfloat16)}
    for name, dt in F8_DTYPES.items() if need["float8"] else ():
        top = torch.finfo(dt).max
        pools[name] = (pools["bf16"][: need["float8"]] * (0.9 * top / 6)).clamp_(-top, top).to(dt)
    return pools


def operand(pool, offset, rows, cols, order):
    flat = pool[offset : offset + rows * cols]
    return flat.view(rows, cols) if order == "row" else flat.view(cols, rows).t()


def gemm_fn(s, pools):
    """The GEMM as a call that takes the next operand set each time."""
    (m, n, k), (size, sets) = (s["M"], s["N"], s["K"]), footprint(s)
    la, lb = BF16_LAYOUT[s["form"]] if s["dtype"] == "bf16" else ("row", "col")  # _scaled_mm's
    a = [operand(pools[s["a_dtype"]], i * size, m, k, la) for i in range(sets)]
    b = [operand(pools[s["b_dtype"]], i * size + m * k, k, n, lb) for i in range(sets)]
    turn = itertools.cycle(list(zip(a, b, strict=True)))
    if s["dtype"] == "bf16":
        return lambda: torch.mm(*next(turn))
    rows = s["rowwise_scales"]  # fp32 scales: one a row of A and a column of B, or one in all
    sa, sb = (torch.ones(shape if rows else (), device=a[0].device) for shape in [(m, 1), (1, n)])
    kw = dict(out_dtype=torch.bfloat16, use_fast_accum=s["fast_accum"])
    return lambda: torch._scaled_mm(*next(turn), sa, sb, **kw)


def timed(fn, hold, dev, side=None, probe=dict):
    """ms a call: a first call (kernel choice, lazy loading), one timed call to size the rest,
    40% of `hold` warm-up, three back-to-back windows of 20% each: their median and spread.
    CUDA events on the GPU, the wall clock on the CPU; probe() (NVML) read as the windows run."""
    cuda = dev == "cuda"
    sync = torch.cuda.synchronize if cuda else lambda: None

    def mark():  # a CUDA event recorded on the stream, or the wall clock now
        if cuda:
            (e := torch.cuda.Event(enable_timing=True)).record()
            return e
        return time.perf_counter()

    def between(a, b):
        return a.elapsed_time(b) if cuda else (b - a) * 1e3

    fn()
    sync()
    a, _, b = mark(), fn(), mark()
    sync()
    unit, run, per, graph = max(between(a, b), 1e-4), fn, 1, None
    if side is not None and unit < 0.1:  # launch-bound: a graph of ~0.5 ms, its replay timed
        per, graph = min(128, math.ceil(0.5 / unit)), torch.cuda.CUDAGraph()
        try:
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # cuBLAS's workspace for the capture's stream
                fn()
            with torch.cuda.graph(graph, stream=side):
                for _ in range(per):
                    fn()
            torch.cuda.current_stream().wait_stream(side)
            run = graph.replay
        except RuntimeError as e:  # the eager loop times it instead
            print(f"graph capture failed: {str(e).splitlines()[0][:100]}", flush=True)
            run, per, graph = fn, 1, None
        a, _, b = mark(), [run() for _ in range(5)], mark()
        sync()
        unit = between(a, b) / 5
    for _ in range(max(1, round(0.4 * hold * 1e3 / unit))):
        run()
    n, marks = max(1, round(0.2 * hold * 1e3 / unit)), [mark()]
    for _ in range(3):
        for _ in range(n):
            run()
        marks.append(mark())
    seen = probe()
    sync()
    ts = [between(marks[i], marks[i + 1]) / (n * per) for i in range(3)]
    ms, calls = statistics.median(ts), 3 * n * per
    return dict(ms=ms, spread=(max(ts) - min(ts)) / ms, calls=calls, graph=bool(graph), **seen)


def grouped_here(g, model, tp) -> bool:
    """Whether a TP rank of the model has fewer k/v heads than query heads (GQA left)."""
    _, _, heads, kvh = g["models"][model]
    return max(kvh // tp, 1) < heads // tp


def attention_job(job, g, dev, hold, probe):
    """Forward, then backward alone (autograd.grad over the kept graph), under one backend."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    model, tp, seq, backend, layout = job
    h, _, heads, kvh = g["models"][model]
    d, hq, hk, b = h // heads, heads // tp, max(kvh // tp, 1), max(1, g["att_tokens"] // seq)
    grouped = layout == "grouped"
    info = dict(kind="attention", model=model, tp=tp, head_dim=d, heads=hq, kv_heads=hk)
    # grouped: k and v keep their hk heads and sdpa shares them (enable_gqa, as transformers'
    # sdpa path and paratrain's decoder call it on torch >= 2.5), under a backend of its own
    # name in the table ("cudnn_gqa"); expanded: each repeated hq / hk times first (torchtitan
    # 2024's repeat_kv)
    info.update(seq=seq, batch=b, backend=f"{backend}_gqa" if grouped else backend, causal=True)
    info.update(kv="grouped (enable_gqa)" if grouped else "expanded to the heads")
    q, dout = (torch.randn(b, hq, seq, d, device=dev).bfloat16() for _ in range(2))
    k, v = (torch.randn(b, hk if grouped else hq, seq, d, device=dev).bfloat16() for _ in range(2))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    forward, rows = 4 * b * hq * seq * seq * d / 2, []
    with sdpa_kernel([getattr(SDPBackend, KERNELS.get(backend, "MATH"))]):
        fwd = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=grouped)  # noqa: E731
        for name, flops in zip(PASSES, (forward, 2.5 * forward), strict=True):
            try:
                if name == "forward":
                    r = timed(fwd, hold, dev, probe=probe)
                else:  # the forward's graph kept: each call runs the backward kernels alone
                    out = fwd()
                    grad = lambda o=out: torch.autograd.grad(o, (q, k, v), dout, retain_graph=True)  # noqa: E731
                    r = timed(grad, hold, dev, probe=probe)
                r["tflops"] = flops / r["ms"] / 1e9
            except RuntimeError as e:  # a backend that does not take this shape says why
                r = dict(ms=None, tflops=None, error=str(e).splitlines()[0][:160])
            rows.append({**info, "pass": name, "flops": flops, **r})
    return rows


def nvml_readers():
    """info() (driver, power limit, clocks) and probe() (SM clock, power: NVML updates them
    every ~100 ms) through NVML, read only; both empty where NVML cannot be read."""
    try:
        import pynvml as nv

        nv.nvmlInit()
        try:
            h = nv.nvmlDeviceGetHandleByUUID(f"GPU-{torch.cuda.get_device_properties(0).uuid}")
        except Exception:  # noqa: BLE001 - one GPU lent: NVML's index 0
            h = nv.nvmlDeviceGetHandleByIndex(0)
    except Exception as e:  # noqa: BLE001 - the rates stand without the clocks
        print(f"NVML not read: {e}", flush=True)
        return dict, dict

    def read(**fields):
        out = {}
        for key, fn in fields.items():
            with contextlib.suppress(Exception):  # a field this driver lacks stays out
                out[key] = fn()
        return out

    def watts():  # the instant power where the driver has it, else its averaged reading
        with contextlib.suppress(Exception):
            v = nv.nvmlDeviceGetFieldValues(h, [nv.NVML_FI_DEV_POWER_INSTANT])[0]
            if v.nvmlReturn == 0:
                return v.value.uiVal / 1e3
        return nv.nvmlDeviceGetPowerUsage(h) / 1e3

    def probe():
        return read(sm_mhz=lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM), power_w=watts)

    def info():
        return probe() | read(
            driver=nv.nvmlSystemGetDriverVersion,
            power_limit_w=lambda: nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1e3,
            max_sm_mhz=lambda: nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM),
            max_mem_mhz=lambda: nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_MEM),
            temperature_c=lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
            clock_event_reasons=lambda: hex(nv.nvmlDeviceGetCurrentClocksEventReasons(h)),
        )

    return info, probe


def main():
    start = time.perf_counter()
    ap = argparse.ArgumentParser()
    ap.add_argument("--small", action="store_true", help="tiny shapes on the CPU: checks the code")
    ap.add_argument("--attention-only", action="store_true", help="attention's rows alone")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--budget", type=float, default=240, help="seconds from start, at most")
    ap.add_argument("--hold", type=float, default=None, help="s a measurement (0.05; small 0.002)")
    ap.add_argument("--heat", type=float, default=8.0, help="s of a large GEMM first (GPU)")
    args = ap.parse_args()
    cuda = torch.cuda.is_available() and not args.small
    dev, g, max_hold = ("cuda", FULL, 0.05) if cuda else ("cpu", SMALL, 0.002)
    max_hold = args.hold or max_hold
    info, probe = nvml_readers() if cuda else (dict, dict)
    meta = dict(gpu=torch.cuda.get_device_name() if cuda else "cpu", torch=torch.__version__)
    meta.update(cuda=torch.version.cuda, cudnn=torch.backends.cudnn.version() if cuda else None)
    meta.update(nvml=info(), grid={k: sorted(v) if k == "skip" else v for k, v in g.items()})
    meta.update(flops="GEMM 2 M N K; attention 4 b h s^2 d / 2 forward (causal), 2.5x backward")
    rows, specs = ([], {}) if args.attention_only else gemm_grid(g)
    pools = make_pools(specs, dev)
    backends = list(KERNELS) if cuda else ["math"]
    att = itertools.product(g["models"], g["tps"], g["seqs"], backends, ("expanded", "grouped"))
    att = [
        ("attention", a)
        for a in att
        if a[:2] not in g["skip"] and (a[4] == "expanded" or grouped_here(g, *a[:2]))
    ]
    jobs = [("gemm", key) for key in specs] + att
    random.Random(0).shuffle(jobs)  # one steady mix of shapes all through (see the docstring)
    if cuda and args.heat > 0:  # a bf16 GEMM of 8,192^3: the GPU at its power-limited state
        x = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
        r = timed(lambda: torch.mm(x, x), args.heat, dev, probe=probe)  # its rate: the last 60%
        meta["heat"] = dict(r, seconds=args.heat, tflops=2 * 8192**3 / r["ms"] / 1e9)
        print(f"heated: {json.dumps(meta['heat'])}", flush=True)
    side = torch.cuda.Stream() if cuda else None
    left = sum(2 if kind == "attention" else 1 for kind, _ in jobs)
    deadline, extra, extra_n, holds = start + args.budget - 5, 0.0, 0, []
    done, att_rows, missed = {}, [], []
    print(f"{len(specs)} GEMMs ({len(rows)} rows), {len(att)} attention jobs", flush=True)
    for i, (kind, job) in enumerate(jobs):
        units = 2 if kind == "attention" else 1
        per, left = (deadline - time.perf_counter()) / left, left - units
        if per <= 0:  # past the budget: what is left is reported as not measured
            missed.append(job)
            continue
        holds.append(hold := min(max_hold, max(0.01 if cuda else 0.0, per - extra)))  # >= 10 ms
        t0 = time.perf_counter()
        if kind == "gemm":
            s = specs[job]
            try:
                done[job] = timed(gemm_fn(s, pools), hold, dev, side, probe)
                done[job]["tflops"] = 2 * s["M"] * s["N"] * s["K"] / done[job]["ms"] / 1e9
            except RuntimeError as e:  # a kernel that refuses a shape says why
                done[job] = dict(ms=None, tflops=None, error=str(e).splitlines()[0][:160])
        else:
            att_rows += attention_job(job, g, dev, hold, probe)
        extra_n += units  # the time a measurement takes beyond its hold, on average
        extra += ((time.perf_counter() - t0) - hold * units - extra * units) / extra_n
        if i % max(1, len(jobs) // 10) == 0:
            took = time.perf_counter() - start
            print(f"{i}/{len(jobs)} at {took:.0f} s, hold {hold * 1e3:.0f} ms", flush=True)
    out, seen, missing = [], set(), dict(ms=None, tflops=None, error="not measured: over --budget")
    for row in rows:
        key = row.pop("key")
        out.append({**row, **specs[key], **done.get(key, missing), "shared": key in seen})
        seen.add(key)
    clocks = [r["sm_mhz"] for r in out + att_rows if r.get("sm_mhz")]
    deciles = statistics.quantiles(clocks, n=10) if len(clocks) > 1 else [None] * 9
    meta.update(nvml_after=info(), sm_mhz_p10_p50_p90=deciles[::4], not_measured=missed)
    hold_s = [max_hold, min(holds, default=0), statistics.fmean(holds or [0])]  # max, min, mean
    meta.update(hold_s=hold_s, seconds=time.perf_counter() - start)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "matmul_shapes.json"), "w") as f:  # a row a line
        f.write('{"meta": ' + json.dumps(meta) + ',\n"rows": [\n')
        f.write(",\n".join(json.dumps(r) for r in out + att_rows) + "\n]}\n")
    with open(os.path.join(args.out, "matmul_shapes.md"), "w") as f:
        f.write(markdown(meta, out, att_rows, g))
    print(f"{len(out) + len(att_rows)} rows in {meta['seconds']:.0f} s -> {args.out}")


def markdown(meta, gemms, atts, g):
    """The rates at a glance: each op's three GEMMs together, by model and t; attention."""
    hi, lo = max(g["tokens"]), min(g["tokens"])
    nv, warm = meta["nvml"], meta.get("heat", {})
    lines = [
        "# Matmul and attention rates by shape (matmul_shapes.py, issue 61)\n",
        f"{meta['gpu']}, torch {meta['torch']}, CUDA {meta['cuda']}, cuDNN {meta['cudnn']}, "
        f"driver {nv.get('driver')}, power limit {nv.get('power_limit_w')} W, max SM clock "
        f"{nv.get('max_sm_mhz')} MHz. Heater: {warm.get('tflops', 0):.0f} TFLOP/s at "
        f"{warm.get('sm_mhz')} MHz, {warm.get('power_w')} W. SM clock over the sweep (NVML, p10 "
        f"/ p50 / p90): {meta['sm_mhz_p10_p50_p90']} MHz. {meta['seconds']:.0f} s; hold (max, "
        f"min, mean) {meta['hold_s']} s; not measured (budget): {len(meta['not_measured'])}.\n",
        f"GEMMs: TFLOP/s of forward + grad_input + grad_weight together at {hi:,} tokens "
        f"({lo:,} in brackets); kv is each of k and v, gate each of gate and up.",
    ]
    rate = {}  # (dtype, scaling, model, tp, op, tokens) -> (FLOPs, ms) over the three forms
    for r in gemms:
        key = (r["dtype"], r["scaling"], r["model"], r["tp"], r["op"], r["tokens"])
        flops, ms = rate.get(key, (0.0, 0.0))
        ms = None if None in (ms, r["ms"]) else ms + r["ms"]
        rate[key] = (flops + 2 * r["M"] * r["N"] * r["K"], ms)

    def num(v):
        return "-" if v is None else f"{v:.0f}" if v >= 10 else f"{v:.2g}"

    def cell(*key):
        (fh, mh), (fl, ml) = (rate.get((*key, t), (0, None)) for t in (hi, lo))
        return f"{num(fh / mh / 1e9)} ({num(fl / ml / 1e9)})" if mh and ml else "-"

    pairs = [(m, t) for m in g["models"] for t in g["tps"] if (m, t) not in g["skip"]]
    for dtype, scaling in DTYPES:
        ops = [op for op in OPS if dtype == "bf16" or op != "lm_head"]
        lines += [f"\n### {dtype} {scaling or ''}\n", "| model | tp | " + " | ".join(ops) + " |"]
        lines += ["|---|---:|" + "---:|" * len(ops)]
        for m, t in pairs:
            cells = " | ".join(cell(dtype, scaling, m, t, op) for op in ops)
            lines.append(f"| {m} | {t} | {cells} |")
    backends = sorted({r["backend"] for r in atts})
    heads = [f"{b} {p}" for b in backends for p in PASSES]
    lines += [
        f"\nAttention, causal, TFLOP/s (the causal half counted), batch x seq = "
        f"{g['att_tokens']:,} tokens, k/v expanded to the heads (a backend's _gqa columns: "
        "k/v heads shared through sdpa's enable_gqa):\n",
        "| model | tp | heads / kv | head dim | seq | " + " | ".join(heads) + " |",
        "|---|---:|---:|---:|---:|" + "---:|" * (2 * len(backends)),
    ]
    att = {(r["model"], r["tp"], r["seq"], r["backend"], r["pass"]): r["tflops"] for r in atts}
    for (m, t), seq in itertools.product(pairs, g["seqs"]):
        h, _, nh, kvh = g["models"][m]
        vals = " | ".join(num(att.get((m, t, seq, b, p))) for b in backends for p in PASSES)
        lines.append(f"| {m} | {t} | {nh // t} / {max(kvh // t, 1)} | {h // nh} | {seq} | {vals} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
