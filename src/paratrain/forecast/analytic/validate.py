"""`paratrain plan --validate SUITE`: published multi-GPU training rows beside the analytic
plan's prediction for each, with its error. Each source is one TOML file in suite/ (where it was
published, the system, the framework's settings as the source states them, the rows); each row
is priced on its system's hardware profile through the same function as `plan --layout`. One
parameter set per profile; nothing here is fitted to a row.

Suites: `published` (every file), `torchtitan-h100` (torchtitan's December 2024 H100 tables and
the rows measured here on lent H100s: the first suite, kept by name).
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import tomllib

from paratrain.errors import UserError
from paratrain.forecast import shapes
from paratrain.forecast.analytic import hardware
from paratrain.forecast.analytic.step import Cut, Training, parse_cut, predict

SUITE = Path(__file__).parent / "suite"
SUITES = {
    "published": ("torchtitan_2024_12", "torchtitan_2024_08", "ibm_fsdp_2024_03", "lent_h100"),
    "torchtitan-h100": ("torchtitan_2024_12", "lent_h100"),
}
TRAINING = {f.name for f in dataclasses.fields(Training)}
ROW = {"table", "label", "shape", "gpus", "layout", "hardware", "inter_gbps", "tps"}
ROW |= {"memory_gib", "memory_miss"}


@dataclass(frozen=True)
class Row:
    source: str  # the suite file's stem
    table: str
    label: str
    shape: str
    hardware: str  # a profile name
    layout: Cut
    training: Training
    tps: float  # published TPS/GPU
    memory_gib: float | None = None  # published, GiB (None: not published)
    memory_miss: str = ""  # why the memory is a known miss (left out of the bound)
    inter_gbps: float | None = None  # the source's network, GB/s a GPU (None: the profile's)


@cache
def source(stem: str) -> dict:
    """One suite file: its header (source, url, date, system, settings) and its rows."""
    data = tomllib.loads((SUITE / f"{stem}.toml").read_text())
    defaults = data.get("defaults", {})
    rows = []
    for raw in data["row"]:
        r = {**defaults, **raw}
        unknown = set(r) - ROW - TRAINING
        if unknown:  # a typo in a shipped file must not price a row wrongly in silence
            raise UserError(f"suite {stem}: row {r.get('label')!r}: unknown {sorted(unknown)}")
        gpus = int(r["gpus"])
        rows.append(
            Row(
                source=stem,
                table=str(r["table"]),
                label=str(r["label"]),
                shape=r["shape"],
                hardware=r.get("hardware", data["hardware"]),
                layout=parse_cut(r.get("layout", ""), gpus),
                training=Training(**{k: v for k, v in r.items() if k in TRAINING}),
                tps=float(r["tps"]),
                memory_gib=r.get("memory_gib"),
                memory_miss=r.get("memory_miss", ""),
                inter_gbps=r.get("inter_gbps"),
            )
        )
    head = {k: v for k, v in data.items() if k not in ("row", "defaults")}
    return {**head, "rows": tuple(rows)}


def rows(suite: str) -> list[Row]:
    return [r for stem in SUITES[suite] for r in source(stem)["rows"]]


def price(r: Row, profile: str | None = None) -> tuple[dict, hardware.Hardware]:
    """One row's prediction and the profile it was priced on: its own (or `profile`, a
    what-if), with the source's network where it names one."""
    hw = hardware.load(profile or r.hardware)
    if r.inter_gbps is not None:
        hw = dataclasses.replace(hw, inter_gbps=r.inter_gbps)
    return predict(shapes.shape(r.shape), hw, r.layout, r.training), hw


def run(suite: str = "torchtitan-h100", profile: str | None = None) -> dict:
    if suite not in SUITES:
        raise UserError(f"--validate: unknown {suite!r}; choose from {', '.join(SUITES)}")
    out = {"suite": suite, "sources": [], "rows": []}
    for stem in SUITES[suite]:
        head = source(stem)
        out["sources"].append({k: head[k] for k in ("source", "url", "date", "system", "settings")})
    for r in rows(suite):
        p, hw = price(r, profile)
        mem = r.memory_gib
        out["rows"].append(
            {
                "source": r.source,
                "table": r.table,
                "row": r.label,
                "model": r.shape,
                "hardware": profile or r.hardware,
                "gpu": hw.name.split("-")[0],
                "gpus": r.layout.gpus,
                "layout": p["layout"],
                "flags": flags(r, profile),
                "setup": _setup(r.training),
                "tps": r.tps,
                "predicted_tps": p["tps_per_gpu"],
                "tps_error": p["tps_per_gpu"] / r.tps - 1,
                "memory_gib": mem,
                "predicted_gib": p["memory_gib"],
                "memory_error": None if mem is None else p["memory_gib"] / mem - 1,
                "memory_miss": r.memory_miss,
                "terms": p["terms"],
                "step_s": p["step_s"],
            }
        )
    out["summary"] = summary(out["rows"])
    return out


def summary(found: list[dict]) -> dict:
    tps = [abs(r["tps_error"]) for r in found]
    mem = [abs(r["memory_error"]) for r in found if r["memory_error"] is not None]
    bounded = [
        abs(r["memory_error"])
        for r in found
        if r["memory_error"] is not None and not r["memory_miss"]
    ]
    return {
        "rows": len(found),
        "sources": len({r["source"] for r in found}),
        "gpu_kinds": sorted({r["gpu"] for r in found}),
        "median_tps_error": statistics.median(tps),
        "worst_tps_error": max(tps),
        "memory_rows": len(mem),
        "worst_memory_error": max(mem) if mem else None,
        "worst_memory_error_bounded": max(bounded) if bounded else None,
    }


def flags(r: Row, profile: str | None = None) -> str:
    """The `paratrain plan` flags that price this row (on its profile, or `profile`)."""
    t = r.training
    words = [
        f"--hardware {profile or r.hardware} --shape {r.shape} --gpus {r.layout.gpus}",
        f"--layout {r.layout.as_flag()} --ac {t.ac} --local-batch {t.local_batch}",
        *t.as_flags(),
    ]
    return " ".join(words)


def _setup(t: Training) -> str:
    parts = [f"batch {t.local_batch} x {t.seq_len}", f"AC {t.ac}"]
    parts.append("compile" if t.compile else "eager")
    if t.float8:
        parts.append("float8")
    if t.lora:
        parts.append("LoRA")
    return ", ".join(parts)


def table(found: dict, terms: bool = False) -> str:
    """The validation as Markdown: each row's published and predicted TPS/GPU and memory, then
    its sources."""
    lines = [
        f"Suite `{found['suite']}`: published rows beside `paratrain plan`, each on its "
        "system's hardware profile, one parameter set a profile.",
        "",
        "| source: table | model, GPUs | layout, set-up | profile | TPS/GPU | predicted | error "
        "| memory GiB | predicted | error |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in found["rows"]:
        mem = "-" if r["memory_gib"] is None else f"{r['memory_gib']:.1f}"
        err = "-" if r["memory_error"] is None else f"{r['memory_error']:+.1%}"
        err += " (known miss)" if r["memory_miss"] else ""
        lines.append(
            f"| {r['source']}: {r['table']} | {r['model']}, {r['gpus']} | {r['row']}; "
            f"{r['setup']} | {r['hardware']} | {r['tps']:,.0f} | {r['predicted_tps']:,.0f} | "
            f"{r['tps_error']:+.1%} | {mem} | {r['predicted_gib']:.1f} | {err} |"
        )
    s = found["summary"]
    worst_mem = s["worst_memory_error_bounded"]
    lines += [
        "",
        f"{s['rows']} rows from {s['sources']} sources on {', '.join(s['gpu_kinds'])}: median "
        f"TPS/GPU error {s['median_tps_error']:.1%}, worst {s['worst_tps_error']:.1%}; memory "
        f"on the {s['memory_rows']} rows that publish it: worst "
        + ("-" if worst_mem is None else f"{worst_mem:.1%}")
        + " but for the known misses.",
        "",
        "Sources:",
    ]
    for src in found["sources"]:
        system = " ".join(src["system"].split())
        lines.append(f"- {src['source']} ({src['date']}), {src['url']}: {system}.")
    if terms:
        lines += [
            "",
            "Each row as the `paratrain plan` flags that price it (rows with LoRA, fused",
            "AdamW, a bf16 all-gather under float8 or a source's own network have none of",
            "their own for those: the suite prices them through the same function):",
            "",
        ]
        lines += [f"- {r['source']}: {r['row']}: `{r['flags']}`" for r in found["rows"]]
        lines += ["", "Seconds a step by term:", ""]
        keys = list(found["rows"][0]["terms"])
        lines.append("| row | step | " + " | ".join(k.removesuffix("_s") for k in keys) + " |")
        lines.append("|---|---:|" + "---:|" * len(keys))
        for r in found["rows"]:
            cells = " | ".join(f"{r['terms'][k]:.3f}" for k in keys)
            lines.append(f"| {r['source']}: {r['row']} | {r['step_s']:.3f} | {cells} |")
    return "\n".join(lines)
