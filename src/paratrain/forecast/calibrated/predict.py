"""From calibrations and links to the plan's rows and its advice: pure functions over the
formulas of forecast/calibrated/model.py (tested on recorded numbers)."""

from __future__ import annotations

from collections.abc import Callable

from paratrain.bench import arith
from paratrain.forecast.calibrated.model import (
    Calibration,
    Links,
    hsdp_step,
    memory_per_gpu,
    model_parallel,
    step_time,
)
from paratrain.tasks import get_task

# each planned strategy -> the `paratrain run` settings that measure it
RUNS = {
    "ddp": ["strategy=ddp-ds"],
    "fsdp": ["strategy=fsdp"],
    "hsdp": ["strategy=fsdp"],  # parallel.dp_replicate: the nodes, set per scale
    "local_sgd": ["strategy=ddp-ds", "sync.mode=local_sgd"],
    "tp": ["strategy=tp"],
    "pp": ["strategy=pipeline"],
}


def strategies_for(task: str, blocks: int, every: int) -> list[str]:
    """The strategies a plan covers for this task: the data-parallel ones always; tensor and
    pipeline parallel where the model family has them (the causal LM's spec; a vision model's
    chain of blocks is cut for a pipeline too)."""
    out = ["ddp", "fsdp", "hsdp", "local_sgd"]
    layouts = get_task(task).layouts
    if "tp" in layouts:
        out.append("tp")
    if "pp" in layouts and blocks > 1:
        out.append("pp")
    return out


def row(
    strategy: str,
    cal: Calibration,
    n: int,
    links: Links,
    *,
    samples_per_step: int,
    memory_limit: float | None,
    every: int,
    pp_micro: int,
    per_node: int,
) -> dict | None:
    """One strategy at N devices -> step time, throughput (the DP family: N replicas of the
    per-device batch; TP and PP: one replica over N), communication, memory, fit; None where it
    does not apply (HSDP within one node, TP across nodes, PP beyond the model's blocks)."""
    if strategy == "hsdp":
        if n <= per_node or n % per_node:
            return None
        t = hsdp_step(cal, n, links)
        memory = t.pop("memory_bytes")
        samples = samples_per_step * n
    elif strategy in ("tp", "pp"):
        if n < 2 or (strategy == "tp" and n > per_node):
            return None
        t = model_parallel(strategy, cal, n, links.bus(n), m=pp_micro)
        memory = t.pop("memory_bytes")
        samples = samples_per_step
    else:
        if strategy == "local_sgd" and n < 2:
            return None
        t = step_time(strategy, cal, n, links.bus(n), every=every)
        memory = memory_per_gpu("fsdp" if strategy == "fsdp" else "ddp", cal, n)
        samples = samples_per_step * n
    return {
        "strategy": strategy if strategy != "local_sgd" else f"local_sgd/{every}",
        "plan_strategy": strategy,
        "gpus": n,
        **t,
        "exposed_share": t["exposed_s"] / t["step_s"] if t["step_s"] else 0.0,
        "samples_per_s": samples / t["step_s"],
        "memory_bytes": memory,
        "fits": memory_limit is None or memory <= memory_limit,
        "memory_limit": memory_limit,
        "bus_gbps": links.bus(n) if n > 1 else None,
    }


def divides(strategy: str, n: int, limits: dict | None) -> bool:
    """Whether the model can be cut N ways: tensor parallel over heads that N divides (and
    key-value heads), a pipeline of at most one stage per block."""
    limits = limits or {}
    if strategy == "tp":
        return all(
            not h or h % n == 0 for h in (limits.get("attention_heads"), limits.get("kv_heads"))
        )
    if strategy == "pp":
        blocks = limits.get("layers") or limits.get("blocks") or 0
        return n <= blocks
    return True


def plan_rows(
    cal_at: Callable[[int, str], Calibration],
    gpus: list[int],
    links: Links,
    strategies: list[str],
    *,
    samples_per_step: int,
    memory_limit: Callable[[int], float | None],
    every: int = 16,
    pp_micro: int = 4,
    limits: dict | None = None,
) -> list[dict]:
    """Every strategy at every scale; scaling efficiency against the fastest one-device step
    calibrated (FSDP's on one GPU can beat the plain step: it then sets the bar)."""
    wrappers = {"fsdp" if s in ("fsdp", "hsdp") else "ddp" for s in strategies} | {"ddp"}
    single = max(samples_per_step / cal_at(1, w).compute_s for w in sorted(wrappers))
    rows = []
    for strategy in strategies:
        for n in gpus:
            if n > 1 and not divides(strategy, n, limits):
                continue
            r = row(
                strategy,
                cal_at(n, strategy),
                n,
                links,
                samples_per_step=samples_per_step,
                memory_limit=memory_limit(n),
                every=every,
                pp_micro=pp_micro,
                per_node=links.per_node,
            )
            if r is not None:
                r["scaling_efficiency"] = r["samples_per_s"] / (n * single)
                rows.append(r)
    return rows


def advice(rows: list[dict], links: Links, unit: str = "GPU") -> list[str]:
    """Where a strategy stops fitting, where communication starts to dominate, which is
    fastest at each scale; `unit`: what a scale counts ("GPU", or "process" on the CPU)."""
    lines = []
    by = {}
    for r in rows:
        by.setdefault(r["strategy"], []).append(r)
    for name, rs in by.items():
        rs.sort(key=lambda r: r["gpus"])
        misfit = [r for r in rs if not r["fits"]]
        if misfit:
            first = misfit[0]
            lines.append(
                f"{name} does not fit at {count(first['gpus'], unit)}: "
                f"{first['memory_bytes'] / 2**30:,.1f} GiB per {unit} of "
                f"{first['memory_limit'] / 2**30:,.1f}"
            )
        heavy = [r for r in rs if r["exposed_share"] >= 0.2]
        if heavy and name == "ddp":
            lines.append(exposed_ddp(heavy[0], rows, links, unit))
    for n in sorted({r["gpus"] for r in rows}):
        # local SGD learns differently: the fastest of the exact strategies
        fitting = [
            r for r in rows if r["gpus"] == n and r["fits"] and r["plan_strategy"] != "local_sgd"
        ]
        if fitting:
            best = max(fitting, key=lambda r: r["samples_per_s"])
            eff = best["scaling_efficiency"]
            lines.append(
                f"fastest at {count(n, unit)}: {best['strategy']} "
                f"({best['samples_per_s']:,.1f} samples/s, {eff:.0%} of linear)"
                + arith.suspect(eff * n, n)
            )
    return lines


def exposed_ddp(r: dict, rows: list[dict], links: Links, unit: str) -> str:
    """The sentence for DDP's first scale whose exposed communication is a fifth of its step or
    more: the share, the link it crosses, and what the strategies that hide more expose there
    (their rows at the same scale), or which would."""
    n = r["gpus"]
    line = (
        f"At {count(n, unit)} DDP spends {r['exposed_share']:.0%} of its step waiting for "
        f"communication (its all-reduce at {bandwidth(r['bus_gbps'])}"
        + (" across nodes" if n > links.per_node else "")
        + ")"
    )
    hiding = ("hsdp", "local_sgd") if n > links.per_node else ("fsdp", "local_sgd")
    there = [x for x in rows if x["gpus"] == n and x["plan_strategy"] in hiding]
    if there:
        first, *rest = there
        others = f"{first['strategy']} waits {first['exposed_share']:.0%} of its step" + "".join(
            f" and {x['strategy']} {x['exposed_share']:.0%}" for x in rest
        )
        return f"{line}; at that scale {others}."
    names = " or ".join(
        {"hsdp": "HSDP", "fsdp": "FSDP", "local_sgd": "local SGD"}[h] for h in hiding
    )
    return f"{line}; {names} would hide more of it."


def bandwidth(gbps: float | None) -> str:
    """A link's rate with 3 significant digits, in GB/s from 1 GB/s up, else in MB/s."""
    if gbps is None:
        return "an unmeasured rate"
    value, unit = (gbps, "GB/s") if gbps >= 1 else (gbps * 1000, "MB/s")
    if value >= 1000:
        return f"{value:,.0f} {unit}"
    return f"{value:#.3g}".rstrip(".") + f" {unit}"


def count(n: int, unit: str = "GPU") -> str:
    """'1 GPU', '8 GPUs', '4 processes'."""
    return f"1 {unit}" if n == 1 else f"{n} {plural(unit)}"


def plural(unit: str) -> str:
    return f"{unit}es" if unit.endswith("s") else f"{unit}s"
