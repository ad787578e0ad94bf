"""From doctor's facts and measurements to advice lines: pure functions of recorded numbers
(unit-tested on recorded ones), each tied to the seed's checklist."""

from __future__ import annotations

import statistics
from typing import Any

PINNED_MATTERS = 1.3  # pinned / pageable host->device above this: pin_memory pays here
LINK_SHORT = 0.5  # pinned copies below this share of the link's nominal rate: a link problem
SLOW_GPU = 0.85  # a GPU's matmul below this share of the others' median: that GPU is slow
LOW_PEAK = 0.6  # a large bf16 matmul below this share of the datasheet: clocks / power
LOADER_HEADROOM = 1.2  # the loader alone must beat the steps by this much not to be the limit
BUSY = 90.0  # the seed's checklist: GPU utilisation above 90% during training


def _rows(found: dict, kind: str) -> list[dict]:
    return [r for r in found["measured"]["rows"] if r.get("kind") == kind and r["value"]]


def pin_memory(found: dict) -> list[str]:
    out = []
    by_gpu: dict[int, dict[str, float]] = {}
    for r in found["measured"]["rows"]:
        if r.get("kind", "").startswith("host->device") and r["value"]:
            by_gpu.setdefault(r["gpu"], {})[r["kind"].split()[-1]] = r["value"]
    for gpu, rates in sorted(by_gpu.items()):
        if {"pinned", "pageable"} <= set(rates):
            ratio = rates["pinned"] / rates["pageable"]
            if ratio >= PINNED_MATTERS:
                out.append(
                    f"pin_memory gives {ratio:.1f}x host->device on GPU {gpu} here "
                    f"({rates['pinned']:.1f} vs {rates['pageable']:.1f} GB/s): keep "
                    "data.pin_memory=true (seed §4.1)"
                )
            else:
                out.append(
                    f"pin_memory gives only {ratio:.2f}x host->device on GPU {gpu} here: it "
                    "matters little on this machine"
                )
    return out


def links(found: dict) -> list[str]:
    out = []
    for gpu in found["facts"]["gpus"]:
        link = gpu.get("pcie") or {}
        if link and (
            link["generation"] < link["max_generation"] or link["width"] < link["max_width"]
        ):
            out.append(
                f"GPU {gpu['index']}'s PCIe link runs gen {link['generation']} x{link['width']} "
                f"of gen {link['max_generation']} x{link['max_width']} (an idle GPU may step its "
                "link down; if it stays so under load, check the slot)"
            )
        for r in _rows(found, "host->device pinned"):
            if (
                r["gpu"] == gpu["index"]
                and r.get("expected")
                and r["value"] < LINK_SHORT * r["expected"]
            ):
                out.append(
                    f"GPU {gpu['index']}'s pinned host->device copies reach {r['value']:.1f} GB/s, "
                    f"{r['value'] / r['expected']:.0%} of the link's nominal {r['expected']:.1f}"
                )
    return out


def gpus(found: dict) -> list[str]:
    out = []
    mm = {r["gpu"]: r for r in _rows(found, "matmul") if r.get("gpu") is not None}
    for i, r in sorted(mm.items()):
        others = [o["value"] for j, o in mm.items() if j != i]
        if others and r["value"] < SLOW_GPU * statistics.median(others):
            out.append(
                f"GPU {i} is slow: {r['value']:.0f} TFLOP/s in a large matmul, "
                f"{r['value'] / statistics.median(others):.0%} of the other GPUs' median; check "
                "its clocks, power and temperature (nvidia-smi -q -d CLOCK,POWER,TEMPERATURE)"
            )
        elif r.get("expected") and r["value"] < LOW_PEAK * r["expected"]:
            out.append(
                f"GPU {i} reaches {r['value'] / r['expected']:.0%} of its datasheet bf16 peak "
                f"in a large matmul ({r['value']:.0f} of {r['expected']:.0f} TFLOP/s): clocks "
                "held low, or a power limit below the default?"
            )
    for gpu in found["facts"]["gpus"]:
        if gpu.get("ecc_uncorrected"):
            out.append(
                f"GPU {gpu['index']} reports {gpu['ecc_uncorrected']} uncorrected ECC errors "
                "since the driver loaded: keep it out of long runs until it is checked"
            )
        if gpu.get("persistence") is False:
            out.append(
                f"GPU {gpu['index']} has persistence mode off: every run's first CUDA call "
                "waits for the driver to initialise it (nvidia-smi -pm 1)"
            )
    return out


def peers(found: dict) -> list[str]:
    """GPU pairs: one far slower than the others (a PCIe hop where the rest have NVLink, a link
    down), or no peer access at all (copies and NCCL go through the host)."""
    pairs = _rows(found, "p2p")
    out = []
    for i, r in enumerate(pairs):
        others = [o["value"] for j, o in enumerate(pairs) if j != i]
        if r.get("peer_access") is False:
            out.append(
                f"GPU {r['gpu']} -> GPU {r['peer']}: no peer access, copies go through the host "
                f"({r['value']:.1f} GB/s); keep tensor / pipeline groups off this pair"
            )
        elif others and r["value"] < SLOW_GPU * statistics.median(others):
            out.append(
                f"GPU {r['gpu']} -> GPU {r['peer']} copies at {r['value']:.1f} GB/s, "
                f"{r['value'] / statistics.median(others):.0%} of the other pairs' median: a "
                "slower path between these two (nvidia-smi topo -m)"
            )
    return out


def numa(found: dict) -> list[str]:
    nodes = found["facts"]["numa_nodes"]
    placed = [g for g in found["facts"]["gpus"] if g.get("numa_node", -1) >= 0]
    if len(nodes) < 2 or not placed:
        return []
    out = []
    for g in placed:
        node = g["numa_node"]
        out.append(
            f"GPU {g['index']} sits on NUMA node {node}: bind its rank there "
            f"(launch.numa_affinity=node, torchrun's own binding; or numactl "
            f"--cpunodebind={node} --membind={node}); host-side copies and the loader's "
            "workers then stay on its socket"
        )
    return out


def loader(found: dict) -> list[str]:
    lo, st = _rows(found, "loader"), _rows(found, "step")
    if not (lo and st):
        return []
    l_rate, s_rate, workers = lo[0]["value"], st[0]["value"], lo[0].get("workers")
    cores = found["facts"]["cpu_cores"]
    if l_rate < LOADER_HEADROOM * s_rate:
        more = (
            f"raise data.num_workers (now {workers}; {cores} cores)"
            if workers is not None and workers < cores
            else "the workers already use every core"
        )
        gpu = (
            " or move the resize to the GPU (data.resize_on=gpu)"
            if lo[0].get("resize_on") == "cpu" and found["facts"]["gpus"]
            else ""
        )
        return [
            f"the loader delivers {l_rate:,.0f} samples/s for a {s_rate:,.0f} samples/s step: "
            f"the loader is the bottleneck (seed's checklist); {more}{gpu}"
        ]
    return [
        f"the loader delivers {l_rate:,.0f} samples/s, {l_rate / s_rate:.1f}x what the steps "
        "use: not the bottleneck"
    ]


def utilisation(found: dict) -> list[str]:
    """NVML's utilisation over the recipe's measured steps: the share of time a kernel ran."""
    st = _rows(found, "step")
    busy = st[0].get("utilization_pct") if st else None
    if busy is None:
        return []
    if busy < BUSY:
        return [
            f"the GPU was busy {busy:.0f}% of the recipe's steps (seed's checklist: > {BUSY:.0f}%)"
            ": the step waits on the host (the loader, Python, synchronisations); `paratrain run "
            "--profile` breaks a step into its phases"
        ]
    return [
        f"the GPU was busy {busy:.0f}% of the recipe's steps: above the checklist's {BUSY:.0f}%"
    ]


def cpu_only(found: dict) -> list[str]:
    if found["facts"]["gpus"]:
        return []
    cores = found["facts"]["cpu_cores"]
    return [
        f"no GPU: several processes train over gloo on the CPU and share its {cores} cores "
        f"(each gets {cores} / processes threads: launch.cpu_threads), so N processes cannot "
        "run N times one's speed here"
    ]


RULES = (pin_memory, links, gpus, peers, numa, loader, utilisation, cpu_only)


def lines(found: dict[str, Any]) -> list[str]:
    return [line for rule in RULES for line in rule(found)]
