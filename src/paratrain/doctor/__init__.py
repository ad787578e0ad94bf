"""`paratrain doctor`: the machine measured against what it should do, turned into advice tied to
the seed's checklist (seed 000 §6-§8: data loading not the bottleneck, pinned memory, NUMA
binding, GPU clocks and power).

    facts.py     versions, devices, NVML (clocks, power limit, ECC, persistence, PCIe link),
                 CPU cores, NUMA nodes and the GPUs' nodes, the NCCL_* / CUDA_* variables
    measure.py   what is timed: host <-> device copies pinned and pageable, device memory
                 bandwidth, matmul TFLOP/s, the disk's read rate, and with --recipe the loader
                 alone against a few training steps of the recipe
    advice.py    pure rules from those numbers to advice lines (unit-tested on recorded ones)

The command checks the install itself first (paratrain/install.py: torch, torchvision, triton
and the CUDA libraries against each other; one line per problem with the pip command that
mends it). Writes doctor.json and prints one table of measurements against their expected values, then
the advice.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def run(
    recipe: str | None,
    out: Path,
    data_path: str | None = None,
    quick: bool = False,
    install: list[str] | None = None,
) -> dict:
    """`install`: the install's problems (paratrain/install.py), kept in doctor.json."""
    from paratrain.doctor import advice, facts, measure

    found: dict[str, Any] = {"install": install or [], "facts": facts.collect()}
    found["measured"] = measure.all_of(found["facts"], recipe, data_path, quick)
    found["advice"] = advice.lines(found)
    out.mkdir(parents=True, exist_ok=True)
    (out / "doctor.json").write_text(json.dumps(found, indent=1, default=str) + "\n")
    return found


def print_report(found: dict) -> None:
    from rich.table import Table

    from paratrain.meters.metrics import console as wide_console

    console = wide_console()  # in a log file or a pipe, each bullet and the table whole
    f = found["facts"]
    console.print(
        f"[bold]paratrain doctor[/]: torch {f['torch']}, {f['cpu_cores']} CPU cores, "
        f"{len(f['numa_nodes'])} NUMA node(s), "
        + (
            ", ".join(
                f"GPU {g['index']} {g['name']} (NUMA {g.get('numa_node')})" for g in f["gpus"]
            )
            or "no GPU"
        )
    )
    table = Table(show_lines=False)
    for col in ("measurement", "value", "expected", "ratio"):
        table.add_column(col, justify="left" if col == "measurement" else "right")
    for row in found["measured"]["rows"]:
        value = row.get("value")
        shown = "skipped" if value is None else f"{value:,.1f} {row['unit']}"
        expected = row.get("expected")
        ratio = f"{value / expected:.0%}" if value is not None and expected else ""
        table.add_row(
            row["name"] + (f" ({row['note']})" if row.get("note") else ""),
            shown,
            f"{expected:,.1f} {row['unit']}" if expected else "",
            ratio,
        )
    console.print(table)
    for line in found["advice"]:
        console.print(f"- {line}")
