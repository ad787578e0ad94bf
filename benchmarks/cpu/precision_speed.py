"""How much slower fp16 and bf16 train than fp32 on this CPU: one training step (forward,
backward, AdamW) of paratrain's own models under paratrain's precision policy (autocast to the
half type; fp16 with its GradScaler), timed per precision.

The plan's note on a CPU run in fp16 or bf16 (src/paratrain/runplan/cpu.py) cites the factors
this writes: the median step in each precision over fp32's, per kind of model.

Cases: MobileNetV2 at 64x64 (recipes/mnist_sample_mobilenetv2.yaml at that size, batch 64), the
tiny CNN at MNIST's 28x28 (recipes/tiny_cpu.yaml, batch 32), the tiny random Llama at 128
tokens (recipes/tiny_llama_python_docs_cpu.yaml, batch 8). The precisions take turns within each
round (fp32, fp16, bf16, then again), so that a slower minute of a shared machine falls on all
of them; the first step of each model and precision is left out (oneDNN's first call).

Each step is timed twice: wall-clock, and the CPU time of this process (time.process_time).
With one thread the CPU time is the work the step takes whatever else runs on the machine, so
the factors are taken from it: on a shared 2-core machine the wall-clock steps of fp32
MobileNetV2 varied 6x (0.57-3.47 s) while other people's jobs came and went, their CPU time
within 0.53-0.81 s. One thread is
what each of a CPU run's processes gets on a 2-core machine (paratrain starts two).

    PYTHONPATH=src python3 benchmarks/cpu/precision_speed.py --threads 1 --rounds 3 --steps 2
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from paratrain.config.model import ModelConfig
from paratrain.config.train import ScalerConfig
from paratrain.models import build_model
from paratrain.trainer.precision import build_policy, build_scaler

PRECISIONS = ("fp32", "fp16", "bf16")
OUT = Path(__file__).resolve().parents[1] / "results" / "2026-12-07-cpu" / "precision_speed"


def image_case(name: str, side: int, batch: int):
    def make():
        torch.manual_seed(0)
        model = build_model(ModelConfig(name=name), 10, 1)
        x = torch.randn(batch, 1, side, side)
        y = torch.randint(0, 10, (batch,))
        return model, lambda m: F.cross_entropy(m(x), y)

    return make


def lm_case(shape: str, tokens: int, batch: int):
    def make():
        from paratrain.models.causal_lm.build import build_causal_lm

        torch.manual_seed(0)
        model = build_causal_lm(None, "random", shape, "sdpa", torch.float32, "cpu")
        model.config.use_cache = False
        ids = torch.randint(0, model.config.vocab_size, (batch, tokens))
        return model, lambda m: m(input_ids=ids, labels=ids).loss

    return make


CASES = {
    "image: mobilenet_v2 64x64 batch 64": ("image", image_case("mobilenet_v2", 64, 64)),
    "image: tiny_cnn 28x28 batch 32": ("image", image_case("tiny_cnn", 28, 32)),
    "language: llama tiny 128 tokens batch 8": ("language", lm_case("tiny", 128, 8)),
}


def step_seconds(model, loss_of, precision: str, opt, steps: int) -> list[tuple[float, float]]:
    """-> (wall-clock s, this process's CPU s) of each step."""
    cpu = torch.device("cpu")
    policy = build_policy(precision, cpu)
    scaler = build_scaler(precision, ScalerConfig(), cpu)
    out = []
    for _ in range(steps):
        start, start_cpu = time.perf_counter(), time.process_time()
        with policy.autocast():
            loss = loss_of(model)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
        opt.zero_grad(set_to_none=True)
        out.append((time.perf_counter() - start, time.process_time() - start_cpu))
    return out


def measure(make, rounds: int, steps: int) -> dict[str, list[tuple[float, float]]]:
    model, loss_of = make()
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    times: dict[str, list[tuple[float, float]]] = {p: [] for p in PRECISIONS}
    for p in PRECISIONS:  # each precision's first step: oneDNN's primitives made, not timed
        step_seconds(model, loss_of, p, opt, 1)
    for _ in range(rounds):
        for p in PRECISIONS:
            times[p] += step_seconds(model, loss_of, p, opt, steps)
    return times


def facts(threads: int) -> dict:
    root = Path(__file__).resolve().parents[2]
    commit = subprocess.run(
        ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        flags = next(
            line for line in Path("/proc/cpuinfo").read_text().splitlines() if "flags" in line
        )
        isa = [f for f in ("avx512_bf16", "avx512_fp16", "amx_bf16", "amx_fp16") if f in flags]
    except (OSError, StopIteration):
        isa = []
    import transformers

    return {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "commit": commit,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "cpu": cpu,
        "cpu_flags": isa,
        "threads": threads,
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--only", default="", help="cases whose name holds this text")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    result = {**facts(args.threads), "cases": {}}
    for name, (kind, make) in CASES.items():
        if args.only not in name:
            continue
        times = measure(make, args.rounds, args.steps)
        wall = {p: statistics.median(w for w, _ in t) for p, t in times.items()}
        used = {p: statistics.median(c for _, c in t) for p, t in times.items()}
        result["cases"][name] = {
            "kind": kind,
            "median_cpu_s": used,
            "median_wall_s": wall,
            "steps_wall_s": {p: [w for w, _ in t] for p, t in times.items()},
            "steps_cpu_s": {p: [c for _, c in t] for p, t in times.items()},
            "slower_than_fp32": {p: used[p] / used["fp32"] for p in PRECISIONS},
            "slower_than_fp32_wall": {p: wall[p] / wall["fp32"] for p in PRECISIONS},
        }
        print(name, {p: f"cpu {used[p]:.3f}s x{used[p] / used['fp32']:.1f}" for p in used})
        sys.stdout.flush()
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"threads{args.threads}{('_' + args.only) if args.only else ''}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"written {path}")


if __name__ == "__main__":
    main()
