"""`paratrain plan --validate torchtitan-h100`: torchtitan's published Llama 3.1 H100
tables beside the analytic plan's prediction for each row, with its error. One hardware profile
and one set of its parameters for every row; nothing here is fitted to a row.

The published rows: torchtitan's benchmarks/llama3_h100_202412_torchtitan.md (commit 9dec370,
2024-12-26): H100 SXM with 96 GB HBM2e at 500 W, 8 a host on NVLink, 400 Gb/s RDMA a GPU; Llama
3.1 at sequence length 8192 (its train configs); TPS/GPU read at step 90, memory the maximum
reserved over all GPUs. Settings per table as the doc and torchtitan's configs of that commit
give them: FSDP2 with bf16 parameters and fp32 reductions; selective AC is the "op" policy;
float8 is torchao's dynamic tensorwise on the decoder's linears (not the output layer), its
FSDP all-gather in float8 (the 405B config's setting and the launch command of torchtitan's
docs/float8.md for the 8B; TP's all-gathers are float8 by default); a pipeline splits the batch into as many
micro-batches as stages (torchtitan's default), 2 stages a rank when interleaved; FSDP under a
pipeline keeps the stage's layers gathered (no reshard after forward).

Also, for the base rate at 700 W: 1-GPU rows measured on a lent H100 SXM 80 GB (benchmarks/results/2026-12-06-h100x1/issue53/, calls
1 and 2): torchtitan 0.2.2 compiled on the Llama-3.2-1B shape (8 x 2,048, no AC), bf16 and
float8, and paratrain's own recipes as shipped (the 1B's full training; the 8B's LoRA, 2 x 2,048).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from paratrain.forecast import shapes
from paratrain.forecast.analytic import hardware
from paratrain.forecast.analytic.step import Cut, Training, predict

SUITES = ("torchtitan-h100",)
SOURCE = "torchtitan benchmarks/llama3_h100_202412_torchtitan.md (commit 9dec370)"


@dataclass(frozen=True)
class Row:
    table: str
    label: str
    shape: str
    layout: Cut
    training: Training
    tps: float  # published TPS/GPU
    memory_gib: float  # published, GiB


def _fsdp8b(n: int, table: str) -> list[Row]:
    base = dict(seq_len=8192, local_batch=2, ac="selective")
    return [
        Row(table, label, "llama3.1-8b", Cut(n), Training(**base, compile=c, float8=f), tps, mem)
        for label, c, f, tps, mem in (
            ("FSDP", False, False, *_T[table][0]),
            ("FSDP + compile", True, False, *_T[table][1]),
            ("FSDP + compile + float8", True, True, *_T[table][2]),
        )
    ]


_T = {
    "1": ((5762, 82.4), (6667, 77.0), (8532, 76.8)),
    "3": ((5605, 67.0), (6514, 62.0), (8380, 61.8)),
}


def torchtitan_rows() -> list[Row]:
    full70 = Training(8192, 16, "full", compile=True, float8=True)
    full405 = Training(8192, 32, "full", compile=True, float8=True)
    return [
        *_fsdp8b(8, "1"),
        *_fsdp8b(128, "3"),
        Row("4", "FSDP 32 x TP 8", "llama3.1-70b", Cut(256, tp=8), full70, 829, 71.9),
        Row(
            "4",
            "FSDP 32 x async TP 8",
            "llama3.1-70b",
            Cut(256, tp=8, async_tp=True),
            full70,
            876,
            67.6,
        ),
        Row(
            "5",
            "FSDP 8 x TP 8 x PP 8, 1F1B",
            "llama3.1-405b",
            Cut(512, tp=8, pp=8, async_tp=True),
            full405,
            100,
            82.5,
        ),
        Row(
            "5",
            "FSDP 8 x TP 8 x PP 8, interleaved 1F1B",
            "llama3.1-405b",
            Cut(512, tp=8, pp=8, async_tp=True, schedule="interleaved", stages_per_rank=2),
            full405,
            128,
            72.7,
        ),
    ]


def lent_rows() -> list[Row]:
    """torchtitan 0.2.2 on one lent H100 SXM 80 GB (700 W), benchmarks/results/2026-12-06-h100x1/issue53/ call 2."""
    one = dict(seq_len=2048, local_batch=8, ac="none", compile=True)
    titan = dict(one, loss="compiled")  # torchtitan 0.2.2 compiles its loss too
    return [
        Row("H100", "1 GPU, compile", "llama3.2-1b", Cut(1), Training(**titan), 61847, 50.7),
        Row(
            "H100",
            "1 GPU, compile + float8",
            "llama3.2-1b",
            Cut(1),
            Training(**titan, float8=True, fp8_all_gather=False),
            70521,
            43.0,
        ),
        # paratrain's own recipes as shipped on the same GPU (benchmarks/results/2026-12-06-h100x1/issue53/)
        Row(
            "H100",
            "paratrain 1B full (Triton loss, fused AdamW)",
            "llama3.2-1b",
            Cut(1),
            Training(**one, loss="fused", fused_optimizer=True),
            69476,
            39.4,
        ),
        Row(
            "H100",
            "paratrain 8B LoRA (q, v, o; r 8)",
            "llama3-8b",
            Cut(1),
            Training(2048, 2, "none", compile=True, lora=True),
            17421,
            29.6,
        ),
    ]


def run(suite: str = "torchtitan-h100", profile: str = "h100-hbm2e-500w") -> dict:
    hw = hardware.load(profile)
    out = {"suite": suite, "source": SOURCE, "hardware": hw.name, "rows": [], "lent": []}
    for key, rows, where in (("rows", torchtitan_rows(), hw), ("lent", lent_rows(), None)):
        where = where or hardware.load("h100-sxm")
        for r in rows:
            p = predict(shapes.shape(r.shape), where, r.layout, r.training)
            out[key].append(
                {
                    "table": r.table,
                    "row": r.label,
                    "model": r.shape,
                    "gpus": r.layout.gpus,
                    "setup": _setup(r.training),
                    "tps": r.tps,
                    "predicted_tps": p["tps_per_gpu"],
                    "tps_error": p["tps_per_gpu"] / r.tps - 1,
                    "memory_gib": r.memory_gib,
                    "predicted_gib": p["memory_gib"],
                    "memory_error": p["memory_gib"] / r.memory_gib - 1,
                    "terms": p["terms"],
                    "step_s": p["step_s"],
                }
            )
    errors = [abs(r["tps_error"]) for r in out["rows"]]
    mem = [abs(r["memory_error"]) for r in out["rows"]]
    out["summary"] = {
        "median_tps_error": statistics.median(errors),
        "worst_tps_error": max(errors),
        "worst_memory_error": max(mem),
        "rows_within_20": sum(e <= 0.2 and m <= 0.2 for e, m in zip(errors, mem, strict=True)),
        "rows": len(errors),
    }
    return out


def _setup(t: Training) -> str:
    parts = [f"batch {t.local_batch} x {t.seq_len}", f"AC {t.ac}"]
    parts.append("compile" if t.compile else "eager")
    if t.float8:
        parts.append("float8")
    if t.lora:
        parts.append("LoRA")
    return ", ".join(parts)


def table(found: dict, terms: bool = False) -> str:
    """The validation as Markdown: each row's published and predicted TPS/GPU and memory."""
    lines = [
        f"Published: {found['source']}; predicted: `paratrain plan`, hardware profile "
        f"`{found['hardware']}`, one parameter set for every row.",
        "",
        "| table | model, GPUs | layout, set-up | TPS/GPU | predicted | error | memory GiB "
        "| predicted | error |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in found["rows"] + found["lent"]:
        lines.append(
            f"| {r['table']} | {r['model']}, {r['gpus']} | {r['row']}; {r['setup']} | "
            f"{r['tps']:,.0f} | {r['predicted_tps']:,.0f} | {r['tps_error']:+.1%} | "
            f"{r['memory_gib']:.1f} | {r['predicted_gib']:.1f} | {r['memory_error']:+.1%} |"
        )
    s = found["summary"]
    lines += [
        "",
        f"Tables 1, 3, 4, 5: median TPS/GPU error {s['median_tps_error']:.1%}, worst "
        f"{s['worst_tps_error']:.1%}; worst memory error {s['worst_memory_error']:.1%}; "
        f"{s['rows_within_20']} of {s['rows']} rows within 20% on both. The H100 rows: one lent "
        "H100 SXM 80 GB at 700 W (profile h100-sxm), torchtitan 0.2.2 and paratrain as "
        "shipped, measured in benchmarks/results/2026-12-06-h100x1/issue53/.",
    ]
    if terms:
        lines += ["", "Seconds a step by term:", ""]
        keys = [k for k in found["rows"][0]["terms"]]
        lines.append("| row | step | " + " | ".join(k.removesuffix("_s") for k in keys) + " |")
        lines.append("|---|---:|" + "---:|" * len(keys))
        for r in found["rows"] + found["lent"]:
            cells = " | ".join(f"{r['terms'][k]:.3f}" for k in keys)
            lines.append(f"| {r['table']}: {r['row']} | {r['step_s']:.3f} | {cells} |")
    return "\n".join(lines)
