"""Where a profiled step's GPU sits idle: reads a run's torch.profiler trace (train.profile_steps
writes trace.json.gz in the run folder) and prints the GPU's busy and idle time (kernels, copies
and fills on every stream merged), the idle time by what the host was doing when each gap
began (the innermost profiler range open on a host thread then: paratrain's phases, an
operator, a CUDA graph launch), and the longest gaps with the GPU work either side of them.

    python benchmarks/device/trace_gaps.py RUN/trace.json.gz [--steps 3] [--min-us 5]
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import json
from collections import defaultdict

GPU = {"kernel", "gpu_memcpy", "gpu_memset"}
HOST = {"cpu_op", "user_annotation", "cuda_runtime", "cuda_driver", "python_function"}


def load(path: str) -> list[dict]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]


def gaps(gpu: list[dict], min_us: float) -> tuple[float, float, list[tuple]]:
    """-> (span us, busy us, [(start, length, event before, event after)]) over all streams."""
    gpu = sorted(gpu, key=lambda e: e["ts"])
    start, busy, out = gpu[0]["ts"], 0.0, []
    end, last = gpu[0]["ts"], gpu[0]
    for e in gpu:
        if e["ts"] > end:
            if e["ts"] - end >= min_us:
                out.append((end, e["ts"] - end, last["name"], e["name"]))
        else:
            busy -= min(end, e["ts"] + e["dur"]) - e["ts"]  # the overlap, counted once
        busy += e["dur"]
        if e["ts"] + e["dur"] >= end:
            end, last = e["ts"] + e["dur"], e
    return end - start, busy, out


def host_at(host: list[dict], starts: list[float], t: float) -> str:
    """The innermost host range open at time t (the shortest one containing it)."""
    best = None
    for e in host[max(0, bisect.bisect_right(starts, t) - 4000) : bisect.bisect_right(starts, t)]:
        if e["ts"] <= t <= e["ts"] + e["dur"] and (best is None or e["dur"] < best["dur"]):
            best = e
    return best["name"] if best else "(no host range)"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--min-us", type=float, default=5.0)
    args = ap.parse_args()
    events = load(args.trace)
    gpu = [e for e in events if e.get("cat") in GPU]
    if not gpu:
        print("no GPU events in this trace")
        return
    host = sorted((e for e in events if e.get("cat") in HOST), key=lambda e: e["ts"])
    starts = [e["ts"] for e in host]
    span, busy, found = gaps(gpu, args.min_us)
    per = 1000.0 * args.steps
    print(
        f"GPU span {span / per:.2f} ms a step: busy {busy / per:.2f}, idle {(span - busy) / per:.2f}"
    )
    print(
        f"gaps of {args.min_us:g} us or more: {len(found) / args.steps:.0f} a step, "
        f"{sum(g[1] for g in found) / per:.2f} ms a step"
    )
    by_host: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for t, length, _, _ in found:
        entry = by_host[host_at(host, starts, t)[:70]]
        entry[0] += length
        entry[1] += 1
    print("idle by what the host was doing as the gap began (ms a step, gaps a step):")
    for name, (total, n) in sorted(by_host.items(), key=lambda kv: -kv[1][0])[:12]:
        print(f"  {total / per:7.3f}  {n / args.steps:5.0f}  {name}")
    print("longest gaps (us, GPU work before -> after):")
    for t, length, before, after in sorted(found, key=lambda g: -g[1])[:10]:
        print(
            f"  {length:8.1f}  {before[:45]} -> {after[:45]}  (host: {host_at(host, starts, t)[:40]})"
        )


if __name__ == "__main__":
    main()
