"""What the machine is: read, not measured."""

from __future__ import annotations

import contextlib
import os
import platform
from pathlib import Path
from typing import Any

import torch

from paratrain.launch.torchrun import cores

# Dense memory bandwidth from the datasheets, GB/s (what device copies are measured against).
MEMORY_GBPS = {"H200": 4800.0, "H100 SXM": 3350.0, "H100 PCIe": 2000.0, "H100": 3350.0}
MEMORY_GBPS |= {"A100-SXM4-80GB": 2039.0, "A100": 1555.0, "L40S": 864.0, "RTX 4090": 1008.0}
# PCIe: GB/s per lane and direction by generation (after encoding).
PCIE_LANE_GBPS = {3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}


def numa_nodes() -> dict[int, list[int]]:
    """NUMA node -> its CPU ids, from sysfs (empty off Linux)."""
    root = Path("/sys/devices/system/node")
    out = {}
    for node in sorted(root.glob("node[0-9]*")):
        cpus = (node / "cpulist").read_text().strip() if (node / "cpulist").is_file() else ""
        out[int(node.name[4:])] = _cpulist(cpus)
    return out


def _cpulist(text: str) -> list[int]:
    cpus: list[int] = []
    for part in filter(None, text.split(",")):
        lo, _, hi = part.partition("-")
        cpus += list(range(int(lo), int(hi or lo) + 1))
    return cpus


def _gpu(index: int) -> dict[str, Any]:
    props = torch.cuda.get_device_properties(index)
    gpu: dict[str, Any] = {
        "index": index,
        "name": props.name,
        "memory_gib": props.total_memory / 2**30,
        "capability": f"{props.major}.{props.minor}",
        "memory_gbps_datasheet": next((v for k, v in MEMORY_GBPS.items() if k in props.name), None),
    }
    try:
        pynvml = torch.cuda.pynvml
        h = torch.cuda._get_pynvml_handler(torch.device("cuda", index))
        gpu["power_limit_w"] = pynvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0
        gpu["sm_clock_mhz_max"] = pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM)
        gpu["sm_clock_mhz_now"] = pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)
        gpu["persistence"] = bool(pynvml.nvmlDeviceGetPersistenceMode(h))
        gen = pynvml.nvmlDeviceGetCurrPcieLinkGeneration(h)
        width = pynvml.nvmlDeviceGetCurrPcieLinkWidth(h)
        gpu["pcie"] = {
            "generation": gen,
            "width": width,
            "max_generation": pynvml.nvmlDeviceGetMaxPcieLinkGeneration(h),
            "max_width": pynvml.nvmlDeviceGetMaxPcieLinkWidth(h),
        }
        gpu["pcie_gbps_nominal"] = PCIE_LANE_GBPS.get(gen, 0.0) * width or None
        bus = pynvml.nvmlDeviceGetPciInfo(h).busId
        bus = bus.decode() if isinstance(bus, bytes) else bus
        node = Path(f"/sys/bus/pci/devices/{bus.lower()[-12:]}/numa_node")
        if node.is_file():
            gpu["numa_node"] = int(node.read_text().strip())
        with contextlib.suppress(Exception):  # not every GPU reports ECC
            gpu["ecc_uncorrected"] = pynvml.nvmlDeviceGetTotalEccErrors(
                h, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC
            )
    except Exception:  # noqa: BLE001 - NVML missing: the facts torch gives are kept
        pass
    return gpu


def collect() -> dict[str, Any]:
    cuda = torch.cuda.is_available()
    facts: dict[str, Any] = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_cores": cores(),
        "cpu_count": os.cpu_count(),
        "numa_nodes": numa_nodes(),
        "cuda": torch.version.cuda if cuda else None,
        "gpus": [_gpu(i) for i in range(torch.cuda.device_count())] if cuda else [],
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(("NCCL_", "CUDA_"))},
    }
    if cuda:
        try:
            facts["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
            import pynvml

            pynvml.nvmlInit()
            facts["driver"] = pynvml.nvmlSystemGetDriverVersion()
        except Exception:  # noqa: BLE001
            pass
    return facts
