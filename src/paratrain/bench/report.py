"""From stored runs to the seed's tables, ours beside the seed's, with the arithmetic stated."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import yaml

from paratrain.bench import arith
from paratrain.bench.arith import Stat
from paratrain.bench.render import Table
from paratrain.bench.store import Row, error_line

EPOCH = 60_000  # MNIST's training set: times are reported for one such epoch, from throughput

ARITHMETIC = [
    "Throughput counts unique samples (ddp-full's repeated samples are not counted) over the "
    "measured steps, warm-up steps excluded; evaluation and checkpointing are not timed.",
    "Speedup(N) = unique throughput on N processes / on 1, at equal precision and per-GPU batch; "
    "efficiency = speedup / N. With repeats: median [min-max]. ⚠ marks a speedup above the "
    "ideal N (suspect until explained) or repeats that spread more than 20%.",
    f"'Epoch s' is derived: {EPOCH:,} images / measured throughput (the seed's times are whole runs "
    "of unstated length, so compare ratios, not seconds).",
]


def seed_tables() -> dict[str, Any]:
    text = resources.files("paratrain.bench").joinpath("seed_tables.yaml").read_text()
    return yaml.safe_load(text)


@dataclass
class Group:
    label: str
    program: str
    params: dict[str, Any]
    config: dict[str, Any]
    thr: Stat | None
    step: Stat | None
    acc: Stat | None
    mem: Stat | None
    failed: list[str]
    redundant: bool
    metrics_list: list[dict[str, Any]]
    """Each successful run's summary (for metrics beyond the columns above)."""
    curves: list[list[list[float]]] = field(default_factory=list)
    """Each successful run's loss curve, [[step, loss], ...] (execute.loss_curve)."""

    @property
    def nproc(self) -> int:
        return int(self.params.get("launch.nproc") or self.config["launch"]["nproc"] or 1)

    def get(self, key: str) -> Any:
        """A config value by dotted key ('strategy', 'data.pin_memory')."""
        node: Any = self.config
        for part in key.split("."):
            node = node[part]
        return node


def _buckets(rows: list[Row]) -> list[list[Row]]:
    """The runs of one configuration (label, program, grid point) together: its repeats, in the
    order first met."""
    buckets: dict[str, list[Row]] = {}
    for r in rows:
        buckets.setdefault(
            json.dumps([r.label, r.program, r.params], sort_keys=True, default=str), []
        ).append(r)
    return list(buckets.values())


def _failed(members: list[Row]) -> list[str]:
    """Each failed run in one line: its status and its error's headline (a failed run's
    cause), cut to 120 characters (the report's notes name it; the run's folder has the rest)."""
    return [f"{r.status}: {error_line(r.error or '')[:120]}" for r in members if r.status != "ok"]


def _curves(ok: list[Row]) -> list[list[list[float]]]:
    """The loss curves of the runs whose result kept one."""
    return [(r.result or {})["curve"] for r in ok if (r.result or {}).get("curve")]


def _group(members: list[Row]) -> Group:
    ok = [r for r in members if r.status == "ok"]
    first = members[0]
    return Group(
        label=first.label,
        program=first.program,
        params=first.params,
        config=first.config,
        thr=arith.stat([r.unique_samples_per_s for r in ok]),
        step=arith.stat([r.step_time_s for r in ok]),
        acc=arith.stat([r.val_accuracy for r in ok]),
        mem=arith.stat([r.peak_memory_bytes for r in ok]),
        failed=_failed(members),
        redundant=any((r.result or {}).get("redundant_data") for r in ok),
        metrics_list=[r.metrics or {} for r in ok],
        curves=_curves(ok),
    )


def group_rows(rows: list[Row]) -> list[Group]:
    return [_group(members) for members in _buckets(rows)]


def _fmt(x: float | None, spec: str = ",.0f", suffix: str = "") -> str:
    return "n/a" if x is None else f"{x:{spec}}{suffix}"


def _gib(s: Stat | None) -> str:
    return s.fmt(1, 1 / 2**30) if s else "n/a"


def _acc(s: Stat | None) -> str:
    return s.fmt(1, 100) + "%" if s else "n/a"


def measured(groups: list[Group], label: str | None, nproc: int) -> Group | None:
    """The measured group of a label at a process count: the 1-process base, or the reference."""
    return next((h for h in groups if h.label == label and h.nproc == nproc and h.thr), None)


def failures(groups: list[Group]) -> list[str]:
    return [f"{g.label} {g.params}: {msg}" for g in groups for msg in g.failed]


# ------------------------------------------------------------------------------ the seed's layouts


def _strategy_at(groups: list[Group], strategy: str, nproc: int) -> Group | None:
    """The measured group of a data-parallel mode at a process count."""
    return next(
        (g for g in groups if g.get("strategy") == strategy and g.nproc == nproc and g.thr), None
    )


def _dp_row(
    strategy: str,
    one: Group | None,
    many: Group | None,
    sp: float | None,
    n_max: int,
    seed: dict[str, Any],
) -> list[str]:
    """One mode on 1 and on n_max processes, then the seed's numbers for it."""
    s = seed["rows"].get(strategy, {})
    name = strategy + (" (redundant data)" if strategy == "ddp-full" else "")
    return [
        name,
        one.thr.fmt() if one else "n/a",
        many.thr.fmt() if many else "n/a",
        _fmt(sp, ".2f", "x"),
        _fmt(arith.efficiency(sp, n_max) * 100 if sp else None, ".0f", "%")
        + arith.suspect(sp, n_max, one.thr if one else None, many.thr if many else None),
        _fmt(arith.time_for(EPOCH, one.thr.median) if one else None),
        _fmt(arith.time_for(EPOCH, many.thr.median) if many else None),
        _fmt(s.get("time_1")),
        _fmt(s.get("time_n")),
        _fmt(s.get("speedup"), ".2f", "x"),
        _fmt(s["speedup"] / seed["gpus"] * 100 if s else None, ".0f", "%"),
    ]


def dp_modes_table(groups: list[Group], seed: dict[str, Any]) -> tuple[Table, dict[str, float]]:
    n_max = max((g.nproc for g in groups), default=1)
    headers = [
        "strategy",
        "img/s 1 proc",
        f"img/s {n_max} procs",
        "speedup",
        "efficiency",
        "epoch s 1",
        f"epoch s {n_max}",
        "seed s 1 GPU",
        f"seed s {seed['gpus']} GPUs",
        "seed speedup",
        "seed efficiency",
    ]
    rows, speedups = [], {}
    for strategy in ("ddp-full", "ddp-rr", "ddp-ds"):
        one, many = _strategy_at(groups, strategy, 1), _strategy_at(groups, strategy, n_max)
        sp = arith.speedup(many.thr.median, one.thr.median) if one and many else None
        if sp is not None:
            speedups[strategy] = sp
        rows.append(_dp_row(strategy, one, many, sp, n_max, seed))
    notes = [f"Ours on {n_max} processes, the seed's on {seed['gpus']} GPUs: compare efficiencies."]
    return Table("Data-parallel modes (seed table 2.2)", headers, rows, notes), speedups


def _precision_row(
    p: str, g: Group | None, base: Group | None, s: dict[str, Any] | None, seed_fp32: float
) -> list[str]:
    """One precision, ours (time relative to fp32's) beside the seed's."""
    rel = base.thr.median / g.thr.median if (g and g.thr and base and base.thr) else None
    return [
        p,
        g.thr.fmt() if g and g.thr else "n/a",
        _fmt(arith.time_for(EPOCH, g.thr.median) if g and g.thr else None),
        _fmt(rel, ".2f", "x"),
        _acc(g.acc) if g else "n/a",
        _gib(g.mem) if g else "n/a",
        energy_per(g),
        _fmt(s["time"] if s else None),
        _fmt(s["time"] / seed_fp32 if s else None, ".2f", "x"),
        _fmt(s["accuracy"] * 100 if s else None, ".2f", "%"),
        _fmt(s["memory_gb"] if s else None),
    ]


def precision_table(groups: list[Group], seed: dict[str, Any]) -> tuple[Table, dict[str, Group]]:
    n_max = max((g.nproc for g in groups), default=1)
    by = {g.get("precision"): g for g in groups if g.nproc == n_max}
    base = by.get("fp32")
    headers = [
        "precision",
        f"img/s ({n_max} procs)",
        "epoch s",
        "time vs fp32",
        "held-out acc",
        "peak GiB/GPU",
        "J/sample",
        "seed s",
        "seed time vs fp32",
        "seed acc",
        "seed GB",
    ]
    rows = []
    seed_fp32 = seed["rows"]["fp32"]["time"]
    for p in ("fp64", "fp32", "tf32", "fp16", "bf16"):
        g, s = by.get(p), seed["rows"].get(p)
        if g is None and s is None:
            continue
        rows.append(_precision_row(p, g, base, s, seed_fp32))
    return Table("Precision (seed table 3.1)", headers, rows, [ENERGY_NOTE]), by


def pin_memory_table(groups: list[Group], seed: dict[str, Any]) -> tuple[Table, float | None]:
    by = {bool(g.get("data.pin_memory")): g for g in groups}
    off, on = by.get(False), by.get(True)
    sp = arith.speedup(on.thr.median, off.thr.median) if off and on and off.thr and on.thr else None
    rows = []
    for flag, g in ((False, off), (True, on)):
        s = seed["rows"]["true" if flag else "false"]
        rows.append(
            [
                f"pin_memory={str(flag).lower()}",
                g.thr.fmt() if g and g.thr else "n/a",
                _fmt(arith.time_for(EPOCH, g.thr.median) if g and g.thr else None),
                _fmt(sp if flag else 1.0, ".2f", "x") if sp else "n/a",
                _fmt(s["time"]),
                _fmt(s["speedup"], ".2f", "x"),
            ]
        )
    headers = ["configuration", "img/s", "epoch s", "speedup", "seed s", "seed speedup"]
    return Table("pin_memory (seed table 4.1)", headers, rows), sp


def unmeasured_row(lead: list[str], g: Group, width: int) -> list[str]:
    """A row for a configuration with no successful run: 'failed' (or n/a), padded to the table."""
    return lead + ["failed" if g.failed else "n/a"] + ["n/a"] * (width - len(lead) - 1)


def slowest_clock(g: Group) -> str:
    """Median over runs of the slowest rank's mean SM clock (result.json's gpu_telemetry)."""
    clocks = [
        min(t["sm_clock_mhz_mean"] for t in m["gpu_telemetry"] if t)
        for m in g.metrics_list
        if m.get("gpu_telemetry") and any(m["gpu_telemetry"])
    ]
    return _fmt(arith.stat(clocks).median) if clocks else "n/a"


def energy_per(g: Group | None, key: str = "joules_per_sample", scale: float = 1.0) -> str:
    """Median over runs of the measured window's energy per sample (or per token, scaled): every
    GPU of the run summed, NVML's total-energy counter (result.json's summary.energy)."""
    vals = [
        m["energy"][key] * scale
        for m in (g.metrics_list if g else [])
        if m.get("energy") and m["energy"].get(key) is not None
    ]
    return _fmt(arith.stat(vals).median, ".3g") if vals else "n/a"


ENERGY_NOTE = (
    "J/sample (mJ/token): the energy of the measured steps, every GPU of the run summed (NVML's "
    "total-energy counter; mean power x time where a GPU lacks it), over the samples (tokens) "
    "they trained; samples per kWh = 3.6e6 / J per sample. n/a on CPU (no counter)."
)


CLOCK_NOTE = (
    "SM MHz: the slowest GPU's mean SM clock over the measured steps (NVML); GPUs that share a "
    "power limit can clock lower when more of them run."
)


SOL_NOTE = (
    "% of speed of light: per GPU, against the fastest speed-of-light row of the same model and "
    "precision, or of the model when none has that precision. Over 100%: the row has a lever "
    "that speed-of-light row lacks (CUDA graphs, say)."
)


def speed_of_light(groups: list[Group]) -> Callable[[Group], float | None]:
    """A group's ceiling: the per-GPU speed-of-light throughput of its model at its precision (a
    fp16 configuration against the fp16 ceiling, not the bf16 one), else its model's fastest."""
    same: dict[tuple[Any, Any], float] = {}
    fastest: dict[Any, float] = {}
    for g in groups:
        if g.program == "sol" and g.thr:
            model, thr = g.get("model.name"), g.thr.median / g.nproc
            key = (model, g.get("precision"))
            same[key] = max(thr, same.get(key, 0.0))  # several ways of one step: the fastest
            fastest[model] = max(thr, fastest.get(model, 0.0))
    return lambda g: (
        same.get((g.get("model.name"), g.get("precision"))) or fastest.get(g.get("model.name"))
    )


def variants_table(groups: list[Group], reference: str | None) -> Table:
    ceiling = speed_of_light(groups)
    headers = [
        "configuration",
        "program",
        "procs",
        "img/s",
        "img/s per GPU",
        "scaling eff.",
        f"vs {reference}" if reference else "vs reference",
        "% of speed of light",
        "step ms",
        "peak GiB/GPU",
        "J/sample",
        "SM MHz",
    ]
    rows = []
    for g in sorted(groups, key=lambda g: (g.label, g.nproc)):
        if g.thr is None:
            rows.append(unmeasured_row([g.label, g.program, str(g.nproc)], g, len(headers)))
            continue
        one, ref = measured(groups, g.label, 1), measured(groups, reference, g.nproc)
        eff = (
            arith.efficiency(arith.speedup(g.thr.median, one.thr.median), g.nproc) if one else None
        )
        light = ceiling(g)
        per_gpu = g.thr.median / g.nproc
        rows.append(
            [
                g.label,
                g.program,
                str(g.nproc),
                g.thr.fmt(),
                _fmt(per_gpu),
                _fmt(eff * 100 if eff else None, ".1f", "%")
                + arith.suspect(eff * g.nproc if eff else None, g.nproc, g.thr),
                _fmt(g.thr.median / ref.thr.median if ref else None, ".2f", "x"),
                _fmt(per_gpu / light * 100 if light else None, ".0f", "%"),
                g.step.fmt(1, 1000) if g.step else "n/a",
                _gib(g.mem),
                energy_per(g),
                slowest_clock(g),
            ]
        )
    notes = [SOL_NOTE, ENERGY_NOTE, CLOCK_NOTE]
    return Table("Configurations and peers", headers, rows, notes)


def llm_table(groups: list[Group], seed: dict[str, Any], reference: str | None) -> Table:
    """Seed table 5.2's layout (s/it on 1 and N GPUs per data set) plus what it leaves out:
    tokens per iteration, tokens/s, MFU and memory."""

    def metric(g: Group, key: str) -> float | None:
        vals = [r for r in g.metrics_list if r.get(key) is not None]
        return arith.stat([r[key] for r in vals]).median if vals else None

    headers = [
        "configuration",
        "procs",
        "s/it",
        "tokens/it",
        "tokens/s",
        "tokens/s per GPU",
        "scaling eff.",
        f"vs {reference}" if reference else "vs reference",
        "MFU",
        "peak GiB/GPU",
        "mJ/token",
        "seed s/it (1 / 4 GPUs)",
        "SM MHz",
    ]
    rows = []
    for g in sorted(groups, key=lambda g: (g.label, g.nproc)):
        if g.thr is None:
            rows.append(unmeasured_row([g.label, str(g.nproc)], g, len(headers)))
            continue
        tps = metric(g, "tokens_per_s")
        one, ref = measured(groups, g.label, 1), measured(groups, reference, g.nproc)
        tps1 = metric(one, "tokens_per_s") if one else None
        ref_tps = metric(ref, "tokens_per_s") if ref else None
        eff = tps / tps1 / g.nproc if tps and tps1 else None
        mfu = metric(g, "mfu")
        s = seed["rows"].get(g.label.lower())
        rows.append(
            [
                g.label,
                str(g.nproc),
                g.step.fmt(3) if g.step else "n/a",
                _fmt(metric(g, "tokens_per_step")),
                _fmt(tps),
                _fmt(tps / g.nproc if tps else None),
                _fmt(eff * 100 if eff else None, ".1f", "%"),
                _fmt(tps / ref_tps if tps and ref_tps else None, ".2f", "x"),
                _fmt(mfu * 100 if mfu else None, ".1f", "%"),
                _gib(g.mem),
                energy_per(g, "joules_per_token", 1000.0),
                f"{s['it_1']} / {s['it_n']}" if s else "n/a",
                slowest_clock(g),
            ]
        )
    notes = [
        "tokens count non-padding tokens; scaling efficiency and ratios use tokens/s. MFU: "
        "model FLOPs per token (6N full training, 4N + attention + 6 x adapters for LoRA; "
        "src/paratrain/models/causal_lm/spec.py) x tokens/s per GPU / the GPU's dense bf16 peak.",
        ENERGY_NOTE,
        CLOCK_NOTE,
    ]
    # a sweep of full training (beside torchtitan) is not the seed's LoRA table
    lora = any((g.config.get("lora") or {}).get("enabled") for g in groups)
    title = (
        "Language-model fine-tuning (seed table 5.2)" if lora else "Language-model full training"
    )
    return Table(title, headers, rows, notes)


def by_label(groups: list[Group]) -> dict[str, list[Group]]:
    """Groups that differ only by seed (a grid axis) under one label, in the sweep's order."""
    out: dict[str, list[Group]] = {}
    for g in groups:
        out.setdefault(g.label, []).append(g)
    return out


def sync_point(members: list[Group]) -> dict[str, Any]:
    """One configuration over its seeds: held-out accuracy and loss (median, min, max), the
    bytes each rank handed to the collectives per step, step time."""

    def values(key: str) -> list[float]:
        return [m[key] for g in members for m in g.metrics_list if m.get(key) is not None]

    comm = [
        m["communication"]["bytes_per_step"]
        for g in members
        for m in g.metrics_list
        if m.get("communication")
    ]
    return {
        "acc": arith.stat(values("val_accuracy")),
        "loss": arith.stat(values("val_loss")),
        "bytes": arith.stat(comm),
        "step": arith.stat(values("step_time_s")),
        "seeds": sum(len(g.metrics_list) for g in members),
        "failed": [f for g in members for f in g.failed],
    }


SYNC_NOTE = (
    "Held-out accuracy: median over the seeds, [lowest - highest]. Bytes per step: what each rank "
    "handed to the gradient / parameter collectives over the run, per optimizer step (counted "
    "from the tensors sent: gradients under every-step DDP in the hook's dtype, parameters when "
    "local SGD averages, fp32 pseudo-gradients for DiLoCo; n/a for PowerSGD, whose factors are not "
    "counted). The same optimizer steps in every row."
)


def sync_table(groups: list[Group], reference: str | None) -> Table:
    headers = [
        "configuration",
        "seeds",
        "held-out acc",
        "held-out loss",
        "bytes/step per rank",
        "vs reference bytes",
        "step ms",
    ]
    points = {label: sync_point(members) for label, members in by_label(groups).items()}
    ref = points.get(reference) if reference else next(iter(points.values()), None)
    rows = []
    for label, p in points.items():
        if not p["seeds"]:
            rows.append([label, "0", "failed" if p["failed"] else "n/a", *["n/a"] * 4])
            continue
        acc = p["acc"]
        rel = (
            p["bytes"].median / ref["bytes"].median
            if p["bytes"] and ref and ref["bytes"] and ref["bytes"].median
            else None
        )
        rows.append(
            [
                label,
                str(p["seeds"]),
                (
                    f"{acc.median * 100:.2f}% [{acc.low * 100:.2f} - {acc.high * 100:.2f}]"
                    if acc.n > 1
                    else f"{acc.median * 100:.2f}%"
                )
                if acc
                else "n/a",
                p["loss"].fmt(4) if p["loss"] else "n/a",
                _fmt(p["bytes"].median if p["bytes"] else None, ",.0f"),
                _fmt(rel, ".3f", "x"),
                p["step"].fmt(1, 1000) if p["step"] else "n/a",
            ]
        )
    for col in (3, 2):  # image runs keep no held-out loss, language models no accuracy
        if all(r[col] == "n/a" for r in rows):
            headers = headers[:col] + headers[col + 1 :]
            rows = [r[:col] + r[col + 1 :] for r in rows]
    return Table("How often the replicas agree (seed 001 §5.3)", headers, rows, [SYNC_NOTE])


def plain_table(groups: list[Group]) -> Table:
    headers = ["configuration", "img/s", "step ms", "held-out acc", "peak GiB", "J/sample"]
    rows = [
        [
            f"{g.label} {' '.join(f'{k}={v}' for k, v in g.params.items())}".strip(),
            g.thr.fmt(1) if g.thr else "failed",
            g.step.fmt(1, 1000) if g.step else "n/a",
            _acc(g.acc),
            _gib(g.mem),
            energy_per(g),
        ]
        for g in groups
    ]
    return Table("Runs", headers, rows, [ENERGY_NOTE])


# ------------------------------------------------------------------------------ claims


def dp_claims(speedups: dict[str, float], n: int, seed: dict[str, Any]) -> list[str]:
    out = []
    ds = speedups.get("ddp-ds")
    if ds is not None:
        verdict = (
            "contradicts it: ours stays at or below the ideal"
            if ds <= n * 1.02
            else "also exceeds the ideal here"
        )
        out.append(
            f"Seed: DDP-DS speeds up {seed['rows']['ddp-ds']['speedup']}x on {seed['gpus']} GPUs, above the "
            f"ideal {seed['gpus']}x (superlinear). Ours: {ds:.2f}x on {n} processes "
            f"({ds / n:.0%} efficiency), which {verdict}."
        )
    full = speedups.get("ddp-full")
    if full is not None:
        out.append(
            f"Seed: 'DDP' (every GPU iterates the full data) {seed['rows']['ddp-full']['speedup']}x. "
            f"Ours ddp-full: {full:.2f}x in unique samples, as redundant work must give (about 1x); "
            "the seed's 3.23x cannot be a unique-sample speedup."
        )
    rr = speedups.get("ddp-rr")
    if rr is not None and ds is not None:
        out.append(
            f"Seed: DDP-RR {seed['rows']['ddp-rr']['speedup']}x vs DDP-DS {seed['rows']['ddp-ds']['speedup']}x. "
            f"Ours: ddp-rr {rr:.2f}x vs ddp-ds {ds:.2f}x: both shard the data, "
            + (
                "and they scale alike."
                if abs(rr - ds) / ds < 0.05
                else f"and they differ by {abs(rr - ds) / ds:.0%}."
            )
        )
    return out


def precision_claims(by: dict[str, Group], seed_all: dict[str, Any]) -> list[str]:
    t22, t31 = (
        seed_all["dp_modes"]["rows"]["ddp-ds"]["time_n"],
        seed_all["precision"]["rows"]["fp16"]["time"],
    )
    out = [
        f"Seed: its DDP-DS 4-GPU time ({t22} s, table 2.2, precision unstated) equals its FP16 4-GPU time "
        f"({t31} s, table 3.1), and its FP64 time (1937 s) equals its 'DDP' 4-GPU time: the tables look "
        "copied from one another rather than measured separately."
    ]
    fp32, fp16 = by.get("fp32"), by.get("fp16")
    if fp32 and fp16 and fp32.thr and fp16.thr:
        out.append(
            f"Ours: fp16 runs {fp16.thr.median / fp32.thr.median:.2f}x the fp32 throughput "
            f"(seed: {seed_all['precision']['rows']['fp32']['time'] / t31:.2f}x)."
        )
    return out


def _sweep_table(
    kind: str, spec: dict[str, Any], groups: list[Group], seed: dict[str, Any]
) -> tuple[Table, list[str]]:
    """One sweep's table in its layout, and the seed's claims that its runs check."""
    if kind == "dp_modes":
        table, speedups = dp_modes_table(groups, seed["dp_modes"])
        n_max = max((g.nproc for g in groups), default=1)
        return table, dp_claims(speedups, n_max, seed["dp_modes"])
    if kind == "precision":
        table, by = precision_table(groups, seed["precision"])
        return table, precision_claims(by, seed)
    if kind == "pin_memory":
        table, sp = pin_memory_table(groups, seed["pin_memory"])
        return table, pin_memory_claims(sp, seed)
    if kind == "llm":
        return llm_table(groups, seed["llm"], spec.get("reference")), []
    if kind == "variants":
        return variants_table(groups, spec.get("reference")), []
    if kind == "sync":
        return sync_table(groups, spec.get("reference")), []
    return plain_table(groups), []


def pin_memory_claims(sp: float | None, seed_all: dict[str, Any]) -> list[str]:
    if sp is None:
        return []
    return [
        f"Seed: pin_memory gives {seed_all['pin_memory']['rows']['true']['speedup']}x (FP32, 4 GPUs). "
        f"Ours: {sp:.2f}x."
    ]


def _annotate(
    table: Table, name: str, spec: dict[str, Any], rows: list[Row], groups: list[Group]
) -> None:
    """The sweep's name in the title; how many runs and steps, the sweep's own notes and what
    was not measured under the table, so that no number stands without them."""
    table.title = f"{table.title} — sweep `{name}`"
    steps = {r.metrics.get("measured_steps") for r in rows if r.metrics}
    table.notes.append(
        f"{len(rows)} runs; measured steps per run: {sorted(s for s in steps if s is not None)}."
    )
    if spec.get("notes"):
        table.notes.append(str(spec["notes"]).strip())
    table.notes += [f"Not measured — {f}" for f in failures(groups)]


def _hardware(hw: dict[str, Any]) -> str:
    """The machine of the first successful run, in one line."""
    gpus = hw.get("gpu_count_visible", 0)
    return (
        (
            f"Hardware: {gpus}x {hw.get('gpu_name')}, {hw.get('cpu_count')} CPUs, "
            f"torch {hw.get('torch')}, CUDA {hw.get('cuda')}, driver {hw.get('driver')}, "
            f"NCCL {hw.get('nccl')}."
        )
        if gpus
        else f"Hardware: CPU only, {hw.get('cpu_count')} CPUs, torch {hw.get('torch')}; "
        "every run's processes computed with the same threads each (launch.cpu_threads)."
    )


def build_report(
    rows_by_sweep: dict[str, tuple[str, dict[str, Any], list[Row]]],
) -> tuple[list[Table], list[str]]:
    seed = seed_tables()
    tables, claims, hw = [], [], None
    for name, (kind, spec, rows) in rows_by_sweep.items():
        groups = group_rows(rows)
        hw = hw or next((r.hardware for r in rows if r.status == "ok" and r.hardware), None)
        table, checked = _sweep_table(kind, spec, groups, seed)
        claims += checked
        _annotate(table, name, spec, rows, groups)
        tables.append(table)
    preamble = ["# paratrain benchmark report", ""]
    if hw:
        preamble.append(_hardware(hw))
    preamble += ["", "How the numbers are computed:", *[f"- {a}" for a in ARITHMETIC]]
    if claims:
        tables.append(
            Table(
                "The seed's claims against our runs",
                ["claim and verdict"],
                [[c] for c in claims],
                [f"Seed numbers from {seed['source']} (src/paratrain/bench/seed_tables.yaml)."],
            )
        )
    return tables, preamble
